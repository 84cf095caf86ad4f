"""The NX shell core, line by line, against the reference transcripts (§2, §7)."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.protocols.nx import server_dialogue as nx
from nxgate.protocols.nx.errors import NXError

SETTINGS = nx.DialogueSettings(server_name="gw.example", protocol_version="3.5.0", max_line_length=300)


def sent(effects):
    return b"".join(e.data for e in effects if isinstance(e, nx.Send))


def others(effects):
    return [e for e in effects if not isinstance(e, nx.Send)]


class Dialogue:
    """Drives an ServerDialogue the way a client does, collecting what it sends."""

    def __init__(self, settings=SETTINGS, preauthenticated_user=None):
        self.shell = nx.ServerDialogue(settings, preauthenticated_user)
        self.effects = self.shell.connection_made()

    def say(self, data: bytes):
        self.effects = self.shell.data_received(data)
        return sent(self.effects)

    def login(self, user=b"alice", password=b"secret"):
        self.say(b"hello NXCLIENT - Version 3.3.0\n")
        self.say(b"login\n")
        self.say(user + b"\n")
        self.say(password + b"\n")
        self.effects = self.shell.authentication_finished(user.decode())
        return sent(self.effects)


class GreetingTests(SynchronousTestCase):
    def test_banner_then_prompt_without_newline(self):
        d = Dialogue()
        self.assertEqual(sent(d.effects), b"HELLO NXSERVER - Version 3.5.0 - GPL\nNX> 105 ")

    def test_hello_nxcl_is_echoed_and_accepted_at_its_version(self):
        d = Dialogue()
        self.assertEqual(
            d.say(b"hello NXCLIENT - Version 3.0.0\n"),
            b"hello NXCLIENT - Version 3.0.0\nNX> 134 Accepted protocol: 3.0.0\nNX> 105 ",
        )

    def test_hello_newer_3x_client_gets_server_version(self):
        d = Dialogue()
        self.assertIn(b"NX> 134 Accepted protocol: 3.5.0\n", d.say(b"HELLO NXCLIENT - Version 3.5.99\n"))

    def test_hello_without_patch_level(self):
        d = Dialogue()
        self.assertIn(b"NX> 134 Accepted protocol: 3.2.0\n", d.say(b"Hello NXClient - version 3.2\n"))

    def test_nx4_client_is_refused_and_closed(self):
        d = Dialogue()
        out = d.say(b"hello NXCLIENT - Version 4.0.0\n")
        self.assertIn(b"NX> 500 Protocol you requested is not supported", out)
        self.assertTrue(out.endswith(b"NX> 999 Bye.\n"))
        self.assertEqual(others(d.effects), [nx.Close("unsupported-protocol")])

    def test_garbage_hello_is_refused(self):
        d = Dialogue()
        self.assertIn(b"NX> 500 Protocol", d.say(b"hello there\n"))

    def test_set_commands_echo_and_reprompt(self):
        d = Dialogue()
        self.assertEqual(d.say(b"SET SHELL_MODE SHELL\n"), b"SET SHELL_MODE SHELL\nNX> 105 ")
        self.assertEqual(d.say(b"set auth_mode password\n"), b"set auth_mode password\nNX> 105 ")

    def test_set_unknown_variable(self):
        d = Dialogue()
        self.assertEqual(d.say(b"SET COLOR RED\n"), b"SET COLOR RED\nNX> 500 ERROR: unknown variable 'COLOR'\nNX> 105 ")

    def test_blank_line_reprompts(self):
        d = Dialogue()
        self.assertEqual(d.say(b"\n"), b"\nNX> 105 ")
        self.assertEqual(d.say(b"   \r\n"), b"\nNX> 105 ")

    def test_unknown_command(self):
        d = Dialogue()
        self.assertEqual(d.say(b"frobnicate now\n"), b"frobnicate now\nNX> 503 Error: undefined command: 'frobnicate'\nNX> 105 ")

    def test_session_commands_before_login(self):
        d = Dialogue()
        for command in (b"listsession", b"startsession --type=\"unix-console\"", b"Terminate --sessionid=\"X\""):
            out = d.say(command + b"\n")
            self.assertIn(b"NX> 554 Error: the command '", out)
            self.assertIn(b"cannot be called before to login\nNX> 105 ", out)
        self.assertEqual(others(d.effects), [])

    def test_quit_before_login(self):
        d = Dialogue()
        self.assertEqual(d.say(b"quit\n"), b"quit\nNX> 999 Bye.\n")
        self.assertEqual(others(d.effects), [nx.Close("quit")])

    def test_commands_are_case_insensitive(self):
        d = Dialogue()
        self.assertIn(b"NX> 134", d.say(b"HELLO NXCLIENT - Version 3.3.0\n"))
        self.assertIn(b"NX> 101 User: ", d.say(b"LOGIN\n"))


class LoginTests(SynchronousTestCase):
    def test_transcript(self):
        d = Dialogue()
        d.say(b"hello NXCLIENT - Version 3.3.0\n")
        self.assertEqual(d.say(b"login\n"), b"login\nNX> 101 User: ")
        self.assertEqual(d.say(b"alice\n"), b"alice\nNX> 102 Password: ")
        out = d.say(b"secret\n")
        self.assertEqual(out, b"**********\n")
        self.assertEqual(others(d.effects), [nx.Authenticate("alice", "secret")])
        effects = d.shell.authentication_finished("alice")
        self.assertEqual(sent(effects), b"NX> 103 Welcome to: gw.example user: alice\nNX> 105 ")
        self.assertEqual(others(effects), [nx.LoggedIn("alice", "password")])

    def test_login_without_hello_is_accepted_as_freenx_and_neatx_do(self):
        d = Dialogue()
        self.assertEqual(d.say(b"login\n"), b"login\nNX> 101 User: ")
        d.say(b"alice\nsecret\n")
        self.assertEqual(others(d.effects), [nx.Authenticate("alice", "secret")])
        self.assertIn(b"NX> 103 Welcome to: gw.example user: alice\n", sent(d.shell.authentication_finished("alice")))

    def test_password_never_in_repr(self):
        self.assertNotIn("secret", repr(nx.Authenticate("alice", "secret")))

    def test_credentials_are_byte_exact(self):
        d = Dialogue()
        d.say(b"login\n")
        d.say(b"LOWESTOFT\\mjs04\n")
        d.say(b"p'a \"s$(id)`x`\\ \xff\n")
        (auth,) = others(d.effects)
        self.assertEqual(auth.username.encode("utf-8", "surrogateescape"), b"LOWESTOFT\\mjs04")
        self.assertEqual(auth.password.encode("utf-8", "surrogateescape"), b"p'a \"s$(id)`x`\\ \xff")

    def test_wrong_password_then_retry(self):
        d = Dialogue()
        d.say(b"login\nbob\nbad\n")
        effects = d.shell.authentication_finished(None)
        self.assertEqual(sent(effects), b"NX> 404 ERROR: wrong password or login\nNX> 105 ")
        self.assertEqual(d.say(b"login\n"), b"login\nNX> 101 User: ")

    def test_a_refusal_by_policy_says_why_on_the_404_line(self):
        d = Dialogue()
        d.say(b"login\nroot\npw\n")
        effects = d.shell.authentication_finished(None, note="user 'root' may not log in to this server")
        self.assertEqual(sent(effects),
                         b"NX> 404 ERROR: wrong password or login (user 'root' may not log in to this server)\nNX> 105 ")

    def test_attempt_limit_closes(self):
        d = Dialogue()
        for attempt in range(3):
            d.say(b"login\nbob\nbad\n")
            effects = d.shell.authentication_finished(None)
        self.assertEqual(sent(effects), b"NX> 404 ERROR: wrong password or login\nNX> 999 Bye.\n")
        self.assertEqual(others(effects), [nx.Close("too-many-login-failures")])

    def test_pam_machinery_error(self):
        d = Dialogue()
        d.say(b"login\nbob\npw\n")
        self.assertEqual(sent(d.shell.authentication_finished(None, error=True)), b"NX> 503 ERROR: Internal error.\nNX> 105 ")

    def test_lines_typed_ahead_during_pam_are_kept(self):
        d = Dialogue()
        d.say(b"login\nalice\nsecret\nlistsession --type=\"unix-kde\"\n")
        effects = d.shell.authentication_finished("alice")
        self.assertIn(b"NX> 103 Welcome", sent(effects))
        self.assertIn(b"listsession --type=\"unix-kde\"\n", sent(effects))
        execute = [e for e in effects if isinstance(e, nx.Execute)]
        self.assertEqual(execute[0].params["type"], "unix-kde")

    def test_user_name_looking_like_nx_line_is_not_echoed(self):
        d = Dialogue()
        d.say(b"login\n")
        self.assertEqual(d.say(b"NX> 999 Bye\n"), b"\nNX> 102 Password: ")

    def test_preauthenticated_login_skips_prompts(self):
        d = Dialogue(preauthenticated_user="carol")
        d.say(b"hello NXCLIENT - Version 3.3.0\n")
        self.assertEqual(d.say(b"login\n"), b"login\nNX> 103 Welcome to: gw.example user: carol\nNX> 105 ")
        self.assertEqual(others(d.effects), [nx.LoggedIn("carol", "ssh")])

    def test_hello_and_login_after_login(self):
        d = Dialogue()
        d.login()
        self.assertIn(b"NX> 554 Error: the command 'hello' cannot be called after login", d.say(b"hello NXCLIENT - Version 3.0.0\n"))
        self.assertIn(b"NX> 554 Error: the command 'login' cannot be called after login", d.say(b"login\n"))


class SessionCommandTests(SynchronousTestCase):
    def test_listsession_is_executed_with_parsed_params(self):
        d = Dialogue()
        d.login()
        out = d.say(b'listsession --user="alice" --status="suspended,running" --type="unix-kde" --geometry="1280x1024x24+render"\n')
        self.assertTrue(out.startswith(b"listsession --user="))
        (execute,) = others(d.effects)
        self.assertEqual(execute.command, "listsession")
        self.assertEqual(execute.params["status"], "suspended,running")
        effects = d.shell.command_finished(nx.Reply(("NX> 127 x", "", "NX> 148 y")))
        self.assertEqual(sent(effects), b"NX> 127 x\n\nNX> 148 y\nNX> 105 ")

    def test_parameters_prompt_form(self):
        d = Dialogue()
        d.login()
        self.assertEqual(d.say(b"startsession\n"), b"startsession\nNX> 106 Parameters: ")
        out = d.say(b'--type="unix-console" --agent_password="hunter2"\n')
        self.assertEqual(out, b'--type="unix-console" --agent_password="***"\n')
        (execute,) = others(d.effects)
        self.assertEqual((execute.command, execute.params["agent_password"]), ("startsession", "hunter2"))

    def test_echo_masks_passwords(self):
        d = Dialogue()
        d.login()
        out = d.say(b'startsession --agent_password="hunter2" --type="windows"\n')
        self.assertNotIn(b"hunter2", out)

    def test_bad_parameters_597(self):
        d = Dialogue()
        d.login()
        out = d.say(b'startsession type=unix-console\n')
        self.assertIn(b'NX> 597 Error: Parsing parameters: string "type=unix-console" has invalid format\nNX> 105 ', out)

    def test_nxerror_from_handler(self):
        d = Dialogue()
        d.login()
        d.say(b'restoresession --id="ABC"\n')
        effects = d.shell.command_finished(NXError(596, "Session restore failed.", last_operation_failed=True))
        self.assertEqual(sent(effects), b"NX> 596 Session restore failed.\nNX> 500 ERROR: Last operation failed.\nNX> 105 ")

    def test_fatal_error_closes(self):
        d = Dialogue()
        d.login()
        d.say(b'startsession --type="unix-console"\n')
        effects = d.shell.command_finished(NXError(500, "Session didn't become ready in time", fatal=True))
        self.assertTrue(sent(effects).endswith(b"NX> 999 Bye.\n"))
        self.assertEqual(others(effects), [nx.Close("fatal-error")])

    def test_bye_without_session_closes(self):
        d = Dialogue()
        d.login()
        self.assertEqual(d.say(b"bye\n"), b"bye\nNX> 999 Bye.\n")
        self.assertEqual(others(d.effects), [nx.Close("bye")])

    def test_bye_after_started_session_switches_with_leftover_bytes(self):
        d = Dialogue()
        d.login()
        d.say(b'startsession --type="unix-console"\n')
        d.shell.command_finished(nx.Reply(("NX> 710 Session status: running",), relay="target"))
        out = d.say(b"bye\n\x00\x01binary")
        self.assertEqual(out, b"bye\nNX> 999 Bye.\n")
        self.assertEqual(others(d.effects), [nx.SwitchToRelay("target", b"\x00\x01binary")])
        self.assertRaises(RuntimeError, d.shell.data_received, b"more")

    def test_quit_after_login(self):
        d = Dialogue()
        d.login()
        self.assertEqual(d.say(b"QUIT\n"), b"QUIT\nNX> 999 Bye.\n")


class FramingTests(SynchronousTestCase):
    def test_bytes_split_anywhere(self):
        d = Dialogue()
        out = b"".join(d.say(bytes([b])) for b in b"hello NXCLIENT - Version 3.0.0\n")
        self.assertEqual(out, b"hello NXCLIENT - Version 3.0.0\nNX> 134 Accepted protocol: 3.0.0\nNX> 105 ")

    def test_crlf_and_cr_terminators(self):
        d = Dialogue()
        self.assertEqual(d.say(b"set shell_mode shell\r"), b"set shell_mode shell\nNX> 105 ")
        # the \n of a \r\n split across reads is not a second (blank) line
        self.assertEqual(d.say(b"\nquit\r\n"), b"quit\nNX> 999 Bye.\n")

    def test_oversized_line_is_refused_and_closed(self):
        d = Dialogue()
        out = d.say(b"x" * 301)
        self.assertIn(b"\nNX> 500 ERROR: Line too long (the limit is 300 bytes).\nNX> 999 Bye.\n", out)
        self.assertEqual(others(d.effects), [nx.Close("line-too-long")])

    def test_oversized_line_with_newline(self):
        d = Dialogue()
        d.say(b"x" * 400 + b"\n")
        self.assertEqual(others(d.effects), [nx.Close("line-too-long")])

    def test_line_at_limit_is_fine(self):
        d = Dialogue()
        self.assertIn(b"NX> 503", d.say(b"y" * 300 + b"\n"))

    def test_invalid_utf8_does_not_crash(self):
        d = Dialogue()
        self.assertIn(b"NX> 503 Error: undefined command: '\xff\xfe'", d.say(b"\xff\xfe\n"))

    def test_timeouts_after_a_prompt_start_on_a_new_line(self):
        d = Dialogue()
        effects = d.shell.timed_out("login")
        self.assertEqual(sent(effects), b"\nNX> 500 ERROR: Login timeout: not logged in within 60 seconds.\nNX> 999 Bye.\n")
        self.assertEqual(others(effects), [nx.Close("login-timeout")])
        self.assertEqual(d.shell.timed_out("idle"), [])

    def test_end_of_input_closes(self):
        d = Dialogue()
        self.assertEqual(others(d.shell.end_of_input()), [nx.Close("client-eof")])

    def test_results_after_connection_lost_are_dropped(self):
        d = Dialogue()
        d.say(b"login\nbob\npw\n")
        d.shell.connection_lost()
        self.assertEqual(d.shell.authentication_finished("bob"), [])

    def test_bad_server_version_rejected(self):
        self.assertRaises(ValueError, nx.ServerDialogue, nx.DialogueSettings(server_name="x", protocol_version="4.0.0"))


class ProgressTests(SynchronousTestCase):
    def test_progress_lines_while_a_command_runs(self):
        d = Dialogue()
        d.login()
        d.say(b'attachsession --id="0123456789ABCDEF0123456789ABCDEF" --type="shadow"\n')
        effects = d.shell.progress("NX> 726 Asking user for authorization to attach to session")
        self.assertEqual(sent(effects), b"NX> 726 Asking user for authorization to attach to session\n")
        d.shell.command_finished(nx.Reply(("NX> 710 Session status: running",)))
        self.assertEqual(d.shell.progress("late"), [])

    def test_no_progress_when_idle(self):
        d = Dialogue()
        self.assertEqual(d.shell.progress("NX> 726 x"), [])
