"""The words nxgate-client has for a session whose stream ended elsewhere
(pure; the real gateway, suspend, terminate and take-over are in
tests.test_e2e_client.SessionTests)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nxgate.client.main import fate_words
from nxgate.nx.listing import ParsedRow

ID = "0123456789ABCDEF0123456789ABCDEF"


def row(status: str) -> ParsedRow:
    return ParsedRow("1001", "unix-console", ID, "-", "24", "800x600", status, "desk")


class FateTests(SynchronousTestCase):
    def test_not_listed_is_terminated(self):
        self.assertEqual(fate_words(ID, None, None, "nxproxy"), "it was terminated (it is no longer on the server)")

    def test_suspended_stays(self):
        self.assertEqual(fate_words(ID, row("Suspended"), None, "nxproxy"),
                         f"it was suspended and stays on the server (--resume {ID} attaches to it again)")

    def test_running_elsewhere_is_a_take_over(self):
        self.assertEqual(fate_words(ID, row("Running"), None, "the server"),
                         "another client took it over (it runs on, attached there)")

    def test_a_failed_listing_says_who_closed_and_why_we_do_not_know(self):
        self.assertEqual(fate_words(ID, None, "authentication as 'nx' failed", "nxproxy"),
                         "nxproxy closed the connection (asking the server what became of the session failed: "
                         "authentication as 'nx' failed; --list shows it)")
