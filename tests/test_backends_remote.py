"""RDP/VNC requests: addresses as clients send them, targets, policy, viewer commands."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node.agents import remote_desktop as remote
from nxgate.config import Config, RemoteSection, TargetSection
from nxgate.protocols.nx.dispatch import as_nx
from nxgate.protocols.nx.params import parse_params
from nxgate.protocols.nx.requests import remote_request
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.requests import DisplaySettings

OPEN = Config(remote=RemoteSection(allow_any_host=True))
TARGETS = Config(targets={
    "office": TargetSection(protocol="rdp", host="10.1.2.3", engine="freerdp", security="nla",
                            user="svc", password="fixed-secret"),
    "lab": TargetSection(protocol="vnc", host="lab.example", port=5901),
})


class AddressTests(SynchronousTestCase):
    def test_vnc_forms(self):
        self.assertEqual(remote.parse_server("vnc", "host"), ("host", 5900))
        self.assertEqual(remote.parse_server("vnc", "host:1"), ("host", 5901))  # display 1
        self.assertEqual(remote.parse_server("vnc", "host::5999"), ("host", 5999))
        self.assertEqual(remote.parse_server("vnc", "10.0.0.1:5905"), ("10.0.0.1", 5905))
        self.assertEqual(remote.parse_server("vnc", "[::1]:2"), ("::1", 2))

    def test_rdp_forms(self):
        self.assertEqual(remote.parse_server("rdp", "win.example"), ("win.example", 3389))
        self.assertEqual(remote.parse_server("rdp", "win.example:3390"), ("win.example", 3390))
        self.assertEqual(remote.parse_server("rdp", "fe80::1"), ("fe80::1", 3389))

    def test_bad_addresses(self):
        for text in ("host:x", "bad host", "host:70000", "-host", "a;b", "host::"):
            error = self.assertRaises(SessionError, remote.parse_server, "vnc", text)
            self.assertEqual(error.kind, ErrorKind.INVALID_REQUEST)


class RequestTests(SynchronousTestCase):
    def request(self, config, text, session_type="windows"):
        return remote.remote_desktop(session_type, remote_request(parse_params(text)), config)

    def test_any_host_when_allowed(self):
        desktop = self.request(OPEN, '--agent_server="win:3390" --agent_user="bob" --agent_password="p w"'
                                     ' --agent_domain="CORP"')
        self.assertEqual((desktop.protocol, desktop.host, desktop.port, desktop.engine), ("rdp", "win", 3390, "rdpy"))
        self.assertEqual((desktop.user, desktop.domain, desktop.password), ("bob", "CORP", "p w"))
        self.assertNotIn("p w", repr(desktop))

    def test_opennx_escaped_vnc_display(self):
        desktop = self.request(OPEN, '--agent_server="host%3A2" --agent_password="x"', "vnc")
        self.assertEqual((desktop.host, desktop.port, desktop.engine), ("host", 5902, "vnc"))

    def test_only_targets_by_default(self):
        error = self.assertRaises(SessionError, self.request, TARGETS, '--agent_server="evil.example"')
        self.assertEqual(error.kind, ErrorKind.NOT_ALLOWED)
        self.assertEqual(as_nx(error).lines()[0], "NX> 596 Error: 'evil.example' is not a remote desktop this server"
                                                  " serves. Available: lab (vnc), office (rdp).")

    def test_target_with_fixed_credentials(self):
        desktop = self.request(TARGETS, '--agent_server="Office" --agent_user="me" --agent_password="mine"')
        self.assertEqual((desktop.host, desktop.port, desktop.engine, desktop.security),
                         ("10.1.2.3", 3389, "freerdp", "nla"))
        self.assertEqual((desktop.user, desktop.password, desktop.target), ("svc", "fixed-secret", "office"))

    def test_target_of_the_other_protocol(self):
        self.assertIn("is a VNC desktop", self.assertRaises(SessionError, self.request, TARGETS,
                                                             '--agent_server="lab"').message)

    def test_empty_server_and_control_characters(self):
        for params in ('--agent_server=""', '--agent_server="h" --agent_user="a%0Ab"', ""):
            error = self.assertRaises(SessionError, self.request, OPEN, params)
            self.assertEqual(error.kind, ErrorKind.INVALID_REQUEST)

    def test_disabled(self):
        config = Config(remote=RemoteSection(enabled=False, allow_any_host=True))
        self.assertIn("not available", self.assertRaises(SessionError, self.request, config, '--agent_server="h"').message)


class ViewerCommandTests(SynchronousTestCase):
    display = DisplaySettings(geometry="1280x800", keyboard="pc105/de")

    def test_python_engines_report_and_keep_secrets_off_argv(self):
        desktop = remote.RemoteDesktop("rdp", "win", 3389, "rdpy", "tls", "bob", "CORP", "s3cret")
        command = remote.viewer_command(desktop, self.display, OPEN, "/venv/bin/python")
        self.assertEqual(command.argv[:3], ("/venv/bin/python", "-m", "nxgate.clients.engines.rdp"))
        self.assertIn("--password-stdin", command.argv)
        self.assertEqual(command.argv[command.argv.index("--geometry") + 1], "1280x800")
        self.assertEqual(command.argv[command.argv.index("--keyboard") + 1], "pc105/de")
        self.assertNotIn("s3cret", " ".join(command.argv))
        self.assertEqual(command.stdin, "s3cret\n")
        self.assertTrue(command.reports_status)

    def test_native_engines(self):
        rdp = remote.viewer_command(remote.RemoteDesktop("rdp", "win", 3390, "freerdp", "nla", "bob", "CORP", "pw"),
                                    self.display, OPEN, "python")
        self.assertEqual(rdp.argv[:4], ("xfreerdp", "/v:win:3390", "/cert:ignore", "/sec:nla"))
        self.assertIn("/kbd:0x00000407", rdp.argv)
        self.assertIn("/u:bob", rdp.argv)
        self.assertIn("/d:CORP", rdp.argv)
        self.assertEqual(rdp.stdin, "pw\n")
        self.assertFalse(rdp.reports_status)
        vnc = remote.viewer_command(remote.RemoteDesktop("vnc", "h", 5901, "tightvnc", password="pw"),
                                    self.display, OPEN, "python")
        self.assertEqual(vnc.argv[-1], "h::5901")
        self.assertNotIn("pw", vnc.argv)

    def test_failures_become_nx_errors(self):
        desktop = remote.RemoteDesktop("vnc", "h", 5901, "vnc")
        self.assertIsNone(remote.viewer_failure(desktop, "ready 1024x768"))
        error = remote.viewer_failure(desktop, "error auth: wrong password")
        self.assertEqual(error.kind, ErrorKind.REMOTE_FAILED)
        self.assertEqual(as_nx(error).lines(), ["NX> 596 Error: The remote desktop h:5901 refused the login: wrong password",
                                         "NX> 500 ERROR: Last operation failed."])
        self.assertIn("did not answer in time", remote.viewer_failure(desktop, "error timeout: 15 s").message)

    def test_missing_engine_library(self):
        desktop = remote.RemoteDesktop("vnc", "h", 5901, "vnc")
        self.assertIsNone(remote.missing_engine(desktop))  # vncdotool is installed here
        self.patch(remote, "ENGINE_LIBRARIES", {"vnc": "no_such_module_nxgate"})
        self.assertIn("use the tightvnc engine", remote.missing_engine(desktop))
        self.assertIsNone(remote.missing_engine(remote.RemoteDesktop("vnc", "h", 5901, "tightvnc")))

    def test_keyboard_layouts(self):
        self.assertEqual(remote.keyboard_layout("pc105/de"), 0x407)
        self.assertEqual(remote.keyboard_layout("pc102/gb"), 0x809)
        self.assertEqual(remote.keyboard_layout("pc105/de(nodeadkeys)"), 0x407)
        self.assertEqual(remote.keyboard_layout("query"), 0x409)
