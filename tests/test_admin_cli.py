"""nxgate-admin's command line: global options before or after the command."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.doors.admin import cli


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


class RenderTests(SynchronousTestCase):
    """What nxgate-admin prints for people: words, not Python values (issue 25)."""

    STATUS = {"version": "1.0", "node": "gw", "draining": False, "sessions": 2, "unsaved_changes": 0,
              "unknown_sessions": [], "penalized_addresses": [], "failure": None,
              "held_displays": [{"display": 760, "users": ["bob"], "holds": ["X lock /tmp/.X760-lock of pid 7"]}]}

    def test_status_values_are_words_in_one_column(self):
        text = cli.show("status", self.STATUS)
        self.assertEqual(text.splitlines(), [
            "version:              1.0",
            "node:                 gw",
            "draining:             no",
            "sessions:             2",
            "unsaved changes:      0",
            "unknown sessions:     none",
            "penalized addresses:  none",
            "failure:              none",
            "held displays:",
            "  :760 held by bob: X lock /tmp/.X760-lock of pid 7",
        ])

    def test_unknown_agents_are_listed_under_their_label(self):
        text = cli.show("status", {"draining": True, "unknown_sessions": [
            {"id": "AB" * 16, "user": "carol", "display": 705, "pid": 4242}]})
        self.assertEqual(text, f"draining:  yes\nunknown sessions:\n  {'AB' * 16} of carol on :705 (agent pid 4242)")

    def test_tables_show_dashes_for_empty_cells(self):
        text = cli.show("sessions", [{"id": "X", "user": "alice", "client_address": "", "node": None}])
        self.assertEqual(text.splitlines()[1].split(), ["X", "alice", "-", "-", "-", "-", "-", "-"])
        self.assertEqual(cli.show("sessions", []), "no sessions")

    def test_other_answers(self):
        self.assertEqual(cli.show("drain", {"draining": True}), "draining:  yes")
        self.assertEqual(cli.show("reload", {"ok": True, "restart_needed_for": ["listen", "state_dir"]}),
                         "ok:                  yes\nrestart needed for:  listen, state_dir")
