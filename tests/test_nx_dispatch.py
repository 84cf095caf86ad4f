"""The NX dispatcher: what a client sees for each answer of the session
service.  One row per place in the session layer that refuses or fails,
with the exact wire lines clients have always been sent for it."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.node.agents import remote_desktop as remote
from nxgate.config import Config, RemoteSection, SessionsSection, TargetSection
from nxgate.protocols.nx.dispatch import NXDispatcher, as_nx
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import parse_params
from nxgate.protocols.nx.requests import remote_request
from nxgate.vocabulary.model import State
from nxgate.node.programs import session_command
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.requests import DisplaySettings, StartRequest
from nxgate.vocabulary.results import Listing, Progress, Ready, SessionView, ShadowTarget, StreamTarget
from tests.harness.fakes import FakeSessionAPI

ID = "0123456789ABCDEF0123456789ABCDEF"
LAST = "NX> 500 ERROR: Last operation failed."
CALLER = Caller("alice", 1000, 1000, frozenset({"staff"}), "192.0.2.1", local_address="198.51.100.7")


def raised(call) -> SessionError:
    try:
        call()
    except SessionError as error:
        return error
    raise AssertionError("no SessionError")


def view(**changes) -> SessionView:
    values = dict(id=ID, full_id=f"gw-1001-{ID}", user="alice", type="unix-console", name="desk", display=1001,
                  state=State.RUNNING, geometry="1024x768", depth=24, render=True, fullscreen=False, rootless=False,
                  encrypted=True, client_address="192.0.2.1", created=0.0, changed=0.0, attached_before=True,
                  agent_pid=42, failure="")
    values.update(changes)
    return SessionView(**values)


def _remote_site(config: Config, params: str, session_type: str = "windows"):
    return lambda: remote.remote_desktop(session_type, remote_request(parse_params(params)), config)


OPEN = Config(remote=RemoteSection(allow_any_host=True))
TARGETS = Config(targets={"lab": TargetSection(protocol="vnc", host="10.0.0.9")})
TYPES = {"unix-console": ("true",), "unix-kde": ("no-such-program-nxgate",)}
SETTINGS = SessionsSection()


def _start(session_type: str, application: tuple[str, ...] = ()):
    request = StartRequest(session_type, "x", DisplaySettings(), True, False, application)
    return lambda: session_command(request, TYPES, SETTINGS)


#: (site, the SessionError it raises, the NX line the client gets before "Last operation failed").
#: Sites that are pure functions are called for real; the manager's and the
#: shadow service's are built as they build them (their own tests check them
#: end to end through the dispatcher).
SITES = [
    ("manager.start/restore: unencrypted", SessionError(Kind.ENCRYPTION_REQUIRED, "Unencrypted sessions are not allowed."),
     "NX> 596 Unencrypted sessions are not allowed."),
    ("manager.launch: store full", SessionError(Kind.STORAGE_FULL, "Session startup failed: the server's storage is full."),
     "NX> 596 Error: Session startup failed: the server's storage is full."),
    ("manager.launch: store unusable", SessionError(Kind.UNAVAILABLE, "Session startup failed: the server's session store"
                                                    " is damaged."),
     "NX> 596 Error: Session startup failed: the server's session store is damaged."),
    ("manager.launch: agent failed", SessionError(Kind.FAILED_TO_START, "Session startup failed: nxagent ended"),
     "NX> 596 Error: Session startup failed: nxagent ended"),
    ("manager.launch: viewer status", remote.viewer_failure(remote.RemoteDesktop("vnc", "h", 5901, "vnc"),
                                                            "error auth: wrong password"),
     "NX> 596 Error: The remote desktop h:5901 refused the login: wrong password"),
    ("manager.launch: bug", SessionError(Kind.INTERNAL, "Session startup failed: internal error (see the server log)."),
     "NX> 596 Error: Session startup failed: internal error (see the server log)."),
    ("manager.restore: bad state", SessionError(Kind.WRONG_STATE, f"Session {ID} cannot be resumed while it is starting."),
     f"NX> 596 Error: Session {ID} cannot be resumed while it is starting."),
    ("manager.restore: ended", SessionError(Kind.FAILED_TO_RESUME, "Session resume failed: the session ended"),
     "NX> 596 Error: Session resume failed: the session ended"),
    ("manager.suspend_session: timeout", SessionError(Kind.FAILED_TO_SUSPEND, "Session suspend failed: timed out"),
     "NX> 596 Error: Session suspend failed: timed out"),
    ("manager.suspend_session: bad state", SessionError(Kind.WRONG_STATE, f"Session {ID} is starting."),
     f"NX> 596 Error: Session {ID} is starting."),
    ("manager._owned: none", SessionError(Kind.NOT_FOUND, f"Could not find session {ID}."),
     f"NX> 596 Error: Could not find session {ID}."),
    ("manager._owned: someone else's", SessionError(Kind.NOT_YOURS, f"Could not find session {ID}."),
     f"NX> 596 Error: Could not find session {ID}."),
    ("manager._check_capacity: draining", SessionError(
        Kind.LIMIT_REACHED, "This server takes no new sessions at the moment (maintenance)."),
     "NX> 599 This server takes no new sessions at the moment (maintenance)."),
    ("manager._check_capacity: max_sessions", SessionError(
        Kind.LIMIT_REACHED, "Reached the maximum number of concurrent sessions on this server."),
     "NX> 599 Reached the maximum number of concurrent sessions on this server."),
    ("manager._check_capacity: per user", SessionError(Kind.LIMIT_REACHED, "Server capacity: reached for user: alice"),
     "NX> 599 Server capacity: reached for user: alice"),
    ("manager._allocate_display", SessionError(Kind.FAILED_TO_START, "Display limit exceeded: no free display for a"
                                               " new session."),
     "NX> 596 Error: Display limit exceeded: no free display for a new session."),
    ("manager._own_listener", SessionError(Kind.FAILED_TO_START, "Session startup failed: its port is in use by"
                                           " another process."),
     "NX> 596 Error: Session startup failed: its port is in use by another process."),
    ("programs: application", raised(_start("unix-application", ("no-such-program-nxgate",))),
     "NX> 596 Error: Application 'no-such-program-nxgate' is not installed on this server."),
    ("programs: unknown type", raised(_start("unix-gnome")),
     "NX> 596 Error: Session type 'unix-gnome' is not supported. Available types: unix-application, unix-console."),
    ("programs: not installed", raised(_start("unix-kde")),
     "NX> 596 Error: Session type 'unix-kde' is not available on this server: no-such-program-nxgate is not installed."
     " Available types: unix-application, unix-console."),
    ("remote.parse_server", raised(lambda: remote.parse_server("vnc", "host:x")),
     "NX> 596 Error: Invalid remote desktop address 'host:x'."),
    ("remote._field", raised(_remote_site(OPEN, '--agent_server="h" --agent_user="a%0Ab"')),
     "NX> 596 Error: Invalid value for parameter 'agent_user'."),
    ("remote_desktop: disabled", raised(_remote_site(Config(remote=RemoteSection(enabled=False)), '--agent_server="h"')),
     "NX> 596 Error: Session type 'windows' is not available on this server."),
    ("remote_desktop: empty server", raised(_remote_site(OPEN, '--agent_server=""')),
     "NX> 596 Error: No remote desktop given (agent_server is empty)."),
    ("remote_desktop: wrong protocol", raised(_remote_site(TARGETS, '--agent_server="lab"')),
     "NX> 596 Error: 'lab' is a VNC desktop, not RDP."),
    ("remote_desktop: not a target", raised(_remote_site(TARGETS, '--agent_server="evil"')),
     "NX> 596 Error: 'evil' is not a remote desktop this server serves. Available: lab (vnc)."),
    ("remote._from_target: engine", raised(_remote_site(
        Config(targets={"lab": TargetSection(protocol="vnc", host="h", engine="freerdp")}), '--agent_server="lab"',
        "vnc")),
     "NX> 596 Error: Target 'lab' has engine freerdp, which does not speak VNC."),
    ("session/remote: missing engine", SessionError(Kind.UNAVAILABLE, "The vnc engine is not installed on this server"
                                                    " (vncdotool is missing); the admin can install it or use the"
                                                    " tightvnc engine."),
     "NX> 596 Error: The vnc engine is not installed on this server (vncdotool is missing); the admin can install it"
     " or use the tightvnc engine."),
    ("session/remote: unreachable", SessionError(Kind.REMOTE_FAILED, "Cannot connect to the remote desktop lab:"
                                                 " connection refused."),
     "NX> 596 Error: Cannot connect to the remote desktop lab: connection refused."),
    ("shadow.attach: no target", SessionError(Kind.NOT_FOUND, f"Could not find shadowed session {ID}. Session failed."),
     f"NX> 596 Error: Could not find shadowed session {ID}. Session failed."),
    ("shadow.attach: refused", SessionError(Kind.REFUSED_BY_OWNER, "Authorization refused by user: bob."),
     "NX> 596 Error: Authorization refused by user: bob."),
    ("shadow.attach: no answer", SessionError(Kind.REFUSED_BY_OWNER, "Authorization refused by user: bob. (no answer"
                                              " within 30 seconds)"),
     "NX> 596 Error: Authorization refused by user: bob. (no answer within 30 seconds)"),
]


def answering(answer) -> FakeSessionAPI:
    """The session API answering ``answer`` (or raising it) to every call;
    a shadow's attach tells the caller the owner is asked first."""

    def attach_shadow(caller, request, progress):
        progress(Progress.ASKING_OWNER)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return FakeSessionAPI(default=answer, attach_shadow=attach_shadow)


class DispatchTests(SynchronousTestCase):
    def run_command(self, answer, command, params="", progress=None):
        service = answering(answer)
        d = defer.ensureDeferred(NXDispatcher(service).execute(
            CALLER, command, parse_params(params), progress or (lambda line: None)))
        return service, d

    def test_every_site_of_the_session_layer(self):
        for site, error, line in SITES:
            with self.subTest(site=site):
                self.assertIsInstance(error, SessionError, site)
                _, d = self.run_command(error, "startsession", '--type="unix-console"')
                nx_error = self.failureResultOf(d, NXError).value
                self.assertEqual(nx_error.lines(), [line, LAST], site)
                self.assertEqual(as_nx(error).lines(), [line, LAST], site)

    def test_started_and_resumed_sessions(self):
        stream = StreamTarget(ID, "/state/sessions/x/agent.sock", 1000)
        _, d = self.run_command(Ready(view(), "c00kie", False, stream), "startsession", '--type="unix-console"')
        reply = self.successResultOf(d)
        self.assertEqual(reply.lines, (
            f"NX> 700 Session id: gw-1001-{ID}", "NX> 705 Session display: 1001", "NX> 703 Session type: unix-console",
            "NX> 701 Proxy cookie: c00kie", "NX> 702 Proxy IP: 127.0.0.1", "NX> 706 Agent cookie: c00kie",
            "NX> 704 Session cache: unix-console", "NX> 707 SSL tunneling: 1", "NX> 1009 Session status: starting",
            "NX> 710 Session status: running", "NX> 1002 Commit", "NX> 1006 Session status: running"))
        self.assertEqual(reply.relay, stream)
        service, d = self.run_command(Ready(view(encrypted=False), "c00kie", True, None), "restoresession",
                                      f'--id="{ID}" --encryption="0"')
        reply = self.successResultOf(d)
        self.assertIn("NX> 702 Proxy IP: 198.51.100.7", reply.lines)  # where the caller reached us
        self.assertIn("NX> 707 SSL tunneling: 0", reply.lines)
        self.assertIn("NX> 1009 Session status: resuming", reply.lines)
        self.assertIsNone(reply.relay)
        self.assertEqual(service.received[0][2].session_id, ID)
        self.assertFalse(service.received[0][2].encrypted)

    def test_suspend_and_terminate(self):
        _, d = self.run_command(view(state=State.SUSPENDED), "suspend", f'--sessionid="{ID}"')
        self.assertEqual(self.successResultOf(d).lines, (f"NX> 716 Suspending session {ID} on user request.",))
        _, d = self.run_command(view(state=State.TERMINATED), "terminate", f'--sessionid="{ID}"')
        self.assertEqual(self.successResultOf(d).lines, (f"NX> 716 Terminating session {ID} on user request.",
                                                         f"NX> 900 Session id: {ID} terminated."))

    def test_listing_filters_and_capacity(self):
        other = "F" * 32
        listing = Listing((view(), view(id=other, state=State.SUSPENDED, type="unix-kde"),
                           view(id="E" * 32, state=State.CREATED)), capacity_reached=True)
        _, d = self.run_command(listing, "listsession")
        lines = self.successResultOf(d).lines
        self.assertEqual(lines[0], "NX> 127 Session list of user 'alice':")
        self.assertIn(ID, lines[3])
        self.assertIn(other, lines[4])
        self.assertEqual(lines[5:], ("", "NX> 147 Server capacity: reached for user: alice"))
        _, d = self.run_command(listing, "listsession", '--status="suspended"')
        self.assertNotIn(ID, "\n".join(self.successResultOf(d).lines))
        _, d = self.run_command(Listing((view(),), False), "listsession", '--type="unix-kde"')
        lines = self.successResultOf(d).lines
        self.assertNotIn(ID, "\n".join(lines))
        self.assertEqual(lines[-1], "NX> 148 Server capacity: not reached for user: alice")

    def test_shadow_list_and_the_owner_asked(self):
        targets = (ShadowTarget(ID, "bob", 1001, "desk", "unix-kde"),)
        _, d = self.run_command(targets, "listsession", '--type="shadow"')
        lines = self.successResultOf(d).lines
        self.assertEqual(lines[0], "NX> 127 Session list of user 'alice':")
        self.assertTrue(lines[3].startswith(f"1001    unix-kde         {ID} -RD--PSA    24 800x600        Running"))
        self.assertTrue(lines[3].endswith("desk bob"))
        self.assertEqual(lines[-1], "")  # no 147/148 line
        said = []
        _, d = self.run_command(SessionError(Kind.REFUSED_BY_OWNER, "Authorization refused by user: bob."),
                                "attachsession", f'--id="{ID}"', said.append)
        self.assertEqual(said, ["NX> 726 Asking user for authorization to attach to session"])
        self.assertEqual(self.failureResultOf(d, NXError).value.text, "Error: Authorization refused by user: bob.")

    def test_parse_errors_and_unknown_commands_stay_nx(self):
        service, d = self.run_command(None, "startsession", "")
        self.assertEqual(self.failureResultOf(d, NXError).value.lines(), ["NX> 500 Error: Session type missing.", LAST])
        self.assertEqual(service.received, [])
        _, d = self.run_command(None, "restoresession", '--id="nope"')
        self.assertEqual(self.failureResultOf(d, NXError).value.code, 597)
        _, d = self.run_command(None, "addkey")
        self.assertEqual(self.failureResultOf(d, NXError).value.lines(),
                         ["NX> 500 ERROR: addkey is not available on this server", LAST])

    def test_remote_values_reach_the_service_raw(self):
        service, d = self.run_command(SessionError(Kind.REMOTE_FAILED, "x"), "startsession",
                                      '--type="vnc" --agent_server="lab" --agent_password="s3cret"')
        self.failureResultOf(d, NXError)
        request = service.received[0][2]
        self.assertEqual((request.remote.server, request.remote.password), ("lab", "s3cret"))
        self.assertNotIn("s3cret", repr(request))
