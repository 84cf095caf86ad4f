"""The X2Go door's pure parts: the exec reader, the verb checks, X2Go's
names and output formats, the commands against a fake session API, and the
~/.x2go file confinement (the real clients: tests/test_e2e_x2go.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import random
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.conch.x2go import commands, files, names, shell, verbs
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.model import State
from nxgate.vocabulary.results import DesktopEntry, Listing, Ready, SessionView, StreamTarget
from tests.harness.fakes import FakeSessionAPI

FACTS = shell.Facts("alice", "/home/alice", "srv1")
UUID = "d0dc54c4-f0c8-11f1-82e7-02fc00000001"


def python_x2go(command: str) -> bytes:
    """python-x2go's wrapper (backends/control/plain.py)."""
    return (f'echo X2GODATABEGIN:{UUID}; PATH=/usr/local/bin:/usr/bin:/bin sh -c "{command}"; '
            f"echo X2GODATAEND:{UUID}").encode()


def x2goclient(command: str) -> bytes:
    """x2goclient's wrapper (sshprocess.cpp), with its quoting of ``'``."""
    inner = command.replace("'", "'\\''")
    return (f"bash -l -c 'echo \"X2GODATABEGIN:{UUID}\"; export TERM=\"dumb\"; {inner}; "
            f"echo \"X2GODATAEND:{UUID}\";'").encode()


def read(raw: bytes) -> tuple[shell.Program, tuple[verbs.Call, ...]]:
    program = shell.read_exec(raw, FACTS)
    return program, verbs.check_program(program, FACTS)


class ReaderTests(TestCase):
    def test_the_clients_wrappers_come_off_and_their_markers_stay(self):
        for wrap, wrapper in ((python_x2go, "python-x2go"), (x2goclient, "x2goclient")):
            program, calls = read(wrap("export HOSTNAME && x2golistsessions"))
            self.assertEqual(program.wrapper, wrapper)
            self.assertEqual((program.begin, program.end), (f"X2GODATABEGIN:{UUID}", f"X2GODATAEND:{UUID}"))
            self.assertEqual([c.verb for c in calls][-2:], ["export", "x2golistsessions"])

    def test_the_login_check_and_the_probes(self):
        self.assertEqual(read(b'echo "LOGIN OK"')[1][0].args, ("LOGIN OK",))
        self.assertEqual(read(python_x2go("echo $HOME"))[1][0].args, ("/home/alice",))
        self.assertEqual(read(python_x2go('stat -tL \\"/home/alice\\"'))[1][0].args, ("-tL", "/home/alice"))
        self.assertEqual(read(python_x2go("which x2goversion >/dev/null && x2goversion"))[1][1].verb, "x2goversion")

    def test_the_start_and_runcommand_forms_of_both_clients(self):
        _, calls = read(python_x2go("X2GO_XINERAMA=false x2gostartagent 800x600 adsl 16m-jpeg-9 unix-kde-depth_24 "
                                    "null auto 1 D XFCE both"))
        self.assertEqual(verbs.parse_start(calls[0].args).command, "XFCE")
        _, calls = read(x2goclient("X2GO_XINERAMA=no x2gostartagent 1024x768 lan 16m-jpeg-9 unix-kde-depth_24 us "
                                   "pc105/us 1 D XFCE both"))
        self.assertEqual(verbs.parse_start(calls[-1].args).depth, 24)
        _, calls = read(python_x2go("PULSE_CLIENTCONFIG=/home/alice/.x2go/C-x/.pulse-client.conf setsid "
                                    "x2goruncommand 1000 77 alice-1000-1733339233_stDXFCE_dp24 30001 xfce4-session "
                                    "pulse D 1>/dev/null 2>/dev/null & exit"))
        self.assertEqual([c.verb for c in calls], ["x2goruncommand", "exit"])
        program, calls = read(x2goclient('export PULSE_CLIENTCONFIG="${HOME}/.x2go/C-s/.pulse-client.conf";setsid '
                                         "/usr/bin/x2goruncommand 1000 77 alice-1000-1733339233_stDXFCE_dp24 30001 "
                                         "startxfce4 nosnd D 1> /dev/null 2>/dev/null & exit"))
        self.assertEqual([c.verb for c in calls], ["export", "export", "x2goruncommand", "exit"])
        self.assertEqual(calls[1].args, ("PULSE_CLIENTCONFIG=/home/alice/.x2go/C-s/.pulse-client.conf",))

    def test_the_pulse_configuration_goes_below_x2go_only(self):
        _, calls = read(python_x2go("echo 'default-server=127.0.0.1:3001'>/home/alice/.x2go/C-x/.pulse-client.conf;"
                                    "echo 'cookie-file=/home/alice/.x2go/C-x/.pulse-cookie'>>"
                                    "/home/alice/.x2go/C-x/.pulse-client.conf"))
        self.assertEqual([(c.output, c.append) for c in calls],
                         [("/home/alice/.x2go/C-x/.pulse-client.conf", False),
                          ("/home/alice/.x2go/C-x/.pulse-client.conf", True)])
        for target in ("/home/alice/.bashrc", "/home/alice/.x2go/../.bashrc", "/etc/passwd"):
            self.assertRaises(shell.Refused, read, python_x2go(f"echo x > {target}"))

    def test_what_is_refused(self):
        for raw in (b"id; cat /etc/shadow", b"x2golistsessions; rm -rf ~", b"echo $(id)", b"echo `id`",
                    b"x2golistsessions | sh", b"cat < /etc/shadow", b"echo ~root/x", b"echo $PATH", b"echo *",
                    b"x2golistsessions & id", b"x2gostartagent 800x600", b"bash -l -c 'id'", b"sh -c id",
                    b"ID=1 x2golistsessions", b"x2golistsessions 2>&1", b"x2golistsessions > /tmp/x",
                    b"/bin/sh", b"/usr/bin/x2golistsessions; /tmp/x2golistsessions", b"echo a\nid", b"",
                    b"x" * 5000, b"\xff\xfe", b"{ { x2golistsessions; }; }", b"echo ${HOME:-x}"):
            self.assertRaises(shell.Refused, read, raw)

    def test_only_the_pushed_sshfs_key_may_be_removed(self):
        """python-x2go ends its x2gomountdirs with ``; rm -f KEY KEY.ident``."""
        _, calls = read(b"x2gomountdirs dir s 'root' /home/alice/.x2go/ssh/key.z1 /tmp__REVERSESSH_PORT__30002; "
                        b"rm -f /home/alice/.x2go/ssh/key.z1 /home/alice/.x2go/ssh/key.z1.ident")
        self.assertEqual([call.verb for call in calls], ["x2gomountdirs", "rm"])
        for raw in (b"rm -f /home/alice/.x2go/C-x/.pulse-cookie", b"rm -f /etc/passwd", b"rm /home/alice/.x2go/ssh/key.a",
                    b"rm -f /home/alice/.x2go/ssh/../../.bashrc", b"rm -rf /home/alice/.x2go/ssh/key.a",
                    b"rm -f /home/alice/.x2go/ssh/id_rsa", b"rm -f a b c d",
                    b"rm -f /home/alice/.x2go/ssh/key.a /home/alice/.x2go/ssh/key.b /home/alice/.x2go/ssh/key.c"):
            self.assertRaises(shell.Refused, read, raw)

    def test_a_thousand_fuzzed_exec_strings_are_read_or_refused_never_more(self):
        """Only Refused, or a program of whitelisted calls; never another exception (nor a hang)."""
        pieces = ["x2golistsessions", "x2gostartagent", "x2goruncommand", "echo", "export", "which", "stat",
                  ";", "&&", "&", "|", "||", "$(", ")", "`", "'", '"', "\\", "{", "}", ">", ">>", "<", "2>", "1>",
                  "~", "~root", "$HOME", "${HOME}", "$", "${", "X2GODATABEGIN:1", f"X2GODATAEND:{UUID}", "bash",
                  "-l", "-c", "sh", "exit", "\t", " ", "*", "?", "[", "=", "PATH=", "A=b", "id", "rm", "-rf",
                  "/usr/bin/", "../", "\n", "\x00", "é", "#", "!", '"a b"', "'a b'", "a\\ b", "'\\''", "Prüfung",
                  "x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 us auto 0 R", "xterm -title", "$USER",
                  "$((", "${HOME:-x}", "$1", "X2GO_SPACE_CHAR"]
        rng = random.Random(24)
        allowed = set(verbs._CHECKS) | {"assign"}
        accepted = 0
        for _ in range(1000):
            text = "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(1, 14)))
            wrap = rng.choice([lambda t: t.encode(), python_x2go, x2goclient])
            try:
                _, calls = read(wrap(text))
            except shell.Refused:
                continue
            accepted += 1
            self.assertTrue({c.verb for c in calls} <= allowed, (text, calls))
        self.assertLess(accepted, 1000)


def python_start(command: str) -> bytes:
    """python-x2go's x2gostartagent with a profile command pasted in as it is (terminal/plain.py)."""
    return python_x2go("X2GO_XINERAMA=false x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 null auto 1 R "
                       f"{command} both")


def x2goclient_start(command: str) -> bytes:
    """x2goclient 4.1.2.2's x2gostartagent (onmainwindow.cpp), as its --debug log shows it: the profile's
    command pasted into its ``bash -l -c '…'`` with its own single quotes as they are (not ``'\\''``)."""
    return (f"bash -l -c 'echo \"X2GODATABEGIN:{UUID}\"; export PATH=\"/usr/local/bin:/usr/bin:/bin\";export "
            f"TERM=\"dumb\"; X2GO_XINERAMA=no x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 us auto 0 R "
            f"{command} both; echo \"X2GODATAEND:{UUID}\";'").encode()


class CommandLineTests(TestCase):
    """A profile's command line through each client's wrapping: the argv nxgate starts, without a shell."""

    def argv(self, raw: bytes) -> tuple[str, ...]:
        _, calls = read(raw)
        (start,) = [call for call in calls if call.verb == "x2gostartagent"]
        parsed = verbs.parse_start(start.args)
        return commands.session_type_for(parsed.command, set(), parsed.command_args)[1]

    def test_quoting_and_expansion_as_a_posix_shell_reads_them(self):
        cases = {
            'xterm -title "a b"': ("xterm", "-title", "a b"),
            "xterm -title 'a b'": ("xterm", "-title", "a b"),
            "xterm -title a\\ b": ("xterm", "-title", "a b"),
            "xterm -title Prüfung": ("xterm", "-title", "Prüfung"),
            'xterm -title "$USER@$HOSTNAME" -e "${HOME}"': ("xterm", "-title", "alice@srv1", "-e", "/home/alice"),
            "xterm -xrm 'XTerm*allowTitleOps: false' -title \"a b\"": ("xterm", "-xrm", "XTerm*allowTitleOps: false",
                                                                    "-title", "a b"),
            "xterm -title 'it''s' -T \"100 $\"": ("xterm", "-title", "its", "-T", "100 $"),
            "xterm -title a#b -T 'x!'": ("xterm", "-title", "a#b", "-T", "x!"),
        }
        for command, argv in cases.items():
            self.assertEqual(self.argv(python_start(command)), argv, command)
            self.assertEqual(self.argv(x2goclient_start(command)), argv, command)

    def test_a_tilde_and_single_quotes_through_x2goclients_bash_wrapping(self):
        self.assertEqual(self.argv(x2goclient_start("gedit ~/notes.txt")), ("gedit", "/home/alice/notes.txt"))
        self.assertEqual(self.argv(x2goclient_start("gedit ~alice/a\\'b")), ("gedit", "/home/alice/a'b"))
        self.assertEqual(self.argv(x2goclient_start("""xterm -e 'echo "it'"'"'s"'""")),
                         ("xterm", "-e", 'echo "it\'s"'))
        # Had x2goclient written its quotes as '\'' (the contract's reading of sshprocess.cpp), the same argv:
        self.assertEqual(self.argv(x2goclient("X2GO_XINERAMA=no x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 "
                                              "us auto 0 R xterm -title 'a b' both")), ("xterm", "-title", "a b"))

    def test_x2goclients_latin1_is_read_as_latin1(self):
        raw = x2goclient_start("xterm -title Prüfung").decode().encode("latin-1")
        program, _ = read(raw)
        self.assertEqual(program.extra.get("encoding"), "latin-1")
        self.assertEqual(self.argv(raw), ("xterm", "-title", "Prüfung"))
        self.assertRaises(shell.Refused, read, python_start("xterm -title Prüfung").decode().encode("latin-1"))

    def test_what_a_shell_would_do_beyond_words_is_refused_with_its_name(self):
        cases = {
            "xterm; id": "the command 'id'", "xterm && id": "the command 'id'", "xterm | id": "a pipe",
            "xterm > /tmp/x": "output to a file", "xterm $(id)": "command substitution",
            "xterm `id`": "command substitution", "xterm < /etc/shadow": "input redirection",
            "xterm -title $PATH": "the variable $PATH", "xterm *.txt": "file-name pattern",
            "xterm -title ~root": "another user's home", "xterm $((1+1))": "arithmetic expansion",
            "xterm ${HOME:-x}": "parameter expansion", "xterm #x": "a comment", "(xterm)": "sub-shell",
            "xterm $1": "special parameter",
        }
        for command, reason in cases.items():
            for raw in (python_start(command), x2goclient_start(command)):
                with self.assertRaises(shell.Refused, msg=command) as refused:
                    read(raw)
                self.assertIn(reason, str(refused.exception), command)

    def test_runcommand_takes_any_command_of_either_client(self):
        name = "alice-1000-1733339233_stRxterm_dp24"
        # python-x2go's quotes leave the pattern of a quoted '*' bare in sh -c's program: nothing runs that word.
        _, calls = read(python_x2go(f"setsid x2goruncommand 1000 77 {name} 30001 \"xtermX2GO_SPACE_CHAR-xrmX2GO_SPACE"
                                    "_CHAR'XTerm*allowTitleOps:X2GO_SPACE_CHARfalse'\" pulse R 1>/dev/null 2>/dev/null"
                                    " & exit"))
        self.assertEqual(calls[0].verb, "x2goruncommand")
        self.assertRaises(shell.Refused, read, python_x2go(f"setsid x2goruncommand 1000 77 {name} 30001 xterm pulse "
                                                           "R* 1>/dev/null 2>/dev/null & exit"))
        for raw in (python_x2go(f'setsid x2goruncommand 1000 77 {name} 30001 "xtermX2GO_SPACE_CHAR-titleX2GO_SPACE_CHAR'
                                f'"aX2GO_SPACE_CHARb"" pulse R 1>/dev/null 2>/dev/null & exit'),
                    x2goclient(f"setsid /usr/bin/x2goruncommand 1000 77 {name} 30001 xtermX2GO_SPACE_CHAR-titleX2GO_"
                               f'SPACE_CHAR"aX2GO_SPACE_CHARb" nosnd R 1> /dev/null 2>/dev/null & exit')):
            _, calls = read(raw)
            self.assertIn("x2goruncommand", [call.verb for call in calls])


def view(user="alice", display=1003, state=State.RUNNING, session_type="unix-xfce", **changes) -> SessionView:
    values = dict(id="AB" * 16, full_id="srv1-1003-" + "AB" * 16, user=user, type=session_type, name=session_type,
                  display=display, state=state, geometry="800x600", depth=24, render=True, fullscreen=False,
                  rootless=False, encrypted=True, client_address="192.0.2.7", created=1733339233.5,
                  changed=1733339300.0, attached_before=True, agent_pid=4242, failure="")
    values.update(changes)
    return SessionView(**values)


class NameTests(TestCase):
    def test_every_session_gets_an_x2go_name_that_both_clients_parse(self):
        name = names.session_name(view())
        self.assertEqual(name, "alice-1003-1733339233_stDXFCE_dp24")
        self.assertRegex(name, names.NAME)
        self.assertEqual(name.split("_")[1][2], "D")  # python-x2go's type
        self.assertEqual(name.split("_")[2][2:], "24")  # python-x2go's depth
        self.assertEqual(names.session_name(view(session_type="unix-console", rootless=True)).split("_st")[1],
                         "RTERMINAL_dp24")
        odd = view(session_type="unix-application", name="my_app --x", options={})
        self.assertNotIn("_", names.session_name(odd).split("_st")[1][:-5])

    def test_a_name_given_elsewhere_is_the_word_x2goclient_shows_as_command(self):
        for name, word in (("from the portal", "from-the-portal"), ("Büro 2_b", "Bro-2b"), ("XFCE", "XFCE"),
                           ("unix-xfce", "XFCE"), ("   ", "XFCE"), ("__", "XFCE")):
            self.assertEqual(names.session_name(view(name=name)), f"alice-1003-1733339233_stD{word}_dp24", name)
        self.assertEqual(names.session_name(view(session_type="unix-application", name="xterm", options={})),
                         "alice-1003-1733339233_stDxterm_dp24")
        renamed = view(name="my work")
        self.assertIs(names.find([renamed], "alice-1003-1733339233_stDXFCE_dp24"), renamed)  # a name from before

    def test_a_listing_line_has_sixteen_fields_numbers_where_clients_call_int(self):
        line = names.list_line(view(), b"k" * 32, "srv1", 1733339400.0)
        fields = line.split("|")
        self.assertEqual(len(fields), 16)
        for index in (0, 2, 8, 9, 12, 13, 14, 15):
            int(fields[index])
        self.assertEqual((fields[3], fields[4], fields[11]), ("srv1", "R", "alice"))
        self.assertRegex(fields[6], r"^[0-9a-f]{32}$")
        self.assertEqual(int(fields[9]), int(fields[8]) + 1)
        self.assertIsNone(names.list_line(view(state=State.TERMINATED), b"k", "srv1", 0))
        suspended = view(state=State.SUSPENDED, id="CD" * 16, display=1004)
        self.assertEqual([line.split("|")[4] for line in names.listing([view(), suspended], b"k", "h", 0).splitlines()],
                         ["S", "R"])

    def test_start_and_resume_outputs(self):
        n = names.numbers(view(), b"k")
        lines = names.start_output(n).splitlines()
        self.assertEqual(len(lines), 7)
        self.assertEqual([int(lines[i]) for i in (0, 2, 4, 5, 6)], [1003, 4242, n.gr_port, n.sound_port, n.fs_port])
        self.assertEqual(names.resume_output(n).splitlines()[0], f"gr_port={n.gr_port}")
        self.assertIn("x2goserver: ", names.version_output("0.1"))


class Sessions:
    """The session API's answers over a list of views (the door is given
    ``FakeSessionAPI.over`` them); ``calls`` keeps what changed something."""

    def __init__(self, views, limit=False):
        self.views = views
        self.limit = limit
        self.calls = []

    async def list(self, caller):
        return Listing(tuple(v for v in self.views if v.user == caller.user), False)

    async def start(self, caller, request):
        self.calls.append(("start", request))
        if self.limit:
            raise SessionError(ErrorKind.LIMIT_REACHED, "Server capacity: reached for user: alice")
        made = view(session_type=request.type, rootless=request.rootless)
        return Ready(made, "c" * 32, False, StreamTarget(made.id, "/x/agent.sock", 1000))

    async def restore(self, caller, request):
        self.calls.append(("restore", request))
        return Ready(self.views[0], request.cookie, True, StreamTarget(request.session_id, "/x/agent.sock", 1000))

    async def suspend(self, caller, session_id):
        self.calls.append(("suspend", session_id))

    async def applications(self, caller, session_id):
        self.calls.append(("applications", session_id))
        return (DesktopEntry("/x/xterm.desktop", ("Name=Terminal", "Exec=xterm %U"), 1, b"PNG"),)

    async def run_application(self, caller, session_id, argv):
        self.calls.append(("launch", session_id, argv))
        return True

    async def terminate(self, caller, session_id, reason="user request"):
        self.calls.append(("terminate", session_id))


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, text, **fields):
        self.lines.append(text.format(**fields))

    warn = info


def run(raw: bytes, sessions: Sessions, user="alice") -> commands.Outcome:
    facts = shell.Facts(user, f"/home/{user}", "srv1")
    program = shell.read_exec(raw, facts)
    calls = verbs.check_program(program, facts)

    async def locate(name):
        return None

    context = commands.Context(router=FakeSessionAPI.over(sessions), caller=Caller(user=user, uid=1000, gid=1000), facts=facts, secret=b"k" * 32,
                               links=commands.Links(), version="0.1", now=lambda: 1733339400.0, locate=locate,
                               log=_Log())
    return asyncio.run(commands.run(program, calls, context))


class CommandTests(TestCase):
    def test_start_answers_seven_lines_and_leaves_a_link(self):
        api = Sessions([])
        out = run(python_x2go("X2GO_XINERAMA=false x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 null "
                              "auto 1 D XFCE both"), api)
        lines = out.stdout.splitlines()
        self.assertEqual((lines[0], lines[-1]), (f"X2GODATABEGIN:{UUID}", f"X2GODATAEND:{UUID}"))
        self.assertEqual(len(lines[1:-1]), 7)
        self.assertEqual(lines[2], "c" * 32)
        self.assertEqual(api.calls[0][1].type, "unix-xfce")

    def test_a_command_with_blanks_shifts_the_arguments_and_is_put_back_together(self):
        api = Sessions([])
        run(python_x2go("X2GO_XINERAMA=false x2gostartagent 1024x768 lan 16m-jpeg-9 unix-kde-depth_24 null auto 1 R "
                        "xterm -bg magenta -geometry 100x30+0+0 both"), api)
        request = api.calls[0][1]
        self.assertEqual((request.type, request.application, request.rootless),
                         ("unix-application", ("xterm", "-bg", "magenta", "-geometry", "100x30+0+0"), True))

    def test_the_limit_is_x2gostartagents_exit_9(self):
        out = run(python_x2go("x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 null auto 1 R TERMINAL both"),
                  Sessions([], limit=True))
        self.assertEqual(out.status, 9)
        self.assertTrue(out.stderr.startswith("LIMIT "))

    def test_another_users_session_is_not_found_by_any_verb(self):
        theirs = view(user="bob")
        name = names.session_name(theirs)
        api = Sessions([theirs])
        for command in (f"x2gosuspend-session {name}", f"x2goterminate-session {name}", f"x2gocmdexitmessage {name}",
                        f"x2goresume-session {name} 800x600 lan 16m-jpeg-9 us pc105/us 1 both false",
                        f"setsid x2goruncommand 1003 1 {name} 1 xterm none R 1>/dev/null 2>/dev/null & exit"):
            out = run(python_x2go(command), api)
            self.assertIn("no such session", out.stderr, command)
        self.assertEqual(api.calls, [])
        self.assertNotIn(name, run(python_x2go("x2golistsessions"), api).stdout)

    def test_sharing_a_desktop_one_may_not_share_is_access_denied(self):
        api = Sessions([view(user="bob")])

        async def no_targets(caller):
            return ()

        api.shadow_targets = no_targets
        out = run(python_x2go("x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 null auto 1 S "
                              "1XSHADbobXSHAD:1003"), api)
        self.assertEqual(out.status, 8)
        self.assertIn("ACCESS DENIED", out.stderr)
        self.assertIn("XSHAD", out.stderr)  # what python-x2go looks for
        self.assertEqual(api.calls, [])

    def test_resume_asks_for_the_listed_cookie(self):
        mine = view(state=State.SUSPENDED)
        api = Sessions([mine])
        listed = run(python_x2go("x2golistsessions"), api).stdout.splitlines()[1].split("|")
        out = run(python_x2go(f"x2goresume-session {listed[1]} 1024x768 lan 16m-jpeg-9 us pc105/us 1 both false"), api)
        self.assertEqual(out.stdout.splitlines()[1], f"gr_port={listed[8]}")
        self.assertEqual(api.calls[0][1].cookie, listed[6])


class FileTests(TestCase):
    def setUp(self):
        self.home = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.home, True)
        self.owner = files.Owner(os.getuid(), os.getgid(), self.home)

    def test_a_file_below_x2go_is_written_and_nothing_else(self):
        fd = files.open_for_writing(f"{self.home}/.x2go/C-s/.pulse-cookie", self.owner)
        os.write(fd, b"cookie")
        os.close(fd)
        self.assertEqual(files.size_of(".x2go/C-s/.pulse-cookie", self.owner), 6)
        for path in (f"{self.home}/.bashrc", ".x2go/../.bashrc", "/etc/passwd", ".x2go", ".x2go/a b"):
            self.assertRaises(files.PathRefused, files.open_for_writing, path, self.owner)

    def test_no_symbolic_link_is_followed(self):
        target = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, target, True)
        os.symlink(target, os.path.join(self.home, ".x2go"))
        self.assertRaises(files.PathRefused, files.open_for_writing, ".x2go/ssh/key.z1", self.owner)
        os.unlink(os.path.join(self.home, ".x2go"))
        os.makedirs(os.path.join(self.home, ".x2go"))
        os.symlink("/etc/passwd", os.path.join(self.home, ".x2go", "key"))
        self.assertRaises(files.PathRefused, files.open_for_writing, ".x2go/key", self.owner)
        self.assertEqual(os.listdir(target), [])


class ScpSinkTests(TestCase):
    def test_libssh_pushes_a_file_and_a_directory(self):
        from nxgate.gateway.doors.conch.x2go import scp

        sink = scp.Sink(".x2go/ssh")
        self.assertEqual(sink.start(), b"\0")
        out, got = sink.feed(b"C0600 5 key.abc\n")
        self.assertEqual((out, got), (b"\0", []))
        out, got = sink.feed(b"hel")
        out2, got2 = sink.feed(b"lo\0D0700 0 sub\nC0600 1 x\nz\0E\n")
        self.assertEqual(out + out2, b"\0\0\0\0\0")
        self.assertEqual([(f.path, f.data) for f in got + got2], [(".x2go/ssh/key.abc", b"hello"),
                                                                  (".x2go/ssh/sub/x", b"z")])

    def test_what_a_sink_refuses(self):
        from nxgate.gateway.doors.conch.x2go import scp

        for data in (b"C0600 5 ../x\n", b"C0600 99999999 big\n", b"D0700 0 ..\n", b"X\n", b"x" * 2000,
                     b"C0600 1 a\nzz"):
            self.assertRaises(scp.Failed, scp.Sink(".x2go/ssh").feed, data)

    def test_scp_is_a_sink_into_x2go_only(self):
        self.assertEqual(read(b"scp -t -r '.x2go/ssh'")[1][0].verb, "scp")
        for raw in (b"scp -f .x2go/ssh", b"scp -t /etc", b"scp -t .ssh", b"scp -t -r .x2go/../.ssh", b"scp x y"):
            self.assertRaises(shell.Refused, read, raw)


class BoundsTests(TestCase):
    """The NX door's bounds of a session's screen, asked by the X2Go door too (one check)."""

    def test_a_size_the_nx_door_refuses_is_refused_in_x2goclients_words(self):
        from nxgate.protocols.nx import requests
        from nxgate.protocols.nx.errors import NXError
        from nxgate.protocols.nx.params import parse_params

        for geometry, refused in (("99999x99999", True), ("63x600", True), ("16385x600", True), ("800x600", False),
                                  ("16384x16384", False)):
            api = Sessions([])
            out = run(x2goclient(f"X2GO_XINERAMA=no x2gostartagent {geometry} lan 16m-jpeg-9 unix-kde-depth_24 us "
                                 "auto 0 D XFCE both"), api)
            try:
                requests.display_settings(parse_params(f'--geometry="{geometry}"'))
                nx_refused = False
            except NXError as error:
                nx_refused = error.code == 597
            self.assertEqual((out.status != 0, nx_refused), (refused, refused), geometry)
            if refused:
                self.assertIn(f"nxgate: the session size {geometry}: size out of range (64x64 to 16384x16384)",
                              out.stderr)
                self.assertEqual(api.calls, [])

    def test_a_depth_the_nx_door_refuses_is_refused(self):
        out = run(python_x2go("x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_12 null auto 1 D XFCE both"),
                  Sessions([]))
        self.assertIn("a colour depth of 12: depth must be 8, 15, 16, 24 or 32", out.stderr)


class PublishedApplicationTests(TestCase):
    """x2goclient's and python-x2go's published-applications mode: a type P session, x2gogetapps, Exec lines."""

    def test_a_type_p_session_is_a_rootless_agent_without_a_program(self):
        api = Sessions([])
        out = run(python_x2go("X2GO_XINERAMA=false x2gostartagent 800x600 lan 16m-jpeg-9 unix-kde-depth_24 null auto 1 P "
                              "PUBLISHED both"), api)
        request = api.calls[0][1]
        self.assertEqual((request.type, request.rootless, request.application), ("unix-published", True, ()))
        self.assertEqual(out.stdout.splitlines()[4], "alice-1003-1733339233_stRPUBLISHED_dp24")
        self.assertIn("X2GO_PUBLISHED_APPLICATIONS", run(python_x2go("x2gofeaturelist"), api).stdout)

    def test_x2gogetapps_asks_the_machine_of_the_published_session(self):
        published = view(session_type="unix-published", rootless=True, id="CD" * 16)
        api = Sessions([view(), published])
        out = run(python_x2go("which x2gogetapps >/dev/null && x2gogetapps"), api)
        self.assertEqual(api.calls, [("applications", "CD" * 16)])
        self.assertIn("<desktop>\nName=Terminal\n<icon>\nUE5H\n\n</icon>\nExec=xterm %U\n</desktop>\n", out.stdout)
        self.assertEqual(run(python_x2go("x2gogetapps"), Sessions([])).stdout.splitlines()[1:-1], [])

    def test_python_x2gos_exec_line_goes_to_the_named_session(self):
        published = view(session_type="unix-published", rootless=True, id="CD" * 16, display=1004)
        api = Sessions([view(), published])
        name = names.session_name(published)
        run(python_x2go(f"export DISPLAY=:1004 && export X2GO_SESSION={name} && export PULSE_CLIENTCONFIG=/home/alice/"
                        f'.x2go/C-{name}/.pulse-client.conf && setsid xterm -title "Published a b"  1>/dev/null '
                        "2>/dev/null & exit"), api)
        self.assertEqual(api.calls, [("launch", "CD" * 16, ("xterm", "-title", "Published a b"))])

    def test_what_is_not_a_launch_stays_refused(self):
        for command in ("setsid xterm > /tmp/x", "xterm & exit", "setsid xterm | id", "setsid bash -c id; id"):
            self.assertRaises(shell.Refused, read, python_x2go(command))
