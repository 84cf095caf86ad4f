"""The applications a node publishes to X2Go's published-applications mode (nxgate/node/applications.py),
and x2gogetapps' format (the X2Go door's names.applications_output): the real clients in
tests/test_e2e_x2go_published.py."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.conch.x2go import names
from nxgate.node import applications

XTERM = """[Desktop Entry]
Type=Application
Name=Terminal
Name[de]=Terminal auf Deutsch
Comment=A terminal
Icon=nxgate-test-icon
TryExec=xterm
Exec=xterm -title "Published %U"
Categories=System;TerminalEmulator;
[Desktop Action New]
Exec=rm -rf /
"""


class DesktopFileTests(TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="nxgate-apps-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.makedirs(os.path.join(self.dir, "sub"))
        self.icon = os.path.join(self.dir, "icon.png")
        with open(self.icon, "wb") as handle:
            handle.write(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 20)

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as handle:
            handle.write(text)

    def test_the_lines_x2gogetapps_keeps_and_where_the_icon_goes(self):
        lines, icon = applications.parse_entry(XTERM)
        self.assertEqual(lines, ["Name=Terminal", "Name[de]=Terminal auf Deutsch", "Comment=A terminal", "\0ICON",
                                 'Exec=xterm -title "Published %U"', "Categories=System;TerminalEmulator;"])
        self.assertEqual(icon, "nxgate-test-icon")
        self.assertIsNone(applications.parse_entry(XTERM.replace("Type=Application", "NoDisplay=true")))
        self.assertIsNone(applications.parse_entry("Name=no group"))

    def test_files_of_the_directory_and_its_subdirectories_hidden_ones_left_out(self):
        self.write("xterm.desktop", XTERM.replace("Icon=nxgate-test-icon", f"Icon={self.icon}"))
        self.write("sub/other.desktop", "[Desktop Entry]\nName=Other\nExec=other\n")
        self.write("sub/hidden.desktop", "[Desktop Entry]\nName=Hidden\nHidden=true\nExec=hidden\n")
        self.write("notes.txt", "[Desktop Entry]\nName=Not a desktop file\nExec=x\n")
        entries = applications.read_applications([self.dir, self.dir, "/nonexistent"])
        self.assertEqual([os.path.basename(e.path) for e in entries], ["xterm.desktop", "other.desktop"])
        self.assertEqual(entries[0].icon_at, 3)
        self.assertTrue(entries[0].icon.startswith(b"\x89PNG"))
        self.assertEqual(entries[1].icon_at, -1)

    def test_only_listed_exec_lines_may_start(self):
        self.write("xterm.desktop", XTERM)
        self.write("top.desktop", "[Desktop Entry]\nName=Top\nExec=top\nTerminal=true\n")
        allowed = applications.launchable(applications.read_applications([self.dir]))
        self.assertIn(("xterm", "-title", "Published "), allowed)
        self.assertIn(("top",), allowed)
        self.assertIn(("x-terminal-emulator", "-e", "top"), allowed)
        self.assertNotIn(("rm", "-rf", "/"), allowed)  # another group's Exec
        self.assertNotIn(("xterm",), allowed)

    def test_x2gogetapps_output_as_x2goserver_prints_it_and_python_x2go_reads_it(self):
        self.write("xterm.desktop", XTERM.replace("Icon=nxgate-test-icon", f"Icon={self.icon}"))
        output = names.applications_output(applications.read_applications([self.dir]))
        self.assertTrue(output.startswith("<desktop>\nName=Terminal\nName[de]=Terminal auf Deutsch\nComment=A terminal\n"
                                          "<icon>\n"))
        self.assertTrue(output.endswith('\n</icon>\nExec=xterm -title "Published %U"\n'
                                        "Categories=System;TerminalEmulator;\n</desktop>\n"))
        body = output.split("<icon>\n")[1].split("</icon>\n")[0]
        self.assertTrue(all(len(line) <= 76 for line in body.splitlines()))
        self.assertEqual(body.count("\n\n"), 2)  # encode_base64 per 3420-byte read, joined by new lines
        with open(self.icon, "rb") as handle:
            self.assertEqual(base64.b64decode(body), handle.read())
        # python-x2go's own reading (backends/control/plain.py get_published_applications, raw=True)
        items = [item.replace("<desktop>\n", "") for item in output.split("</desktop>\n")]
        menu = [item for item in items if item]
        self.assertEqual(len(menu), 1)
        self.assertIn("Exec=xterm", menu[0].split("<icon>\n")[0] + menu[0].split("</icon>\n")[1])
