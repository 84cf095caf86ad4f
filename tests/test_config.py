"""Config loading: every problem at once, with its line; defaults documented."""

import os

from twisted.trial.unittest import SynchronousTestCase

from nxgate import config

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class ConfigTests(SynchronousTestCase):
    def write(self, text):
        path = self.mktemp()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
        return path

    def test_defaults(self):
        c = config.load(None)
        self.assertEqual(c.server.listen, "tcp:4022:backlog=1024")
        self.assertEqual(c.ssh.nx_user, "nx")
        self.assertEqual(c.auth.deny_users, ("root",))
        self.assertTrue(c.ssh.user_logins)

    def test_shipped_config_is_valid_and_commented_defaults_match(self):
        path = os.path.join(REPO, "conf", "nxgate.conf")
        c = config.load(path)
        self.assertEqual(c.ssh.nx_authorized_keys, os.path.join(REPO, "conf", "nx_authorized_keys"))
        # Every option of the schema is mentioned in the shipped file.
        text = open(path).read()
        for line in config.describe().splitlines():
            if line.startswith("#") and "=" in line:
                self.assertIn(line.split("=")[0].lstrip("#").strip() + " =", text)

    def test_values_are_converted_and_paths_resolved(self):
        path = self.write("[server]\nlisten = tcp:5000\nstate_dir = state\n[auth]\ndeny_users = root, nx  admin\n"
                          "failed_login_delay = 0.5\n[ssh]\nuser_logins = no\n")
        c = config.load(path)
        self.assertEqual(c.server.listen, "tcp:5000")
        self.assertEqual(c.server.state_dir, os.path.join(os.path.dirname(os.path.abspath(path)), "state"))
        self.assertEqual(c.auth.deny_users, ("root", "nx", "admin"))
        self.assertEqual(c.auth.failed_login_delay, 0.5)
        self.assertFalse(c.ssh.user_logins)

    def test_all_problems_reported_with_lines(self):
        path = self.write("# comment\n[server]\nlisten=\nbogus = 1\n[auth]\nmax_login_attempts = many\n"
                          "max_login_attempts = 2\nlogin_timeout = -1\n[nope]\nx = 1\nnot a line\n")
        error = self.assertRaises(config.ConfigError, config.load, path)
        text = "\n".join(error.problems)
        self.assertIn(f"{path}:3: [server] listen = '': must not be empty", text)
        self.assertIn(f"{path}:4: [server] unknown option 'bogus'", text)
        self.assertIn(f"{path}:6: [auth] max_login_attempts = 'many'", text)
        self.assertIn(f"{path}:7: [auth] max_login_attempts given twice (first on line 6)", text)
        self.assertIn(f"{path}:8: [auth] login_timeout = '-1'", text)
        self.assertIn("unknown section [nope]", text)
        self.assertIn(f"{path}:11: cannot read this line", text)
        self.assertEqual(len(error.problems), 7)

    def test_option_outside_section(self):
        error = self.assertRaises(config.ConfigError, config.load, self.write("listen = tcp:1\n"))
        self.assertIn("outside any [section]", error.problems[0])

    def test_missing_file(self):
        error = self.assertRaises(config.ConfigError, config.load, "/nonexistent/nxgate.conf")
        self.assertIn("cannot read", error.problems[0])

    def test_protocol_version_must_be_3x(self):
        error = self.assertRaises(config.ConfigError, config.load, self.write("[server]\nprotocol_version = 4.0.0\n"))
        self.assertIn("NX 3 protocol version", error.problems[0])

    def test_config_is_frozen(self):
        c = config.load(None)
        self.assertRaises(Exception, setattr, c.server, "listen", "x")
