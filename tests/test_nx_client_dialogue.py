"""The client's pure NX dialogue core, line by line (reference §2, §3, §7).

Server bytes are the ones nxgate, FreeNX and Neatx send (reference
transcripts); every test checks what the client answers and what it makes
of the reply.  Also here: the command lines the client builds, and the
small pure helpers of the command line (target parsing, known hosts).
"""

from __future__ import annotations

import io
import os
import sys
import tempfile

from twisted.conch.ssh.keys import Key
from twisted.trial.unittest import SynchronousTestCase

from nxgate.clients.nx import cli
from nxgate.protocols.nx import client_commands as commands
from nxgate.protocols.nx import client_dialogue as nx
from nxgate.clients.nx.knownhosts import KnownHosts, Verdict, preferred_algorithms
from nxgate.clients.nx.proxy import proxy_environment, proxy_options
from nxgate.node.agents.remote_desktop import parse_server
from nxgate.protocols.nx.listing import DASHES, HEADER, ListingRow, ParsedRow, format_session_list, parse_row
from nxgate.protocols.nx.params import escape, parse_params

BANNER = b"HELLO NXSERVER - Version 3.5.0 - GPL\nNX> 105 "
HELLO_REPLY = b"hello NXCLIENT - Version 3.5.0\nNX> 134 Accepted protocol: 3.5.0\nNX> 105 "
SESSION_ID = "0123456789ABCDEF0123456789ABCDEF"
COOKIE = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
PARAMS = commands.SessionParameters(name="my desk", type="unix-console", width=800, height=600)

NXGATE_START_REPLY = (
    f"NX> 700 Session id: gw.example-1001-{SESSION_ID}\n"
    "NX> 705 Session display: 1001\n"
    "NX> 703 Session type: unix-console\n"
    f"NX> 701 Proxy cookie: {COOKIE}\n"
    "NX> 702 Proxy IP: 127.0.0.1\n"
    f"NX> 706 Agent cookie: {COOKIE}\n"
    "NX> 704 Session cache: unix-console\n"
    "NX> 707 SSL tunneling: 1\n"
    "NX> 1009 Session status: starting\n"
    "NX> 710 Session status: running\n"
    "NX> 1002 Commit\n"
    "NX> 1006 Session status: running\n"
    "NX> 105 "
).encode()

NEATX_START_REPLY = (
    "Start session with: --session=\"my desk\" ...\n"
    f"NX> 700 Session id: host.example-837-{SESSION_ID}\n"
    "NX> 705 Session display: 837\n"
    "NX> 703 Session type: unix-console\n"
    f"NX> 701 Proxy cookie: {COOKIE}\n"
    f"NX> 706 Agent cookie: {COOKIE}\n"
    "NX> 704 Session cache: unix-console\n"
    "NX> 728 Session caption: Neatx - alice@host.example:837 - my desk\n"
    "NX> 707 SSL tunneling: 1\n"
    "NX> 708 Subscription: GPL\n"
    "NX> 710 Session status: running\n"
    "NX> 105 "
).encode()

# The table exactly as nxgate formats it (Neatx's layout, which OpenNX parses).
LISTING = ('listsession --status="suspended,running"\n' + "\n".join(format_session_list("alice", [
    ListingRow(1001, "unix-console", SESSION_ID, "--D--PSA", 24, "800x600", "Running", "my desk"),
    ListingRow(1002, "unix-kde", "FEDCBA9876543210FEDCBA9876543210", "-RD--PSA", 24, "1280x1024", "Suspended",
                  "work  with   spaces "),
], capacity_reached=False)) + "\nNX> 105 ").encode()


def sent(events) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, nx.Send))


def results(events) -> list:
    return [e for e in events if not isinstance(e, (nx.Send, nx.Trace))]


def traces(events) -> list[str]:
    return [e.text for e in events if isinstance(e, nx.Trace)]


class Server:
    """Plays the server's side of the dialogue against a ClientDialogue."""

    def __init__(self, request: nx.Request = nx.ListSessions(), password="s3cret", user="alice") -> None:
        self.asked = 0

        def ask() -> str:
            self.asked += 1
            return password

        self.client = nx.ClientDialogue(user, ask if password is not None else "unused", request)
        self.events: list = []

    def say(self, data: bytes) -> bytes:
        """Feed server bytes; returns what the client sent back."""
        self.events = self.client.data_received(data)
        return sent(self.events)

    def results(self) -> list:
        return results(self.events)

    def greet(self) -> None:
        assert self.say(BANNER) == b"hello NXCLIENT - Version 3.5.0\n"
        assert self.say(HELLO_REPLY) == b"SET SHELL_MODE SHELL\n"
        assert self.say(b"SET SHELL_MODE SHELL\nNX> 105 ") == b"SET AUTH_MODE PASSWORD\n"
        assert self.say(b"SET AUTH_MODE PASSWORD\nNX> 105 ") == b"login\n"

    def login(self) -> bytes:
        """Greeting and a password login; returns the command the client sends."""
        self.greet()
        assert self.say(b"login\nNX> 101 User: ") == b"alice\n"
        assert self.say(b"alice\nNX> 102 Password: ") == b"s3cret\n"
        return self.say(b"**********\nNX> 103 Welcome to: gw.example user: alice\nNX> 105 ")


# --------------------------------------------------------------------- greeting
class GreetingTests(SynchronousTestCase):
    def test_hello_after_banner_and_prompt(self):
        server = Server()
        self.assertEqual(server.say(BANNER), b"hello NXCLIENT - Version 3.5.0\n")
        self.assertEqual(server.client.server_version, "3.5.0")

    def test_prompt_split_across_reads(self):
        server = Server()
        self.assertEqual(server.say(b"HELLO NXSERVER - Version 3.5.0 - GPL\nNX> 1"), b"")
        self.assertEqual(server.say(b"05"), b"")
        self.assertEqual(server.say(b" "), b"hello NXCLIENT - Version 3.5.0\n")

    def test_whole_login_fed_byte_by_byte(self):
        server = Server()
        transcript = (BANNER + HELLO_REPLY + b"SET SHELL_MODE SHELL\nNX> 105 SET AUTH_MODE PASSWORD\nNX> 105 "
                      + b"login\nNX> 101 User: alice\nNX> 102 Password: **********\n"
                      + b"NX> 103 Welcome to: gw.example user: alice\nNX> 105 ")
        out = b"".join(server.say(transcript[i : i + 1]) for i in range(len(transcript)))
        self.assertEqual(out, b"hello NXCLIENT - Version 3.5.0\nSET SHELL_MODE SHELL\nSET AUTH_MODE PASSWORD\n"
                              b"login\nalice\ns3cret\nlistsession --status=\"suspended,running\"\n")

    def test_echo_on_the_prompt_line_is_not_a_prompt(self):
        server = Server()
        server.say(BANNER)
        # The echo arrives in the same read as the prompt that preceded it.
        self.assertEqual(server.say(b"NX> 105 hello NXCLIENT - Version 3.5.0\n"), b"")
        self.assertEqual(server.client.phase, nx.Phase.HELLO)

    def test_local_nxssh_lines_and_motd_before_the_banner_are_ignored(self):
        server = Server()
        self.assertEqual(server.say(b"NX> 203 NXSSH running with pid: 42\nWelcome!\n"), b"")
        self.assertEqual(server.say(BANNER), b"hello NXCLIENT - Version 3.5.0\n")

    def test_neatx_capitalised_echoes_and_its_exact_version(self):
        server = Server()
        # Neatx accepts only its own version: say it back, as Remmina and OpenNX do.
        self.assertEqual(server.say(b"HELLO NXSERVER - Version 3.3.0 - GPL\nNX> 105 "),
                         b"hello NXCLIENT - Version 3.3.0\n")
        self.assertEqual(server.say(b"Hello nxclient - version 3.3.0\nNX> 134 Accepted protocol: 3.3.0\nNX> 105 "),
                         b"SET SHELL_MODE SHELL\n")
        self.assertEqual(server.say(b"Set SHELL_MODE: SHELL\nNX> 105 "), b"SET AUTH_MODE PASSWORD\n")
        self.assertEqual(server.client.server_version, "3.3.0")
        self.assertEqual(server.client.accepted_version, "3.3.0")

    def test_freenx_banner_version_and_nx4_fallback(self):
        from nxgate.protocols.nx.client_commands import hello

        self.assertEqual(hello("3.2.0-74-SVN"), "hello NXCLIENT - Version 3.2.0")
        self.assertEqual(hello("4.0.0"), "hello NXCLIENT - Version 3.5.0")
        self.assertEqual(hello(None), "hello NXCLIENT - Version 3.5.0")

    def test_prompt_ended_by_a_newline_still_counts(self):
        server = Server()
        self.assertEqual(server.say(b"HELLO NXSERVER - Version 3.5.0 - GPL\nNX> 105\n"),
                         b"hello NXCLIENT - Version 3.5.0\n")

    def test_protocol_refused(self):
        server = Server()
        server.say(BANNER)
        self.assertEqual(server.say(b"hello NXCLIENT - Version 3.5.0\nNX> 500 Protocol you requested is not "
                                    b"supported, please upgrade your client to latest version\nNX> 999 Bye.\n"), b"")
        self.assertEqual(server.results(), [nx.Failed((
            "NX> 500 Protocol you requested is not supported, please upgrade your client to latest version",))])

    def test_no_134_is_an_error(self):
        server = Server()
        server.say(BANNER)
        self.assertEqual(server.say(b"hello NXCLIENT - Version 3.5.0\nNX> 105 "), b"")
        (failed,) = server.results()
        self.assertIn("did not accept 'hello NXCLIENT - Version 3.5.0'", failed.lines[0])

    def test_server_closing_early_is_an_error(self):
        server = Server()
        server.say(BANNER)
        (failed,) = results(server.client.connection_lost())
        self.assertEqual(failed.lines, ("the server closed the connection during hello",))


# ------------------------------------------------------------------------ login
class LoginTests(SynchronousTestCase):
    def test_password_login(self):
        server = Server()
        self.assertEqual(server.login(), b'listsession --status="suspended,running"\n')
        self.assertTrue(server.client.logged_in)
        self.assertEqual(server.asked, 1)

    def test_password_is_masked_in_traces_and_reprs(self):
        server = Server()
        server.greet()
        server.say(b"login\nNX> 101 User: ")
        events = server.client.data_received(b"alice\nNX> 102 Password: ")
        self.assertIn("********", traces(events))
        self.assertNotIn("s3cret", repr(events))
        events = server.client.data_received(b"s3cret\n")  # a server that echoes it: still masked
        self.assertEqual(traces(events), ["********"])

    def test_legacy_free_login_needs_no_password(self):
        server = Server()
        server.greet()
        self.assertEqual(server.say(b"login\nNX> 103 Welcome to: gw.example user: alice\nNX> 105 "),
                         b'listsession --status="suspended,running"\n')
        self.assertEqual(server.asked, 0)

    def test_wrong_password(self):
        server = Server()
        server.greet()
        server.say(b"login\nNX> 101 User: ")
        server.say(b"alice\nNX> 102 Password: ")
        self.assertEqual(server.say(b"**********\nNX> 404 ERROR: wrong password or login\nNX> 105 "), b"")
        self.assertEqual(server.results(), [nx.Failed(("NX> 404 ERROR: wrong password or login",))])

    def test_wrong_password_then_bye_freenx(self):
        server = Server()
        server.greet()
        server.say(b"login\nNX> 101 User: ")
        server.say(b"alice\nNX> 102 Password: ")
        server.say(b"\nNX> 404 ERROR: wrong password or login\nNX> 999 Bye\n")
        self.assertEqual(server.results(), [nx.Failed(("NX> 404 ERROR: wrong password or login",))])

    def test_wrong_password_then_close_neatx(self):
        server = Server()
        server.greet()
        server.say(b"login\nNX> 101 User: ")
        server.say(b"alice\nNX> 102 Password: ")
        self.assertEqual(server.say(b"**********\nNX> 404 ERROR: wrong password or login.\n"), b"")
        self.assertEqual(server.results(), [])
        self.assertTrue(server.client.error_pending)
        self.assertEqual(results(server.client.connection_lost()),
                         [nx.Failed(("NX> 404 ERROR: wrong password or login.",))])

    def test_error_without_prompt_gives_up_on_timer(self):
        server = Server()
        server.greet()
        server.say(b"login\nNX> 503 ERROR: Internal error.\n")
        self.assertTrue(server.client.error_pending)
        self.assertEqual(results(server.client.timed_out()), [nx.Failed(("NX> 503 ERROR: Internal error.",))])
        self.assertFalse(server.client.error_pending)

    def test_prompt_without_welcome_is_an_error(self):
        server = Server()
        server.greet()
        server.say(b"login\nNX> 105 ")
        (failed,) = server.results()
        self.assertIn("no NX> 103", failed.lines[0])


# ------------------------------------------------------------------ start reply
class StartTests(SynchronousTestCase):
    def start(self, request: nx.Request | None = None) -> Server:
        server = Server(request or nx.StartSession(PARAMS))
        self.command = server.login()
        return server

    def test_start_command_line(self):
        self.start()
        self.assertEqual(self.command, (
            'startsession --session="my%20desk" --type="unix-console" --geometry="800x600" '
            '--screeninfo="800x600x24+render" --link="lan" --keyboard="pc105/us" --encryption="1" --cache="16M" '
            '--images="64M" --backingstore="1" --media="0" --client="linux"\n').encode())

    def test_restore_command_line(self):
        self.start(nx.RestoreSession(SESSION_ID, PARAMS))
        self.assertTrue(self.command.startswith(f'restoresession --id="{SESSION_ID}" --session="my%20desk" '.encode()))

    def test_nxgate_and_freenx_reply_order(self):
        server = self.start()
        echo = self.command.rstrip(b"\n") + b"\n"
        self.assertEqual(server.say(echo + NXGATE_START_REPLY), b"")
        self.assertEqual(server.results(), [nx.SessionReady(nx.SessionInfo(
            full_id=f"gw.example-1001-{SESSION_ID}", session_id=SESSION_ID, display=1001, cookie=COOKIE,
            session_type="unix-console", proxy_ip="127.0.0.1", status="running"))])
        self.assertEqual(server.results()[0].info.cookie, COOKIE)
        self.assertEqual(server.client.phase, nx.Phase.READY)

    def test_freenx_node_banner_in_the_reply(self):
        server = self.start()
        server.say(b"NX> 1000 NXNODE - Version 3.2.0-74-SVN OS (GPL)\n" + NXGATE_START_REPLY)
        (ready,) = server.results()
        self.assertEqual(ready.info.display, 1001)

    def test_neatx_reply_order(self):
        server = self.start()
        server.say(NEATX_START_REPLY)
        (ready,) = server.results()
        self.assertEqual((ready.info.full_id, ready.info.display, ready.info.proxy_ip),
                         (f"host.example-837-{SESSION_ID}", 837, ""))

    def test_prompt_overtaking_the_status_lines(self):
        server = self.start()
        server.say(f"NX> 700 Session id: gw-1001-{SESSION_ID}\nNX> 705 Session display: 1001\n"
                   f"NX> 701 Proxy cookie: {COOKIE}\nNX> 707 SSL tunneling: 1\nNX> 105 ".encode())
        self.assertEqual(server.results(), [])
        server.say(b"NX> 710 Session status: running\n")
        (ready,) = server.results()
        self.assertEqual(ready.info.cookie, COOKIE)
        server.say(b"NX> 1002 Commit\nNX> 1006 Session status: running\n")  # late lines do no harm
        self.assertEqual(server.results(), [])

    def test_bye_then_raw_stream(self):
        server = self.start()
        server.say(NXGATE_START_REPLY)
        self.assertEqual(sent(server.client.proxy_connected()), b"bye\n")
        stream = b"\x00\xffNXPROXY-3.5.0\nNX> 105 not a prompt"
        self.assertEqual(server.say(b"bye\nNX> 999 Bye.\n" + stream), b"")
        self.assertEqual(server.results(), [nx.Switched(stream)])
        self.assertEqual(server.client.phase, nx.Phase.SWITCHED)
        self.assertRaises(RuntimeError, server.client.data_received, b"more")

    def test_bye_split_across_reads(self):
        server = self.start()
        server.say(NXGATE_START_REPLY)
        server.client.proxy_connected()
        self.assertEqual(server.say(b"bye\nNX> 99"), b"")
        self.assertEqual(server.results(), [])
        server.say(b"9 Bye.\n")
        self.assertEqual(server.results(), [nx.Switched(b"")])

    def test_freenx_sends_999_on_stderr(self):
        server = self.start()
        server.say(NXGATE_START_REPLY)
        server.client.proxy_connected()
        self.assertEqual(results(server.client.stderr_received(b"Bye\nNX> 999 Bye\n")), [nx.Switched(b"")])

    def test_cookie_mismatch(self):
        server = self.start()
        server.say(NXGATE_START_REPLY.replace(f"706 Agent cookie: {COOKIE}".encode(), b"706 Agent cookie: other"))
        (failed,) = server.results()
        self.assertIn("(NX> 701) and agent cookie (NX> 706) differ", failed.lines[0])

    def test_nxcl_style_only_agent_cookie(self):
        server = self.start()
        server.say(NXGATE_START_REPLY.replace(f"NX> 701 Proxy cookie: {COOKIE}\n".encode(), b""))
        (ready,) = server.results()
        self.assertEqual(ready.info.cookie, COOKIE)

    def test_unencrypted_session_is_refused(self):
        server = self.start()
        server.say(NXGATE_START_REPLY.replace(b"SSL tunneling: 1", b"SSL tunneling: 0"))
        (failed,) = server.results()
        self.assertIn("unencrypted", failed.lines[0])

    def test_no_session_id(self):
        server = self.start()
        server.say(b"NX> 710 Session status: running\nNX> 105 ")
        (failed,) = server.results()
        self.assertIn("no NX> 700", failed.lines[0])

    def test_596_with_last_operation_failed(self):
        server = self.start()
        server.say(b"NX> 596 Error: Session type 'unix-x' is not supported.\n"
                   b"NX> 500 ERROR: Last operation failed.\nNX> 105 ")
        self.assertEqual(server.results(), [nx.Failed((
            "NX> 596 Error: Session type 'unix-x' is not supported.", "NX> 500 ERROR: Last operation failed."))])

    def test_599_and_500_in_separate_reads(self):
        server = self.start()
        server.say(b"NX> 599 Reached the maximum number of concurrent sessions on this server.\n")
        self.assertEqual(server.results(), [])
        server.say(b"NX> 500 ERROR: Last operation failed.\nNX> 105 ")
        self.assertEqual(server.results(), [nx.Failed((
            "NX> 599 Reached the maximum number of concurrent sessions on this server.",
            "NX> 500 ERROR: Last operation failed."))])

    def test_597_bad_parameters(self):
        server = self.start()
        server.say(b'NX> 597 Error: Parsing parameters: string "x" has invalid format\nNX> 105 ')
        self.assertEqual(server.results(), [nx.Failed(('NX> 597 Error: Parsing parameters: string "x" has '
                                                        'invalid format',))])

    def test_freenx_1004_then_596_then_bye(self):
        server = self.start()
        server.say(b"NX> 1004 Error: Session did not start.\nNX> 596 Session startup failed.\nNX> 999 Bye\n")
        self.assertEqual(server.results(), [nx.Failed((
            "NX> 1004 Error: Session did not start.", "NX> 596 Session startup failed."))])

    def test_error_while_waiting_for_the_proxy(self):
        server = self.start()
        server.say(NXGATE_START_REPLY)
        server.say(b"NX> 596 Session failed.\n")
        self.assertTrue(server.client.error_pending)
        self.assertEqual(results(server.client.timed_out()), [nx.Failed(("NX> 596 Session failed.",))])

    def test_cookies_are_masked_in_traces(self):
        server = self.start()
        events = server.client.data_received(NXGATE_START_REPLY)
        self.assertNotIn(COOKIE, "\n".join(traces(events)))
        self.assertIn("NX> 701 Proxy cookie: ********", traces(events))


# --------------------------------------------------------------------- listing
class ListTests(SynchronousTestCase):
    def test_table(self):
        server = Server()
        server.login()
        self.assertEqual(server.say(LISTING), b"quit\n")
        self.assertEqual(server.results(), [nx.Listed((
            ParsedRow("1001", "unix-console", SESSION_ID, "--D--PSA", "24", "800x600", "Running", "my desk"),
            ParsedRow("1002", "unix-kde", "FEDCBA9876543210FEDCBA9876543210", "-RD--PSA", "24", "1280x1024",
                             "Suspended", "work with spaces"),
        ), capacity_reached=False)])
        self.assertEqual(server.say(b"quit\nNX> 999 Bye.\n"), b"")
        self.assertEqual(server.client.phase, nx.Phase.DONE)
        self.assertEqual(results(server.client.connection_lost()), [])

    def test_empty_table(self):
        server = Server()
        server.login()
        server.say("\n".join(format_session_list("alice", [], capacity_reached=False)).encode() + b"\nNX> 105 ")
        self.assertEqual(server.results(), [nx.Listed((), capacity_reached=False)])

    def test_name_keeps_its_inner_spaces(self):
        row = parse_row("1002    unix-kde         FEDCBA9876543210FEDCBA9876543210 -RD--PSA    24 1280x1024"
                           "      Suspended   work  with   spaces \r")
        self.assertEqual((row.status, row.name), ("Suspended", "work  with   spaces"))
        self.assertIsNone(parse_row("garbage line"))

    def test_freenx_table_with_capacity_reached(self):
        server = Server()
        server.login()
        server.say(
            b"NX> 127 Sessions list of user 'alice' for reconnect:\n\n"
            b"Display Type             Session ID                       Options  Depth Screen         Status      "
            b"Session Name\n"
            b"------- ---------------- -------------------------------- -------- ----- -------------- ----------- "
            b"------------------------------\n"
            b"1000    unix-gnome       0123456789ABCDEF0123456789ABCDEF --D--PSA   N/A N/A            N/A         gn\n"
            b"\n\nNX> 147 Server capacity: reached for user: alice\nNX> 105 ")
        (listed,) = server.results()
        self.assertTrue(listed.capacity_reached)
        self.assertEqual([(s.session_id, s.status, s.name) for s in listed.sessions], [(SESSION_ID, "N/A", "gn")])

    def test_listing_refused(self):
        server = Server()
        server.login()
        server.say(b"NX> 554 Error: the command 'listsession' cannot be called before to login\nNX> 105 ")
        (failed,) = server.results()
        self.assertTrue(failed.lines[0].startswith("NX> 554 "))


# ------------------------------------------------------------------- terminate
class TerminateTests(SynchronousTestCase):
    def test_terminate(self):
        server = Server(nx.TerminateSession(SESSION_ID))
        self.assertEqual(server.login(), f'terminate --sessionid="{SESSION_ID}"\n'.encode())
        self.assertEqual(server.say(f'terminate --sessionid="{SESSION_ID}"\n'
                                    f"NX> 716 Terminating session {SESSION_ID} on user request.\n"
                                    f"NX> 900 Session id: {SESSION_ID} terminated.\nNX> 105 ".encode()), b"quit\n")
        self.assertEqual(server.results(), [nx.Terminated(SESSION_ID, (
            f"NX> 716 Terminating session {SESSION_ID} on user request.",
            f"NX> 900 Session id: {SESSION_ID} terminated."))])

    def test_suspend(self):
        server = Server(nx.SuspendSession(SESSION_ID))
        self.assertEqual(server.login(), f'suspend --sessionid="{SESSION_ID}"\n'.encode())
        server.say(f"NX> 716 Suspending session {SESSION_ID} on user request.\nNX> 105 ".encode())
        self.assertEqual(server.results(), [nx.Suspended(SESSION_ID, (
            f"NX> 716 Suspending session {SESSION_ID} on user request.",))])

    def test_unknown_session(self):
        server = Server(nx.TerminateSession(SESSION_ID))
        server.login()
        server.say(f"NX> 596 Error: Could not find session {SESSION_ID}.\n"
                   "NX> 500 ERROR: Last operation failed.\nNX> 105 ".encode())
        (failed,) = server.results()
        self.assertEqual(len(failed.lines), 2)

    def test_neatx_has_no_terminate(self):
        server = Server(nx.TerminateSession(SESSION_ID))
        server.login()
        server.say(b"NX> 503 Error: undefined command: 'terminate'\nNX> 105 ")
        self.assertEqual(server.results(), [nx.Failed(("NX> 503 Error: undefined command: 'terminate'",))])


# ------------------------------------------------------------------- parameters
class ParameterTests(SynchronousTestCase):
    def test_escaped_characters(self):
        self.assertEqual(escape(' "%\'$`\\&:'), "%20%22%25%27%24%60%5C%26%3A")

    def test_control_characters_cannot_end_the_line(self):
        self.assertEqual(escape("a\nb\rc\x00"), "a%0Ab%0Dc%00")

    def test_plain_values_are_untouched(self):
        self.assertEqual(escape("pc105/us 1024x768x24+render-é"), "pc105/us%201024x768x24+render-é")

    def test_values_survive_the_servers_parser(self):
        application = "xterm -T 'my \"term\"' -e sh -c 'echo $HOME `id` 100% & a:b \\n'"
        params = commands.SessionParameters(name="a \"quoted\" name", type="unix-application", application=application,
                                            rootless=True)
        parsed = parse_params(commands.start_command(params).partition(" ")[2])
        self.assertEqual(parsed["application"], application)
        self.assertEqual(parsed["session"], 'a "quoted" name')
        self.assertEqual(parsed["rootless"], "1")

    def test_rootless_only_for_console_and_application(self):
        keys = dict(commands.SessionParameters(type="unix-kde", rootless=True).pairs())
        self.assertNotIn("rootless", keys)
        keys = dict(commands.SessionParameters(type="unix-console", rootless=True, fullscreen=True).pairs())
        self.assertEqual((keys["rootless"], keys["fullscreen"]), ("1", "1"))

    def test_list_and_terminate_lines(self):
        self.assertEqual(commands.list_command(), 'listsession --status="suspended,running"')
        self.assertEqual(commands.terminate_command(SESSION_ID), f'terminate --sessionid="{SESSION_ID}"')

    def test_session_ids(self):
        self.assertEqual(commands.normalize_session_id(SESSION_ID.lower()), SESSION_ID)
        self.assertEqual(commands.normalize_session_id(f"gw.example-1001-{SESSION_ID}"), SESSION_ID)
        for bad in ("", "XYZ", SESSION_ID[:-1], SESSION_ID + "0", 'x" --id="' + SESSION_ID):
            self.assertIsNone(commands.normalize_session_id(bad), bad)


# --------------------------------------------------------------------- shadow
OTHER_ID = "FEDCBA9876543210FEDCBA9876543210"
SHADOW_PARAMS = commands.SessionParameters(name="helping", type="shadow", width=800, height=600)


def shadow_listing(*rows: tuple[int, str, str]) -> bytes:
    """nxgate's reply to ``listsession --type="shadow"``: (display, id, name)
    rows, ending at the prompt without a capacity line (reference §2.4)."""
    lines = ['listsession --type="shadow"', "NX> 127 Session list of user 'bob':", HEADER, DASHES]
    lines += [ListingRow(display, "unix-console", sid, "--D--PSA", 24, "800x600", "Running", name).row()
              for display, sid, name in rows]
    return ("\n".join(lines) + "\n\nNX> 105 ").encode()


ATTACH_TAIL = ('--session="helping" --type="shadow" --geometry="800x600" --link="lan" --keyboard="pc105/us" '
               '--encryption="1" --cache="16M" --images="64M" --backingstore="1" --media="0" --client="linux"')


class ShadowTests(SynchronousTestCase):
    def shadow(self, session_id: str | None = None, view_only: bool = False) -> Server:
        server = Server(nx.ShadowSession(session_id, SHADOW_PARAMS, view_only))
        self.assertEqual(server.login(), b'listsession --type="shadow"\n')
        return server

    def test_named_session_attached_with_its_listed_display(self):
        server = self.shadow(SESSION_ID)
        command = server.say(shadow_listing((1002, OTHER_ID, "other alice"), (1001, SESSION_ID, "desk alice")))
        self.assertEqual(command, f'attachsession --id="{SESSION_ID}" --display="1001" {ATTACH_TAIL}\n'.encode())
        self.assertEqual(server.results(), [])
        server.say(command + NXGATE_START_REPLY.replace(b"unix-console", b"shadow"))
        (ready,) = server.results()
        self.assertEqual((ready.info.session_id, ready.info.session_type), (SESSION_ID, "shadow"))
        self.assertEqual(sent(server.client.proxy_connected()), b"bye\n")

    def test_named_session_not_listed_is_left_to_the_server(self):
        server = self.shadow(SESSION_ID)
        command = server.say(shadow_listing())
        self.assertTrue(command.startswith(f'attachsession --id="{SESSION_ID}" --display="0" '.encode()), command)
        server.say(f"NX> 596 Error: Could not find shadowed session {SESSION_ID}. Session failed.\n"
                   "NX> 500 ERROR: Last operation failed.\nNX> 105 ".encode())
        (failed,) = server.results()
        self.assertTrue(failed.lines[0].startswith("NX> 596 Error: Could not find shadowed session"))

    def test_view_only(self):
        server = self.shadow(SESSION_ID, view_only=True)
        self.assertTrue(server.say(shadow_listing((1001, SESSION_ID, "desk alice"))).endswith(
            b'--client="linux" --viewonly="1"\n'))

    def test_the_only_session_is_picked(self):
        server = self.shadow()
        command = server.say(shadow_listing((1001, SESSION_ID, "desk alice")))
        self.assertTrue(command.startswith(f'attachsession --id="{SESSION_ID}" --display="1001" '.encode()), command)
        self.assertEqual(server.results(), [nx.Notice(
            f"shadowing {SESSION_ID} (desk alice), the only session you may shadow")])
        self.assertEqual(server.client.shadowed, SESSION_ID)  # what the client names when the shadow ends

    def test_several_sessions_make_the_user_choose(self):
        server = self.shadow()
        self.assertEqual(server.say(shadow_listing((1001, SESSION_ID, "desk alice"), (1002, OTHER_ID, "x bob"))), b"")
        (choices,) = server.results()
        self.assertEqual([(row.session_id, row.display, row.name) for row in choices.sessions],
                         [(SESSION_ID, "1001", "desk alice"), (OTHER_ID, "1002", "x bob")])
        self.assertEqual(server.client.phase, nx.Phase.CHOOSING)
        self.assertIsNone(server.client.shadowed)
        self.assertEqual(sent(server.client.choose(OTHER_ID)),
                         f'attachsession --id="{OTHER_ID}" --display="1002" {ATTACH_TAIL}\n'.encode())
        self.assertEqual(server.client.shadowed, OTHER_ID)
        self.assertRaises(RuntimeError, server.client.choose, OTHER_ID)

    def test_choosing_nothing_quits(self):
        server = self.shadow()
        server.say(shadow_listing((1001, SESSION_ID, "a alice"), (1002, OTHER_ID, "b bob")))
        self.assertEqual(sent(server.client.quit()), b"quit\n")
        server.say(b"quit\nNX> 999 Bye.\n")
        self.assertEqual(server.client.phase, nx.Phase.DONE)

    def test_nothing_to_shadow(self):
        server = self.shadow()
        server.say(shadow_listing())
        self.assertEqual(server.results(), [nx.Failed((nx.NOTHING_TO_SHADOW,))])

    def test_owner_asked_then_refuses(self):
        server = self.shadow(SESSION_ID)
        server.say(shadow_listing((1001, SESSION_ID, "desk alice")))
        server.say(b"NX> 726 Asking user for authorization to attach to session\n")
        self.assertEqual(server.results(), [nx.Notice("Asking user for authorization to attach to session")])
        server.say(b"NX> 596 Error: Authorization refused by user: alice.\nNX> 500 ERROR: Last operation failed.\n"
                   b"NX> 105 ")
        self.assertEqual(server.results(), [nx.Failed(("NX> 596 Error: Authorization refused by user: alice.",
                                                       "NX> 500 ERROR: Last operation failed."))])

    def test_freenx_shadow_listing(self):
        server = self.shadow()
        command = server.say(
            b'listsession --type="shadow"\nNX> 127 Sessions list of user \'bob\' for reconnect:\n\n' + HEADER.encode()
            + b"\n" + DASHES.encode() + b"\n1001    unix-kde         " + SESSION_ID.encode()
            + b" --D--PSA    24 1024x768       Running     kde alice (Shadowed)\n\n\nNX> 105 ")
        self.assertTrue(command.startswith(f'attachsession --id="{SESSION_ID}" --display="1001" '.encode()), command)

    def test_pick(self):
        rows = (ParsedRow("1001", "unix-console", SESSION_ID, "--D--PSA", "24", "800x600", "Running", "a"),
                ParsedRow("1002", "unix-kde", OTHER_ID, "--D--PSA", "24", "800x600", "Running", "b"))
        self.assertEqual(nx.pick(rows, "2\n"), rows[1])
        self.assertEqual(nx.pick(rows, SESSION_ID.lower()), rows[0])
        self.assertEqual(nx.pick(rows, f"gw-1002-{OTHER_ID}"), rows[1])
        for bad in ("0", "3", "-1", "x", "0123456789ABCDEF0123456789ABCDEE"):
            self.assertIsNone(nx.pick(rows, bad), bad)


# ------------------------------------------------------------- remote desktops
SECRET = 'pa ss:"w%rd'


class RemoteDesktopTests(SynchronousTestCase):
    def test_rdp_parameters_as_opennx_sends_them(self):
        remote = commands.RemoteDesktop("win.example:3390", "bob", "CORP", SECRET)
        line = commands.start_command(commands.SessionParameters(name="w", type="windows", remote=remote))
        self.assertTrue(line.startswith(
            'startsession --session="w" --type="windows" --agent_server="win.example%3A3390" --agent_domain="CORP" '
            '--agent_user="bob" --agent_password="pa%20ss%3A%22w%25rd" --geometry="1024x768" '
            '--screeninfo="1024x768x24+render" '), line)
        parsed = parse_params(line.partition(" ")[2])  # the server's own parser
        self.assertEqual((parsed["agent_server"], parsed["agent_password"]), ("win.example:3390", SECRET))
        self.assertEqual(parse_server("rdp", parsed["agent_server"]), ("win.example", 3390))

    def test_rdp_without_user_shows_the_login_screen(self):
        keys = dict(commands.SessionParameters(type="windows", remote=commands.RemoteDesktop("office")).pairs())
        self.assertEqual((keys["agent_server"], keys["agent_domain"]), ("office", ""))
        self.assertNotIn("agent_user", keys)
        self.assertNotIn("agent_password", keys)

    def test_vnc_sends_server_and_password_only(self):
        remote = commands.RemoteDesktop("lab.example:1", password=SECRET)
        line = commands.start_command(commands.SessionParameters(type="vnc", remote=remote))
        self.assertIn(' --type="vnc" --agent_server="lab.example%3A1" --agent_password="pa%20ss%3A%22w%25rd" ', line)
        self.assertNotIn("agent_user", line)
        parsed = parse_params(line.partition(" ")[2])
        self.assertEqual(parse_server("vnc", parsed["agent_server"]), ("lab.example", 5901))
        self.assertEqual(parse_server("vnc", "h::5999"), ("h", 5999))

    def test_remote_desktop_only_for_its_types(self):
        keys = dict(commands.SessionParameters(type="unix-kde", remote=commands.RemoteDesktop("x", "u")).pairs())
        self.assertNotIn("agent_server", keys)

    def test_password_in_no_trace_and_no_repr(self):
        remote = commands.RemoteDesktop("win", "bob", "", SECRET)
        params = commands.SessionParameters(name="w", type="windows", remote=remote)
        server = Server(nx.StartSession(params))
        server.greet()
        server.say(b"login\nNX> 101 User: ")
        server.say(b"alice\nNX> 102 Password: ")
        events = server.client.data_received(b"**********\nNX> 103 Welcome to: gw user: alice\nNX> 105 ")
        self.assertIn(b'--agent_password="pa%20ss%3A%22w%25rd"', sent(events))  # on the wire, of course
        # FreeNX echoes the command verbatim; no trace shows the password, raw or escaped.
        events += server.client.data_received(sent(events).rstrip(b"\n") + b"\n" + b"NX> 596 Error: " +
                                              SECRET.encode() + b" is wrong\nNX> 105 ")
        shown = "\n".join(traces(events))
        self.assertIn('--agent_password="********"', shown)
        for secret in (SECRET, escape(SECRET)):
            self.assertNotIn(secret, shown)
            self.assertNotIn(secret, repr(events))
        self.assertNotIn(SECRET, repr(params))


# ----------------------------------------------------------- command-line helpers
class CommandLineTests(SynchronousTestCase):
    ENV = {"DISPLAY": ":5"}

    def test_targets(self):
        self.assertEqual(cli.parse_target("alice@gw.example", None), ("alice", "gw.example", 4022))
        self.assertEqual(cli.parse_target("alice@gw.example:22", None), ("alice", "gw.example", 22))
        self.assertEqual(cli.parse_target("alice@[::1]:4000", None), ("alice", "::1", 4000))
        self.assertEqual(cli.parse_target("alice@gw", 2222), ("alice", "gw", 2222))
        self.assertRaises(cli.UsageError, cli.parse_target, "alice@gw:22", 2222)
        self.assertRaises(cli.UsageError, cli.parse_target, "alice@", None)

    def test_modes(self):
        options = cli.parse_options(["--list", "alice@gw"], {})
        self.assertEqual(options.request, nx.ListSessions())
        options = cli.parse_options(["--terminate", SESSION_ID.lower(), "alice@gw"], {})
        self.assertEqual(options.request, nx.TerminateSession(SESSION_ID))
        options = cli.parse_options(["--resume", SESSION_ID, "--geometry", "640x480", "alice@gw"], self.ENV)
        self.assertEqual(options.request, nx.RestoreSession(SESSION_ID, commands.SessionParameters(width=640,
                                                                                                   height=480)))
        self.patch(sys, "stderr", io.StringIO())  # argparse's complaint
        self.assertRaises(SystemExit, cli.parse_options, ["--list", "--resume", SESSION_ID, "alice@gw"], {})

    def test_new_session_checks(self):
        start = ["--geometry", "800x600", "alice@gw"]
        for extra in (["--type", "unix-application"], ["--application", "xterm"], ["--rootless", "--type", "unix-kde"],
                      ["--geometry", "big"], ["--type", "unix console"], ["--name", " "]):
            self.assertRaises(cli.UsageError, cli.parse_options, start[:2] + extra + start[2:], self.ENV)
        self.assertRaises(cli.UsageError, cli.parse_options, start, {})  # no DISPLAY for nxproxy
        self.assertRaises(cli.UsageError, cli.parse_options, ["--resume", "nope", "alice@gw"], self.ENV)

    def test_defaults(self):
        options = cli.parse_options(["alice@gw"], {"DISPLAY": ":5", "PATH": "/nonexistent"})  # no xdpyinfo
        self.assertEqual(options.request, nx.StartSession(commands.SessionParameters()))
        self.assertEqual((options.port, options.ssh_user, options.legacy_free), (4022, "nx", False))
        self.assertTrue(options.known_hosts.endswith(os.path.join(".config", "nxgate", "known_hosts")))
        self.assertIsNone(cli.parse_options(["--list", "--accept-any-host-key", "a@gw"], {}).known_hosts)

    def test_shadow(self):
        options = cli.parse_options(["--shadow", "--geometry", "800x600", "bob@gw"], self.ENV)
        self.assertEqual(options.request, nx.ShadowSession(None, commands.SessionParameters(type="shadow", width=800,
                                                                                              height=600)))
        self.assertTrue(options.attaches)
        options = cli.parse_options(["--shadow", f"gw-1001-{SESSION_ID}", "--view-only", "bob@gw"], self.ENV)
        self.assertEqual((options.request.session_id, options.request.view_only), (SESSION_ID, True))
        for args in (["--view-only"], ["--shadow", "nope"], ["--shadow", "--type", "unix-kde"], ["--list", "--view-only"]):
            self.assertRaises(cli.UsageError, cli.parse_options, [*args, "bob@gw"], self.ENV)
        self.patch(sys, "stderr", io.StringIO())
        self.assertRaises(SystemExit, cli.parse_options, ["--shadow", "--list", "bob@gw"], self.ENV)
        self.assertRaises(cli.UsageError, cli.parse_options, ["--shadow", "bob@gw"], {})  # no DISPLAY
        self.assertRaises(SystemExit, cli.parse_options, ["--list"], {})  # no target
        self.assertRaises(SystemExit, cli.parse_options, ["--shadow", SESSION_ID], self.ENV)

    def test_rdp(self):
        env = dict(self.ENV, NXGATE_REMOTE_PASSWORD=SECRET)
        options = cli.parse_options(["--rdp", "win.example:3390", "--remote-user", "bob", "--domain", "CORP",
                                     "--geometry", "1280x800", "alice@gw"], env)
        params = options.request.params
        self.assertEqual((params.type, params.width, params.remote),
                         ("windows", 1280, commands.RemoteDesktop("win.example:3390", "bob", "CORP", SECRET)))
        self.assertIsNone(options.remote_password_prompt)
        # Without the variable the password is asked, once the options are known.
        options = cli.parse_options(["--rdp", "[fd00::1]:3390", "--remote-user", "bob", "alice@gw"], self.ENV)
        self.assertEqual(options.remote_password_prompt, "Password for the remote desktop [fd00::1]:3390: ")
        options = options.with_remote_password(SECRET)
        self.assertEqual((options.request.params.remote.password, options.remote_password_prompt), (SECRET, None))
        # No user: the host's login screen; no password to ask.
        options = cli.parse_options(["--rdp", "office", "alice@gw"], self.ENV)
        self.assertEqual(options.request.params.remote, commands.RemoteDesktop("office"))
        self.assertIsNone(options.remote_password_prompt)

    def test_vnc(self):
        options = cli.parse_options(["--vnc", "lab.example:1", "alice@gw"], self.ENV)
        self.assertEqual(options.request.params.type, "vnc")
        self.assertEqual(options.remote_password_prompt, "Password for the remote desktop lab.example:1: ")
        # An empty variable: a VNC host without a password, nothing asked.
        options = cli.parse_options(["--vnc", "127.0.0.1::5999", "alice@gw"], dict(self.ENV, NXGATE_REMOTE_PASSWORD=""))
        self.assertEqual((options.request.params.remote, options.remote_password_prompt),
                         (commands.RemoteDesktop("127.0.0.1::5999"), None))

    def test_remote_desktop_usage_errors(self):
        for args in (["--vnc", "h:1", "--remote-user", "u"], ["--domain", "D"], ["--rdp", "h", "--type", "unix-kde"],
                     ["--rdp", "bad host"], ["--rdp", "h::1"], ["--vnc", "h:x"], ["--rdp", "h", "--remote-user", " "],
                     ["--rdp", "h\x01"], ["--vnc", "h:1", "--rootless"]):
            self.assertRaises(cli.UsageError, cli.parse_options, [*args, "alice@gw"], self.ENV)
        self.patch(sys, "stderr", io.StringIO())
        for args in (["--rdp", "h", "--vnc", "h:1"], ["--rdp", "h", "--resume", SESSION_ID], ["--vnc", "h", "--shadow"]):
            self.assertRaises(SystemExit, cli.parse_options, [*args, "alice@gw"], self.ENV)
        self.assertEqual(cli.parse_options(["--rdp", "h", "--type", "windows", "a@gw"], self.ENV).request.params.type,
                         "windows")

    def test_nxproxy_options_and_environment(self):
        info = nx.SessionInfo(f"gw.example-1001-{SESSION_ID}", SESSION_ID, 1001, COOKIE)
        self.assertEqual(proxy_options(info, "my desk, x:1", 5000),
                         f"nx/nx,session=my_desk__x_1,cookie={COOKIE},id=gw.example-1001-{SESSION_ID},"
                         f"connect=127.0.0.1,port=5000:1001")
        self.assertEqual(proxy_options(info, "s", 5000, {"media": 4713, "smb": 0, "cups": 631}),
                         f"nx/nx,session=s,cookie={COOKIE},id=gw.example-1001-{SESSION_ID},"
                         f"cups=631,media=4713,connect=127.0.0.1,port=5000:1001")
        self.assertRaises(ValueError, proxy_options,
                          nx.SessionInfo("x", SESSION_ID, 1, "abc,connect=evil"), "s", 1)
        env = proxy_environment({"DISPLAY": ":0", "HOME": "/home/a", "NXGATE_PASSWORD": "pw", "LC_ALL": "C",
                                 "NXGATE_REMOTE_PASSWORD": "rpw"}, "/t")
        self.assertEqual(env["NX_HOME"], "/t")
        self.assertEqual(env["XAUTHORITY"], "/home/a/.Xauthority")
        self.assertEqual(env["LC_ALL"], "C")
        self.assertNotIn("NXGATE_PASSWORD", env)
        self.assertNotIn("NXGATE_REMOTE_PASSWORD", env)


class KnownHostsTests(SynchronousTestCase):
    def setUp(self):
        self.path = os.path.join(tempfile.mkdtemp(), "sub", "known_hosts")
        self.key = Key.fromString(open(os.path.join(os.path.dirname(__file__), "fixtures",
                                                    "nomachine-client.key"), "rb").read()).public()

    def test_first_use_then_known(self):
        hosts = KnownHosts(self.path, "127.0.0.1", 4022)
        self.assertEqual(hosts.check(self.key).verdict, Verdict.UNKNOWN)
        hosts.add(self.key)
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o600)
        self.assertTrue(open(self.path).read().startswith("[127.0.0.1]:4022 ssh-dss "))
        self.assertEqual(hosts.check(self.key).verdict, Verdict.KNOWN)
        self.assertEqual(KnownHosts(self.path, "127.0.0.1", 4023).check(self.key).verdict, Verdict.UNKNOWN)

    def test_other_key_for_the_host_is_refused_whatever_its_type(self):
        os.makedirs(os.path.dirname(self.path))
        with open(self.path, "w") as handle:
            handle.write("[127.0.0.1]:4022 ssh-ed25519 "
                         "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
        check = KnownHosts(self.path, "127.0.0.1", 4022).check(self.key)
        self.assertEqual(check.verdict, Verdict.CHANGED)
        self.assertIn("has changed", check.message)

    def test_known_key_types_are_asked_for_first(self):
        supported = [b"ecdsa-sha2-nistp256", b"rsa-sha2-512", b"rsa-sha2-256", b"ssh-rsa", b"ssh-ed25519"]
        self.assertEqual(preferred_algorithms(supported, [b"ssh-rsa"])[:3],
                         [b"rsa-sha2-512", b"rsa-sha2-256", b"ssh-rsa"])
        self.assertEqual(preferred_algorithms(supported, [])[0], b"ssh-ed25519")
