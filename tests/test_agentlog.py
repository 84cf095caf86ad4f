"""nxagent log lines as events, with the exact lines nxagent 3.5.99.26 prints."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node.agents.agentlog import AgentEvent, LineSplitter, parse_line

# Lines as measured on this system (nxagent-recipe.md and a real log).
LINES = {
    "Session: Starting session at 'Thu Dec  3 10:50:25 2026'.": AgentEvent.STARTING,
    "Info: Waiting for connection from '127.0.0.1' on socket 'tcp:*:4150'.": AgentEvent.WAITING,
    "Info: Waiting for connection from '127.0.0.1' on port '4150'.": AgentEvent.WAITING,
    "Info: Waiting for connection from this host on socket 'unix:/var/lib/nxgate/sessions/A/agent.sock'.": AgentEvent.WAITING,
    "Session: Session started at 'Thu Dec  3 10:50:26 2026'.": AgentEvent.RUNNING,
    "Session: Session resumed at 'Thu Dec  3 10:50:26 2026'.": AgentEvent.RUNNING,
    "Session: Display failure detected at 'Thu Dec  3 10:50:26 2026'.": AgentEvent.DISPLAY_FAILURE,
    "Session: Suspending session at 'Thu Dec  3 10:50:26 2026'.": AgentEvent.SUSPENDING,
    "Session: Session suspended at 'Thu Dec  3 10:50:26 2026'.": AgentEvent.SUSPENDED,
    "Session: Resuming session at 'Thu Dec  3 10:50:26 2026'.": AgentEvent.RESUMING,
    "Session: Terminating session at 'Thu Dec  3 10:50:28 2026'.": AgentEvent.TERMINATING,
    "Session: Session terminated at 'Thu Dec  3 10:50:29 2026'.": AgentEvent.TERMINATED,
    "Session: Aborting session at 'Thu Dec  3 10:52:46 2026'.": AgentEvent.ABORTING,
    "Session: Session aborted at 'Thu Dec  3 10:52:46 2026'.": AgentEvent.ABORTED,
    "Info: Waiting the watchdog process to complete.": AgentEvent.WATCHDOG_WAIT,
}


class ParseTests(SynchronousTestCase):
    def test_state_lines(self):
        for line, event in LINES.items():
            self.assertEqual(parse_line(line).event, event, line)

    def test_other_lines_are_ignored(self):
        for line in ("Info: Agent running with pid '8309'.", "NXAGENT - Version 3.5.99.26", "",
                     "  close_session         : Ctrl+Alt+t", "Warning: Cannot read keystroke file 'x'."):
            self.assertIsNone(parse_line(line))

    def test_screen_size_lines(self):
        # As nxagent 3.5.99.26 prints them at start, resume and window resizes.
        event = parse_line("Info: Screen [0] resized to geometry [1024x768] fullscreen [0].")
        self.assertEqual((event.event, event.text, event.fullscreen), (AgentEvent.SCREEN, "1024x768", False))
        event = parse_line("Info: Screen [0] resized to geometry [1280x800] fullscreen [1].")
        self.assertEqual((event.event, event.text, event.fullscreen), (AgentEvent.SCREEN, "1280x800", True))
        self.assertIsNone(parse_line("Info: Screen [0] resized to geometry [1280x800,x=1] fullscreen [1]."))

    def test_errors_keep_their_text(self):
        event = parse_line("Error: Aborting session with 'Unable to open display 'nx/nx,options=/x:151''.")
        self.assertEqual(event.event, AgentEvent.ERROR)
        self.assertEqual(event.text, "Aborting session with 'Unable to open display 'nx/nx,options=/x:151''.")

    def test_cookie_mismatch_never_keeps_cookies(self):
        event = parse_line("Error: Authentication cookie '0123' doesn't match 'abcd'.")
        self.assertEqual(event.event, AgentEvent.COOKIE_MISMATCH)
        self.assertEqual(event.text, "")


class SplitterTests(SynchronousTestCase):
    def test_partial_lines_wait_for_their_end(self):
        splitter = LineSplitter()
        self.assertEqual(splitter.feed(b"Session: Sess"), [])
        self.assertEqual(splitter.feed(b"ion started\nInfo: x\r\nInf"), ["Session: Session started", "Info: x"])
        self.assertEqual(splitter.feed(b"o\n"), ["Info"])

    def test_overlong_line_is_cut(self):
        splitter = LineSplitter(max_line=10)
        self.assertEqual(splitter.feed(b"x" * 25), ["x" * 10])  # the rest is dropped
        self.assertEqual(splitter.feed(b"y\n"), ["y"])

    def test_binary_garbage(self):
        self.assertEqual(LineSplitter().feed(b"\xff\xfe\n"), ["\ufffd\ufffd"])
