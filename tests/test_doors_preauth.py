"""The table of unauthenticated connections (nxgate.gateway.doors.preauth), with a
fake clock and a chosen random number; the real gateway under a flood is
tests.test_e2e_preauth."""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from nxgate import config as configuration
from nxgate.config import parse_max_startups, parse_networks
from nxgate.gateway.doors.preauth import DISPLACE_IDLE, MAX_SOURCES, Ending, Limits, PreauthTable, Refusal
from tests.harness.clock import FakeReactor


def table(chance: float = 0.99, **limits: object) -> tuple[PreauthTable, FakeReactor]:
    clock = FakeReactor(1000.0)
    return PreauthTable(Limits(**limits), clock, lambda: chance), clock  # type: ignore[arg-type]


class CapTests(TestCase):
    def test_one_address_gets_its_share_and_no_more(self) -> None:
        preauth, _ = table(per_address=3)
        self.assertEqual([preauth.admit("192.0.2.1") for _ in range(4)], [None, None, None, Refusal.PER_ADDRESS])
        self.assertIsNone(preauth.admit("192.0.2.2"))  # another address is not affected
        preauth.ended("192.0.2.1", Ending.AUTHENTICATED)
        self.assertIsNone(preauth.admit("192.0.2.1"))  # an authenticated one no longer counts
        self.assertEqual(preauth.total, 4)

    def test_ipv6_counts_by_slash_64_and_mapped_ipv4_as_ipv4(self) -> None:
        source = PreauthTable.source_of
        self.assertEqual(source("2001:db8:1:2::5"), source("2001:db8:1:2:ffff::1"))
        self.assertNotEqual(source("2001:db8:1:2::5"), source("2001:db8:1:3::5"))
        self.assertEqual(source("::ffff:192.0.2.7"), "192.0.2.7")
        self.assertEqual(source("local"), "local")

    def test_total_random_early_drop_between_start_and_full(self) -> None:
        # start 2, rate 50 %, full 4: at 2 the chance of a refusal is 50 %, at 3 75 %, at 4 100 %.
        unlucky, _ = table(chance=0.49, per_address=100, start=2, rate=50, full=4)
        lucky, _ = table(chance=0.6, per_address=100, start=2, rate=50, full=4)
        for preauth in (unlucky, lucky):
            self.assertEqual([preauth.admit(f"192.0.2.{n}") for n in (1, 2)], [None, None])
        self.assertEqual(unlucky.admit("192.0.2.3"), Refusal.EARLY_DROP)  # 0.49 < 0.5
        self.assertIsNone(lucky.admit("192.0.2.3"))  # 0.6 >= 0.5: taken, now 3 pending
        self.assertEqual(lucky.admit("192.0.2.4"), Refusal.EARLY_DROP)  # 0.6 < 0.75
        self.assertEqual(lucky.refused["early_drop"], 1)
        full, _ = table(chance=0.0, per_address=100, start=2, rate=50, full=2)
        full.admit("192.0.2.1")
        full.admit("192.0.2.2")
        self.assertEqual(full.admit("192.0.2.3"), Refusal.FULL)

    def test_the_file_reserve_refuses_everybody_exempt_or_not(self) -> None:
        preauth, _ = table(fd_reserve=100, exempt=parse_networks(["192.0.2.0/24"]))
        self.assertIsNone(preauth.admit("192.0.2.1", open_files=899, file_limit=1000))
        self.assertEqual(preauth.admit("192.0.2.1", open_files=900, file_limit=1000), Refusal.FILES)
        self.assertEqual(preauth.admit("198.51.100.1", open_files=950, file_limit=1000), Refusal.FILES)
        self.assertEqual(preauth.refused["files"], 2)

    def test_exempt_networks_skip_the_per_address_cap_not_the_total(self) -> None:
        preauth, _ = table(per_address=1, start=3, full=3, exempt=parse_networks(["10.0.0.0/8", "2001:db8::/32"]))
        self.assertEqual([preauth.admit("10.1.2.3") for _ in range(3)], [None, None, None])
        self.assertEqual(preauth.admit("10.1.2.3"), Refusal.FULL)
        self.assertTrue(preauth.exempt(PreauthTable.source_of("2001:db8:5::1")))
        self.assertFalse(preauth.exempt("192.0.2.1"))


class DoorTests(TestCase):
    """Each door has its own total; a newcomer at a full door displaces the
    most idle connection of the address holding the most there."""

    def flood(self, preauth: PreauthTable, door: str, addresses: int, each: int, first: int = 1,
              penalties: bool = True) -> list[str]:
        names = []
        for a in range(first, first + addresses):
            for n in range(each):
                name = f"{door}-10.0.0.{a}-{n}"
                self.assertIsNone(preauth.admit(f"10.0.0.{a}", door=door, connection=name, penalties=penalties))
                names.append(name)
        return names

    def test_idle_connections_on_one_door_take_nothing_from_another(self) -> None:
        preauth, _ = table(chance=0.0, per_address=10, start=50, rate=30, full=50)
        self.flood(preauth, "HTTPS", 5, 10)  # the portal is full
        self.assertEqual(preauth.admit("10.0.0.1", door="HTTPS"), Refusal.PER_ADDRESS)
        self.assertIsNone(preauth.admit("192.0.2.1", door="SSH", connection="login"))
        self.assertEqual(preauth.status()["unauthenticated_by_door"], {"HTTPS": 50, "SSH": 1})
        self.assertEqual(preauth.total, 51)

    def test_a_newcomer_at_a_full_door_displaces_the_heaviest_addresss_most_idle_connection(self) -> None:
        displaced: list[tuple[object, str, object]] = []
        clock = FakeReactor(1000.0)
        preauth = PreauthTable(Limits(per_address=10, start=20, rate=30, full=20), clock, lambda: 0.0,
                               lambda *gone: displaced.append(gone))
        self.flood(preauth, "SSH", 2, 9)
        self.flood(preauth, "SSH", 1, 2, first=3)  # 20: full
        clock.advance(1)
        preauth.active("SSH-10.0.0.1-0")  # it spoke: no longer the most idle of its address
        self.assertIsNone(preauth.admit("192.0.2.1", door="SSH", connection="login"))
        self.assertEqual(displaced, [("SSH-10.0.0.1-1", "10.0.0.1", None)])
        self.assertEqual(preauth.doors["SSH"].total, 20)
        self.assertEqual(preauth.sources["10.0.0.1"].pending, 8)
        self.assertEqual(preauth.displaced, 1)
        # Its end, when its close is noticed, is not counted again.
        self.assertIsNone(preauth.ended("10.0.0.1", Ending.NOAUTH, "SSH-10.0.0.1-1"))
        self.assertEqual((preauth.total, preauth.sources["10.0.0.1"].pending), (20, 8))
        # The heaviest address's own newcomer may not displace its equals: refused.
        self.assertEqual(preauth.admit("10.0.0.2", door="SSH", connection="more"), Refusal.FULL)
        # A login in progress is never taken by the flood's next connections.
        for n in range(5):
            preauth.admit("10.0.0.1", door="SSH", connection=f"again-{n}")
        self.assertNotIn("login", [gone[0] for gone in displaced])
        self.assertIn("login", preauth._placed)

    def test_equals_displace_only_connections_silent_for_a_while(self) -> None:
        """A flood of one connection from each of many addresses: a newcomer
        takes the place of one silent for DISPLACE_IDLE seconds, never of
        one that is busy logging in."""
        displaced: list[object] = []
        clock = FakeReactor(1000.0)
        preauth = PreauthTable(Limits(per_address=10, start=10, rate=30, full=10), clock, lambda: 0.0,
                               lambda connection, source, block: displaced.append(connection))
        self.flood(preauth, "SSH", 9, 1)
        preauth.admit("192.0.2.1", door="SSH", connection="login")
        self.assertEqual(preauth.admit("10.0.1.1", door="SSH", connection="x"), Refusal.FULL)
        clock.advance(DISPLACE_IDLE - 1)
        preauth.active("login")
        clock.advance(1)
        self.assertIsNone(preauth.admit("10.0.1.1", door="SSH", connection="x"))
        self.assertEqual(len(displaced), 1)
        self.assertNotEqual(displaced[0], "login")

    def test_exempt_addresses_are_never_displaced(self) -> None:
        preauth, _ = table(chance=0.0, per_address=10, start=10, rate=30, full=10,
                           exempt=parse_networks(["10.0.0.0/8"]))
        self.flood(preauth, "SSH", 1, 10)
        self.assertEqual(preauth.admit("192.0.2.1", door="SSH", connection="login"), Refusal.FULL)

    def test_a_displaced_connection_costs_its_address_a_penalty(self) -> None:
        blocks: list[object] = []
        clock = FakeReactor(1000.0)
        preauth = PreauthTable(Limits(per_address=10, start=10, rate=30, full=10, penalty_noauth=5, penalty_min=15),
                               clock, lambda: 0.0, lambda connection, source, block: blocks.append(block))
        self.flood(preauth, "SSH", 1, 10)
        for n in range(3):
            self.assertIsNone(preauth.admit(f"192.0.2.{n}", door="SSH", connection=f"login-{n}"))
        self.assertEqual(blocks[:2], [None, None])
        self.assertEqual((blocks[2].source, blocks[2].seconds), ("10.0.0.1", 15))
        # On the portal (no penalties there: browsers keep idle connections) displacing costs nothing.
        self.flood(preauth, "HTTPS", 1, 10, first=2, penalties=False)
        for n in range(20):
            preauth.admit(f"192.0.2.{100 + n}", door="HTTPS", connection=f"browser-{n}", penalties=False)
        self.assertEqual(blocks[3:], [None] * (len(blocks) - 3))
        self.assertEqual(preauth.penalized(), 1)


class TrustTests(TestCase):
    def test_a_verified_members_address_is_exempt_for_a_while(self) -> None:
        preauth, clock = table(per_address=1, penalty_noauth=100, penalty_min=1)
        preauth.admit("192.0.2.5")
        self.assertEqual(preauth.admit("192.0.2.5"), Refusal.PER_ADDRESS)
        preauth.ended("192.0.2.5", Ending.AUTHENTICATED)
        preauth.trust("192.0.2.5", 100)
        self.assertEqual([preauth.admit("192.0.2.5") for _ in range(5)], [None] * 5)  # a burst of streams
        self.assertIsNone(preauth.ended("192.0.2.5", Ending.NOAUTH))  # no penalty either
        clock.advance(101)
        self.assertEqual(preauth.admit("192.0.2.5"), Refusal.PER_ADDRESS)


class PenaltyTests(TestCase):
    def test_connections_ending_unauthenticated_lead_to_a_refusal_that_wears_off(self) -> None:
        preauth, clock = table(penalty_noauth=1, penalty_grace=10, penalty_min=15, penalty_max=600)
        for _ in range(14):  # 14 quick failures owe 14 s: not yet
            preauth.admit("192.0.2.1")
            self.assertIsNone(preauth.ended("192.0.2.1", Ending.NOAUTH))
        preauth.admit("192.0.2.1")
        block = preauth.ended("192.0.2.1", Ending.NOAUTH)
        self.assertEqual((block.source, block.seconds, block.strikes), ("192.0.2.1", 15, 1))
        self.assertEqual(preauth.admit("192.0.2.1"), Refusal.PENALTY)
        self.assertIsNone(preauth.admit("192.0.2.2"))
        self.assertIsNone(preauth.admit("192.0.2.1", penalties=False))  # the portal does not look at penalties
        preauth.ended("192.0.2.1", Ending.UNPENALIZED)
        clock.advance(15)
        self.assertIsNone(preauth.admit("192.0.2.1"))
        self.assertEqual(preauth.penalized(), 0)

    def test_the_debt_drains_with_time(self) -> None:
        preauth, clock = table(penalty_noauth=1, penalty_min=15)
        for _ in range(100):  # one failure a second never adds up
            preauth.admit("192.0.2.1")
            self.assertIsNone(preauth.ended("192.0.2.1", Ending.NOAUTH))
            clock.advance(1)

    def test_deadline_closures_cost_more_and_repeated_blocks_grow_to_the_maximum(self) -> None:
        preauth, clock = table(per_address=100, penalty_grace=10, penalty_min=15, penalty_max=100)
        lengths = []
        for _ in range(5):
            for _ in range(2):
                self.assertIsNone(preauth.admit("192.0.2.1"))
            preauth.ended("192.0.2.1", Ending.DEADLINE)
            block = preauth.ended("192.0.2.1", Ending.DEADLINE)
            lengths.append(block.seconds)
            clock.advance(block.seconds)
        self.assertEqual(lengths, [20, 40, 80, 100, 100])
        clock.advance(101)  # a block's memory lasts penalty_max seconds
        for _ in range(2):
            preauth.admit("192.0.2.1")
        preauth.ended("192.0.2.1", Ending.DEADLINE)
        self.assertEqual(preauth.ended("192.0.2.1", Ending.DEADLINE).seconds, 20)

    def test_authenticated_and_exempt_connections_owe_nothing(self) -> None:
        preauth, _ = table(per_address=100, penalty_noauth=20, penalty_min=15,
                           exempt=parse_networks(["192.0.2.9"]))
        preauth.admit("192.0.2.1")
        self.assertIsNone(preauth.ended("192.0.2.1", Ending.AUTHENTICATED))
        preauth.admit("192.0.2.9")
        self.assertIsNone(preauth.ended("192.0.2.9", Ending.NOAUTH))
        self.assertIsNone(preauth.admit("192.0.2.9"))

    def test_a_connection_ends_once(self) -> None:
        preauth, _ = table()
        preauth.admit("192.0.2.1")
        preauth.ended("192.0.2.1", Ending.AUTHENTICATED)
        preauth.ended("192.0.2.1", Ending.NOAUTH)
        self.assertEqual(preauth.total, 0)
        self.assertEqual(preauth.sources["192.0.2.1"].pending, 0)


class LogTests(TestCase):
    def test_refusals_are_logged_once_a_minute_per_address_with_a_count(self) -> None:
        preauth, clock = table()
        self.assertEqual(preauth.note("192.0.2.1", "per_address"), {"per_address": 1})
        for _ in range(500):
            self.assertIsNone(preauth.note("192.0.2.1", "per_address"))
        self.assertEqual(preauth.note("192.0.2.2", "full"), {"full": 1})  # another address has its own minute
        preauth.note("192.0.2.1", "penalty")
        clock.advance(30)
        self.assertEqual(preauth.flush_log(), [])
        clock.advance(30)
        self.assertEqual(preauth.flush_log(), [("192.0.2.1", {"per_address": 500, "penalty": 1})])
        self.assertEqual(preauth.note("192.0.2.1", "deadline"), None)  # its minute began at the flush
        clock.advance(60)
        self.assertEqual(preauth.note("192.0.2.1", "deadline"), {"deadline": 2})


class BoundTests(TestCase):
    def test_the_table_forgets_idle_sources_beyond_its_bound(self) -> None:
        preauth, clock = table(per_address=100, penalty_noauth=1)
        for n in range(MAX_SOURCES + 10):
            address = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
            preauth.admit(address)
            preauth.ended(address, Ending.NOAUTH)
        clock.advance(5)
        preauth.admit("192.0.2.1")
        self.assertLessEqual(len(preauth.sources), MAX_SOURCES)
        self.assertEqual(preauth.total, 1)


class SettingTests(TestCase):
    def test_max_startups_forms(self) -> None:
        self.assertEqual(parse_max_startups("100:30:200"), (100, 30, 200))
        self.assertEqual(parse_max_startups("50"), (50, 100, 50))
        for bad in ("", "a:b:c", "10:30", "20:30:10", "10:0:20", "10:101:20"):
            self.assertRaises(ValueError, parse_max_startups, bad)

    def test_bad_settings_are_config_errors_that_name_the_line(self) -> None:
        path = self.mktemp()
        with open(path, "w") as handle:
            handle.write("[server]\nmax_startups = 30:10\npreauth_exempt = 10.0.0.0/8 nonsense\n")
        error = self.assertRaises(configuration.ConfigError, configuration.load, path)
        text = "\n".join(error.problems)
        self.assertIn("max_startups", text)
        self.assertIn("'nonsense'", text)

    def test_limits_from_the_default_config(self) -> None:
        limits = Limits.from_config(configuration.load(None))
        self.assertEqual((limits.grace, limits.per_address, limits.start, limits.rate, limits.full),
                         (30.0, 10, 100, 30, 200))
