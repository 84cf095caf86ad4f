"""Config loading: every problem at once, with its line; defaults documented."""

import os
import re

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

    def test_commented_values_in_shipped_config_are_the_built_in_defaults(self):
        """``#option = value`` in conf/nxgate.conf claims "this is the default":
        uncommenting all of them must give exactly the built-in config.
        Examples (the [limits] and [target NAME] sections) are not defaults."""
        lines, section = [], None
        with open(os.path.join(REPO, "conf", "nxgate.conf")) as handle:
            for raw in handle:
                line = raw.strip()
                if line.startswith("[") or line.startswith("#["):
                    section = line.lstrip("#").strip("[]")
                    example = section == "limits" or section.startswith("target ")
                    if not example:
                        lines.append(f"[{section}]")
                elif re.fullmatch(r"#[a-z0-9_-]+ = ?.*", line) and not example:
                    lines.append(line[1:])
        built_in = config.load(None)
        shown = config.load(self.write("\n".join(lines) + "\n"))
        for section in ("server", "ssh", "auth", "shell", "sessions", "shadow", "remote", "metrics", "types"):
            self.assertEqual(getattr(shown, section), getattr(built_in, section), section)

    def test_command_line_overrides_survive_a_reload(self):
        """``twistd nxgate --port``: reloading the unchanged file needs no restart."""
        path = self.write("[server]\nlisten = tcp:4022\n[auth]\nfailed_login_delay = 1\n")
        running = config.with_overrides(config.load(path), listen="tcp:4122", state_dir=None)
        self.assertEqual(running.server.listen, "tcp:4122")
        self.assertEqual(config.restart_needed(running, config.load(path)), [])
        with open(path, "w") as handle:
            handle.write("[server]\nlisten = tcp:4023\nstate_dir = /elsewhere\n[auth]\npam_threads = 2\n")
        # The file's listen is still overridden; what else changed is reported.
        self.assertEqual(config.restart_needed(running, config.load(path)), ["[server] state_dir", "[auth] pam_threads"])

    def test_listen_in_words(self):
        """The start-up log says plainly whether the network can reach it."""
        self.assertEqual(config.describe_listen("tcp:4022:backlog=1024"), "all interfaces, port 4022")
        self.assertEqual(config.describe_listen("tcp:4122:interface=127.0.0.1"), "127.0.0.1 only (this machine), port 4122")
        self.assertEqual(config.describe_listen("tcp:port=4022:interface=10.0.0.5"), "10.0.0.5, port 4022")
        self.assertEqual(config.describe_listen("tcp6:4022:interface=\\:\\:"), "all interfaces (IPv6 and IPv4), port 4022")
        self.assertEqual(config.describe_listen("unix:/run/x.sock"), "unix:/run/x.sock")

    def test_values_are_converted_and_paths_resolved(self):
        path = self.write("[server]\nlisten = tcp:5000\nstate_dir = state\n[auth]\ndeny_users = root, nx  admin\n"
                          "failed_login_delay = 0.5\n[ssh]\nuser_logins = no\n")
        c = config.load(path)
        self.assertEqual(c.server.listen, "tcp:5000")
        self.assertEqual(c.server.state_dir, os.path.join(os.path.dirname(os.path.abspath(path)), "state"))
        self.assertEqual(c.auth.deny_users, ("root", "nx", "admin"))
        self.assertEqual(c.auth.failed_login_delay, 0.5)
        self.assertFalse(c.ssh.user_logins)

    def test_inline_comments_after_whitespace_are_not_part_of_the_value(self):
        """As the README and issue 13 write them; a ';' or '#' inside a value
        (a password in a URL) stays."""
        path = self.write("[server]\nlisten = tcp:5000   ; the NX port\nserver_name = nx.example\t# shown to clients\n"
                          "[store]\nurl = postgresql://nxgate:pa;ss#1@db.example:5432/nxgate ; shared\n"
                          "password_file = ;\n[auth]\nfailed_login_delay = 0.5#not a comment\n")
        error = self.assertRaises(config.ConfigError, config.load, path)  # 0.5#not... is no number
        self.assertEqual(len(error.problems), 1, error.problems)
        self.assertIn("failed_login_delay", error.problems[0])
        c = config.load(self.write(open(path).read().replace("0.5#not a comment", "0.5 # a comment")))
        self.assertEqual(c.server.listen, "tcp:5000")
        self.assertEqual(c.server.server_name, "nx.example")
        self.assertEqual(c.store.url, "postgresql://nxgate:pa;ss#1@db.example:5432/nxgate")
        self.assertEqual(c.store.password_file, "")
        self.assertEqual(c.auth.failed_login_delay, 0.5)
        self.assertEqual(config.strip_comment(" a;b#c  ;  d"), "a;b#c")

    def test_session_type_commands_are_read_whole(self):
        """A '#' or ';' in a command line is an argument (a colour, a
        pattern), not a comment."""
        c = config.load(self.write("[types]\nunix-red = xterm -bg #ff0000 -title a ; b\n"))
        self.assertEqual(c.types["unix-red"], ("xterm", "-bg", "#ff0000", "-title", "a", ";", "b"))

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


class ServerNameTests(SynchronousTestCase):
    """server_name is read on the reactor thread at every session start;
    the FQDN look-up (which may ask DNS) happens once, when the config is made."""

    def setUp(self):
        self.lookups = []

        def getfqdn(name=""):
            self.lookups.append(name)
            return "Host.Example.ORG"

        self.patch(config.socket, "getfqdn", getfqdn)

    def write(self, text):
        path = self.mktemp()
        with open(path, "w") as handle:
            handle.write(text)
        return path

    def test_the_fqdn_is_looked_up_once_at_load(self):
        loaded = config.load(self.write("[server]\nlisten = tcp:4022\n"))
        self.assertEqual(len(self.lookups), 1)
        for _ in range(3):
            self.assertEqual(loaded.server_name, "host.example.org")
        overridden = config.with_overrides(loaded, listen="tcp:5022")
        self.assertEqual(overridden.server_name, "host.example.org")
        self.assertEqual(len(self.lookups), 1)

    def test_a_configured_name_needs_no_lookup(self):
        loaded = config.load(self.write("[server]\nserver_name = nx.example.org\n"))
        self.assertEqual(loaded.server_name, "nx.example.org")
        self.assertEqual(config.with_overrides(loaded, listen="tcp:5022").server_name, "nx.example.org")
        self.assertEqual(self.lookups, [])

    def test_a_reload_looks_it_up_again(self):
        path = self.write("[sessions]\n")
        config.load(path)
        config.load(path)
        self.assertEqual(len(self.lookups), 2)

    def test_the_resolved_name_does_not_count_as_a_setting(self):
        self.assertEqual(config.Config(), config.Config(host_name="elsewhere"))
        self.assertNotIn("host_name", config.describe())
