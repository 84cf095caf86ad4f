"""What nxgate-client says of a session whose stream ended elsewhere: the
words, and the listings that decide them on a fake clock (the real gateway,
suspend, terminate and take-over are in tests.test_e2e_client.SessionTests)."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.clients.nx import fate
from nxgate.clients.nx.fate import fate_words
from nxgate.protocols.nx.listing import ParsedRow
from tests.harness.clock import FakeReactor

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


class FakeListing:
    """A ``--list`` run the test answers (instead of a real connection)."""

    def __init__(self, errors, rows=None, complaint=""):
        self.errors, self.rows, self.complaint = errors, rows, complaint
        self.listed = None
        self.done = defer.Deferred()

    def start(self):
        return self.done

    def answer(self):
        self.listed = self.rows
        self.done.callback(0)

    def finish(self, code):
        if not self.done.called:
            self.errors.write(self.complaint)
            self.done.callback(code)


class QuestionTests(SynchronousTestCase):
    """FateQuestion's listings, the take-over check and its limits, on a fake clock."""

    def setUp(self):
        self.clock = FakeReactor()
        self.listings: list[FakeListing] = []
        self.answers: list[tuple | None] = []  # rows for each listing in turn; None: never answers

    def new_listing(self, errors):
        rows = self.answers.pop(0)
        listing = FakeListing(errors, rows, "nxgate-client: cannot connect to 127.0.0.1:4022: refused\n")
        self.listings.append(listing)
        if rows is not None:
            self.clock.callLater(0, listing.answer)
        return listing

    def ask(self):
        self.question = fate.FateQuestion(self.clock, self.new_listing, ID, "nxproxy")
        return defer.ensureDeferred(self.question.ask())

    def test_suspended_then_running_is_a_take_over(self):
        self.answers = [(row("Suspended"),), (row("Running"),)]
        asked = self.ask()
        self.clock.advance(0)
        self.assertNoResult(asked)  # waits a moment before the second look
        self.clock.advance(fate.TAKEOVER_CHECK)
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(asked), "another client took it over (it runs on, attached there)")
        self.assertEqual(len(self.listings), 2)

    def test_suspended_twice_is_suspended(self):
        self.answers = [(row("Suspended"),), (row("Suspended"),)]
        asked = self.ask()
        self.clock.pump([0, fate.TAKEOVER_CHECK, 0])
        self.assertIn("it was suspended and stays on the server", self.successResultOf(asked))

    def test_not_listed_needs_one_look(self):
        self.answers = [()]
        asked = self.ask()
        self.clock.advance(0)
        self.assertEqual(self.successResultOf(asked), "it was terminated (it is no longer on the server)")
        self.assertEqual(len(self.listings), 1)

    def test_a_listing_that_never_answers_is_given_up(self):
        self.answers = [None]
        asked = self.ask()
        self.clock.advance(fate.STATUS_TIMEOUT)
        self.assertEqual(self.successResultOf(asked), "nxproxy closed the connection (asking the server what became "
                         "of the session failed: cannot connect to 127.0.0.1:4022: refused; --list shows it)")

    def test_cancel_during_the_wait_keeps_what_is_known(self):
        self.answers = [(row("Suspended"),)]
        asked = self.ask()
        self.clock.advance(0)
        self.assertTrue(self.question.cancel())
        self.assertIn("it was suspended", self.successResultOf(asked))
        self.assertFalse(self.question.cancel())  # nothing under way any more
