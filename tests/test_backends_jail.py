"""Unit tests of nxgate.node.agents.jail: who is jailed, and bubblewrap's command line."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node.agents import jail
from nxgate.config import JailSection


class AppliesTests(SynchronousTestCase):
    def test_off_unless_enabled(self):
        self.assertFalse(jail.applies(JailSection(), "unix-xfce", ["users"], shadow=False))
        self.assertTrue(jail.applies(JailSection(enabled=True), "unix-xfce", ["users"], shadow=False))

    def test_groups_and_types_narrow_it(self):
        settings = JailSection(enabled=True, groups=("students",), types=("unix-xfce", "unix-application"))
        self.assertTrue(jail.applies(settings, "unix-xfce", ["users", "students"], shadow=False))
        self.assertFalse(jail.applies(settings, "unix-xfce", ["users", "staff"], shadow=False))
        self.assertFalse(jail.applies(settings, "unix-console", ["students"], shadow=False))

    def test_shadows_and_remote_desktops_are_never_jailed(self):
        settings = JailSection(enabled=True)
        self.assertFalse(jail.applies(settings, "unix-xfce", [], shadow=True))
        self.assertFalse(jail.applies(settings, "windows", [], shadow=False))
        self.assertFalse(jail.applies(settings, "vnc", [], shadow=False))


class ArgvTests(SynchronousTestCase):
    def argv(self) -> list[str]:
        return jail.bwrap_argv("/usr/bin/bwrap", uid=1001, gid=1002, home="/home/alice",
                               session_dir="/var/lib/nxgate/sessions/ABC", runtime_dir="/run/user/1001",
                               command=["nxagent", ":5"])

    def pairs(self, option: str) -> list[tuple[str, ...]]:
        argv = self.argv()
        width = 1 if option == "--tmpfs" else 2
        return [tuple(argv[i + 1:i + 1 + width]) for i, arg in enumerate(argv[:argv.index("--")]) if arg == option]

    def test_new_pid_and_ipc_namespaces_and_the_system_read_only(self):
        argv = self.argv()
        self.assertEqual(argv[:5], ["/usr/bin/bwrap", "--unshare-pid", "--unshare-ipc", "--ro-bind", "/"])
        self.assertNotIn("--unshare-net", argv)  # unencrypted sessions and programs need the network
        # A fresh /proc of the new PID namespace and a fresh /dev.
        self.assertEqual(argv[argv.index("--proc") + 1], "/proc")
        self.assertEqual(argv[argv.index("--dev") + 1], "/dev")

    def test_private_temp_home_and_sessions(self):
        self.assertEqual(self.pairs("--tmpfs"), [("/tmp",), ("/var/tmp",), ("/home",), ("/var/lib/nxgate/sessions",)])
        self.assertEqual(self.pairs("--bind"), [("/var/lib/nxgate/sessions/ABC", "/var/lib/nxgate/sessions/ABC"),
                                                ("/home/alice", "/home/alice")])
        self.assertEqual(self.pairs("--bind-try"), [("/run/user/1001", "/run/user/1001")])
        argv = self.argv()
        # Shared temp dirs are sticky and world-writable, as on the host.
        self.assertEqual(argv[argv.index("/tmp") - 3:argv.index("/tmp")], ["--perms", "1777", "--tmpfs"])

    def test_the_user_is_set_inside_without_new_privileges(self):
        argv = self.argv()
        self.assertEqual(argv[argv.index("--") + 1:], ["setpriv", "--reuid=1001", "--regid=1002", "--init-groups",
                                                      "--no-new-privs", "--", "nxagent", ":5"])

    def test_agents_have_no_abstract_x_socket(self):
        from nxgate.node import displays

        self.assertEqual(displays.AGENT_OPTIONS, ("-nolisten", "local"))

