"""The session table must satisfy OpenNX's strict row regex (reference §2.4)."""

import re

from twisted.trial.unittest import SynchronousTestCase

from nxgate.protocols.nx.listing import DASHES, HEADER, ListingRow, format_session_list, session_options

OPENNX_ROW = re.compile(
    r"^(\d+)\s+([\w-]+)\s+([0-9A-F]{32})\s+([A-Z-]{8})\s+(\d+)\s+(\d+x\d+)\s+(\w+)\s+(\S.*)$"
)
ID = "0123456789ABCDEF0123456789ABCDEF"


class ListingTests(SynchronousTestCase):
    def row(self, **overrides):
        values = dict(display=1001, session_type="unix-kde", session_id=ID, options="--D--PSA", depth=24,
                      screen="1024x768", status="Suspended", name="my session")
        values.update(overrides)
        return ListingRow(**values)

    def test_empty_list(self):
        self.assertEqual(
            format_session_list("alice", [], capacity_reached=False),
            ["NX> 127 Session list of user 'alice':", HEADER, DASHES, "",
             "NX> 148 Server capacity: not reached for user: alice"],
        )

    def test_capacity_reached(self):
        self.assertEqual(format_session_list("bob", [], capacity_reached=True)[-1],
                         "NX> 147 Server capacity: reached for user: bob")

    def test_columns_line_up_with_header(self):
        row = self.row().row()
        self.assertEqual(row, "1001    unix-kde         " + ID + " --D--PSA    24 1024x768       Suspended   my session")
        columns = [m.start() for m in re.finditer(r"(?<!\S)\S", DASHES)]
        header_words = {m.start() for m in re.finditer(r"(?<!\S)\S", HEADER)}
        self.assertEqual(columns, [0, 8, 25, 58, 67, 73, 88, 100])
        self.assertTrue(set(columns) <= header_words)
        row_fields = [m.start() for m in re.finditer(r"(?<!\S)\S", row)]
        self.assertEqual(row_fields[:4] + row_fields[5:8], columns[:4] + columns[5:8])

    def test_rows_match_opennx(self):
        for name in ("a", "name with  spaces", "tab\there", "x" * 80, ""):
            match = OPENNX_ROW.match(self.row(name=name).row())
            self.assertIsNotNone(match, name)
            self.assertEqual(match.group(3), ID)

    def test_nxcl_split(self):
        fields = self.row(status="Running").row().split()
        self.assertEqual(fields[:8], ["1001", "unix-kde", ID, "--D--PSA", "24", "1024x768", "Running", "my"])

    def test_refuses_bad_values(self):
        self.assertRaises(ValueError, self.row(session_id=ID.lower()).row)
        self.assertRaises(ValueError, self.row(screen="-").row)
        self.assertRaises(ValueError, self.row(options="abc").row)

    def test_options(self):
        self.assertEqual(session_options(fullscreen=True, render=True, virtual_desktop=False), "FR---PSA")
        self.assertEqual(session_options(fullscreen=False, render=False, virtual_desktop=True), "--D--PSA")
