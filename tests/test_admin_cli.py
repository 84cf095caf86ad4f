"""nxgate-admin's command line: global options before or after the command."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.doors.admin import cli


class ArgumentTests(SynchronousTestCase):
    def test_json_before_or_after_the_command(self):
        for argv in (["--json", "reload"], ["reload", "--json"]):
            args = cli.parse_arguments(argv)
            self.assertEqual((args.command, args.json), ("reload", True), argv)
        self.assertFalse(cli.parse_arguments(["reload"]).json)

    def test_options_after_a_command_with_an_argument(self):
        args = cli.parse_arguments(["--state-dir", "/srv/nx", "show", "0123", "--json", "--socket", "/tmp/a.sock"])
        self.assertEqual((args.command, args.id, args.json, args.socket, args.state_dir),
                         ("show", "0123", True, "/tmp/a.sock", "/srv/nx"))

    def test_defaults(self):
        args = cli.parse_arguments(["status"])
        self.assertEqual((args.socket, args.state_dir, args.json), (None, cli.DEFAULT_STATE_DIR, False))
