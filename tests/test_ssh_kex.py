"""Unit tests of the SSH key exchange off the reactor (issue 27) and of the algorithm sets (issue 22, 6).

Pure parts (group choice, admission, the arithmetic, ETM framing) directly;
the transport with a Conch client over in-memory transports and a pool whose
answers the test releases, to see that nothing is read while a computation
is pending.  The real worker processes, once, with the real reactor.  The
end-to-end proofs are tests/test_e2e_dheat.py and tests/test_e2e_ssh_audit.py.

:class:`ConchCanaryTests` fails loudly when the Conch private API that
nxgate/gateway/doors/conch/server.py and etm.py replace or lean on changes.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import pwd
import random
import signal
import sys
import textwrap
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

try:
    from cryptography.hazmat.primitives.asymmetric import mlkem
except ImportError:  # Cryptography before 48 (Debian 12 has 38): no hybrid to test
    mlkem = None
from twisted.conch.ssh import _kex, common, keys, transport
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SkipTest, TestCase

from nxgate.gateway.doors.conch import algorithms, kexlimit, kexmath, kexpool, kexworker
from nxgate.wire import ssh_etm as etm
from nxgate.gateway.doors.conch.kexlimit import FairQueue, KexAdmission, OncePer
from nxgate.gateway.doors.conch.kexpool import KexJobError, KexPool
from nxgate.gateway.doors.conch import server as server_module
from nxgate.gateway.doors.conch.server import KexService, NXSSHFactory
from tests.harness.clock import FakeReactor

ECHO = 192


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def need_mlkem() -> None:
    if mlkem is None:
        raise SkipTest("this Cryptography has no ML-KEM")
GROUP14 = (2, _kex.getDHGeneratorAndPrime(b"diffie-hellman-group14-sha1")[1])


# ---------------------------------------------------------------- the canary
#: sha256 (first 16 hex digits) of the dedented source of each Conch method
#: we replace or whose internals we rely on, as reviewed with Twisted 26.10.
REVIEWED_CONCH = {
    "SSHServerTransport.ssh_KEX_DH_GEX_REQUEST_OLD": "2881789ff0f2371f",
    "SSHServerTransport.ssh_KEX_DH_GEX_REQUEST": "3beba5309c5388a5",
    "SSHServerTransport.ssh_KEX_DH_GEX_INIT": "b1ed043ac7a8f537",
    "SSHServerTransport._ssh_KEXDH_INIT": "deb015084d6fd3fd",
    "SSHServerTransport._ssh_KEX_HYBRID_INIT": "519f2ecfca4a6c6c",
    "SSHServerTransport._keySetup": "81785e1f6f06d921",
    "SSHTransportBase.dataReceived": "8240acd8b4abd0a3",
    "SSHTransportBase.getPacket": "12c9666a90759991",
    "SSHTransportBase._newKeys": "4109423d0a1f2ef3",
    "SSHTransportBase.sendPacket": "2c351e9582c1fc6b",
    "SSHTransportBase.ssh_KEXINIT": "67c0895f49feb80d",
    "SSHCiphers.makeMAC": "4bd1f6720179a204",
    "SSHCiphers.verify": "4dbc12f9370f444c",
    "SSHCiphers.setKeys": "2f7312cdec8d7495",
}
#: Conch's key-exchange handlers on the server: a new one (another algorithm)
#: would compute on the reactor until server.py takes it over too.
KNOWN_KEX_HANDLERS = {"_ssh_KEXDH_INIT", "_ssh_KEX_ECDH_INIT", "_ssh_KEX_HYBRID_INIT", "ssh_KEXINIT",
                      "ssh_KEX_DH_GEX_INIT", "ssh_KEX_DH_GEX_REQUEST", "ssh_KEX_DH_GEX_REQUEST_OLD"}


class ConchCanaryTests(TestCase):
    def test_the_conch_code_we_replace_is_the_code_we_reviewed(self) -> None:
        changed = []
        for name, digest in REVIEWED_CONCH.items():
            owner, method = name.split(".")
            source = textwrap.dedent(inspect.getsource(getattr(getattr(transport, owner), method)))
            if hashlib.sha256(source.encode()).hexdigest()[:16] != digest:
                changed.append(name)
        self.assertEqual(changed, [], "Conch changed these since nxgate/gateway/doors/conch/server.py and etm.py were "
                                      "written against them: review the overrides, then update REVIEWED_CONCH")

    def test_conch_has_no_key_exchange_handler_we_do_not_take_over(self) -> None:
        handlers = {name for name in dir(transport.SSHServerTransport) if "KEX" in name}
        self.assertEqual(handlers, KNOWN_KEX_HANDLERS)

    def test_the_private_names_we_use_exist(self) -> None:
        for name in ("_getHostKeys", "_keySetup", "_ssh_KEX_ECDH_INIT", "_allowedKeyExchangeMessageType",
                     "_KEY_EXCHANGE_NONE", "ignoreNextPacket", "buf"):
            self.assertTrue(hasattr(transport.SSHServerTransport, name), name)
        for name in ("MSG_KEX_DH_GEX_GROUP", "MSG_KEX_DH_GEX_REPLY", "MSG_KEXDH_REPLY", "MSG_DISCONNECT",
                     "DISCONNECT_TOO_MANY_CONNECTIONS", "DISCONNECT_KEY_EXCHANGE_FAILED"):
            self.assertTrue(hasattr(transport, name), name)
        for name in ("isFixedGroup", "isEllipticCurve", "getHashProcessor", "getDHGeneratorAndPrime"):
            self.assertTrue(callable(getattr(_kex, name, None)), name)
        # Used when Conch has the hybrid (25 and later; server.py copes without, for Debian 12's 22.4).
        self.assertTrue(callable(getattr(_kex, "isPQHybrid", None)))
        self.assertTrue(hasattr(transport, "OVERLAP_MSG_KEX_HYBRID_REPLY"))

    def test_everything_we_offer_is_implemented(self) -> None:
        legacy = algorithms.policy(True)
        self.assertLessEqual(set(legacy.kex), set(_kex._kexAlgorithms))
        self.assertLessEqual(set(legacy.ciphers), set(transport.SSHCiphers.cipherMap) | set(etm.AEAD_CIPHERS))
        self.assertLessEqual(set(legacy.macs), set(etm.EtmCiphers.macMap))
        self.assertIn(b"mlkem768x25519-sha256", transport.SSHServerTransport.supportedKeyExchanges,
                      "Conch or Cryptography lost ML-KEM: the default set has no post-quantum key exchange")


# ---------------------------------------------------------- the algorithm sets
class AlgorithmTests(TestCase):
    def test_the_default_set_has_nothing_weak(self) -> None:
        default = algorithms.policy(False)
        offered = b",".join(default.kex + default.host_key_algorithms + default.ciphers + default.macs)
        for weak in (b"sha1", b"cbc", b"3des", b"md5", b"nistp", b"ssh-rsa,", b"ssh-dss"):
            self.assertNotIn(weak, offered + b",")
        self.assertEqual(default.kex[0], b"mlkem768x25519-sha256")
        self.assertEqual(default.largest_modulus, 4096)

    def test_the_legacy_set_adds_what_nxssh_needs(self) -> None:
        legacy = algorithms.policy(True)
        for name in (b"diffie-hellman-group-exchange-sha1", b"diffie-hellman-group14-sha1"):
            self.assertIn(name, legacy.kex)
        self.assertIn(b"ssh-rsa", legacy.host_key_algorithms)
        self.assertIn(b"aes128-cbc", legacy.ciphers)
        self.assertIn(b"hmac-sha1", legacy.macs)
        self.assertEqual(legacy.largest_modulus, 8192)
        self.assertEqual(legacy.kex[: len(algorithms.MODERN_KEX)], algorithms.MODERN_KEX)  # modern still first

    def transport_for(self, legacy: bool, primes: Any) -> Any:
        host_keys = {b"ssh-ed25519": keys.Key(ed25519.Ed25519PrivateKey.generate())}
        factory = NXSSHFactory(None, host_keys, 120, 6, KexService(algorithms.policy(legacy)))
        factory.primes = primes
        return factory.buildProtocol(None)

    def test_a_transport_offers_its_set(self) -> None:
        built = self.transport_for(False, {3072: [GROUP14]})
        self.assertEqual(built.supportedPublicKeys, [b"ssh-ed25519"])
        self.assertEqual(built.supportedCiphers, list(algorithms.MODERN_CIPHERS))
        self.assertEqual(built.supportedMACs, list(algorithms.MODERN_MACS))
        implemented = transport.SSHServerTransport.supportedKeyExchanges
        self.assertEqual(built.supportedKeyExchanges, [name for name in algorithms.MODERN_KEX if name in implemented])

    def test_sha1_rsa_host_signatures_only_with_legacy(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa

        host_keys = {b"ssh-rsa": keys.Key(rsa.generate_private_key(public_exponent=65537, key_size=2048))}
        for legacy, expected in ((False, [b"rsa-sha2-512", b"rsa-sha2-256"]),
                                 (True, [b"rsa-sha2-512", b"rsa-sha2-256", b"ssh-rsa"])):
            factory = NXSSHFactory(None, host_keys, 120, 6, KexService(algorithms.policy(legacy)))
            factory.primes = None
            self.assertEqual(factory.buildProtocol(None).supportedPublicKeys, expected)

    def test_no_group_exchange_without_moduli(self) -> None:
        built = self.transport_for(True, None)
        self.assertFalse([name for name in built.supportedKeyExchanges if b"group-exchange" in name])
        self.assertIn(b"diffie-hellman-group14-sha1", built.supportedKeyExchanges)


class GroupChoiceTests(TestCase):
    PRIMES = {size: [(2, size)] for size in (2048, 3072, 4096, 6144, 7680, 8192)}  # the "prime" is its size here

    def choose(self, minimum: int, ideal: int, maximum: int, legacy: bool = False) -> int:
        policy = algorithms.policy(legacy)
        return algorithms.choose_group(self.PRIMES, minimum, ideal, maximum, policy.smallest_modulus,
                                       policy.largest_modulus, policy.preferred_modulus, random.Random(1))[1]

    def test_by_default_an_8192_bit_request_gets_3072(self) -> None:
        self.assertEqual(self.choose(2048, 8192, 8192), 3072)

    def test_by_default_a_client_that_insists_gets_at_most_4096(self) -> None:
        self.assertEqual(self.choose(4096, 8192, 8192), 4096)
        with self.assertRaises(algorithms.NoGroup) as raised:
            self.choose(8192, 8192, 8192)
        self.assertIn("3072 to 4096", str(raised.exception))

    def test_never_below_3072_by_default(self) -> None:
        self.assertEqual(self.choose(1024, 1024, 8192), 3072)
        self.assertRaises(algorithms.NoGroup, self.choose, 1024, 2048, 2048)

    def test_legacy_serves_up_to_8192_to_clients_that_insist(self) -> None:
        self.assertEqual(self.choose(2048, 8192, 8192, legacy=True), 3072)
        self.assertEqual(self.choose(8192, 8192, 8192, legacy=True), 8192)
        self.assertEqual(self.choose(1024, 2048, 2048, legacy=True), 2048)
        self.assertEqual(self.choose(7000, 8192, 8192, legacy=True), 7680)  # the nearest allowed
        self.assertEqual(self.choose(1024, 1024, 8192, legacy=True), 2048)
        self.assertEqual(self.choose(5000, 5500, 8192, legacy=True), 6144)

    def test_what_conch_would_serve(self) -> None:
        """The difference: Conch's getDHPrime takes the nearest to the ideal whatever the bounds."""
        factory = NXSSHFactory(None, {}, 120, 6)
        factory.primes = self.PRIMES
        self.assertEqual(factory.getDHPrime(8192)[1], 8192)


# ------------------------------------------------------------------ arithmetic
class KexMathTests(TestCase):
    def test_diffie_hellman_agrees_with_the_client(self) -> None:
        generator, prime = GROUP14
        client_secret = random.getrandbits(256)
        client_public = pow(generator, client_secret, prime)
        ours, shared = kexmath.dh_server(generator, prime, client_public)
        self.assertEqual(pow(ours, client_secret, prime), shared)

    def test_bad_client_values_are_refused(self) -> None:
        generator, prime = GROUP14
        for value in (0, 1, prime - 1, prime, prime + 5, 2, 1 << 100):
            self.assertRaises(kexmath.KexMathError, kexmath.dh_server, generator, prime, value)

    def test_the_hybrid_agrees_with_the_client(self) -> None:
        need_mlkem()
        kem, curve = mlkem.MLKEM768PrivateKey.generate(), x25519.X25519PrivateKey.generate()
        client_init = kem.public_key().public_bytes_raw() + curve.public_key().public_bytes_raw()
        shared, reply = kexmath.mlkem768x25519_server(client_init)
        ciphertext, server_curve = reply[:1088], reply[1088:]
        expected = hashlib.sha256(kem.decapsulate(ciphertext)
                                  + curve.exchange(x25519.X25519PublicKey.from_public_bytes(server_curve))).digest()
        self.assertEqual(shared, common.NS(expected))

    def test_a_bad_hybrid_value_is_refused(self) -> None:
        need_mlkem()
        self.assertRaises(kexmath.KexMathError, kexmath.mlkem768x25519_server, b"x" * 100)
        self.assertRaises(kexmath.KexMathError, kexmath.mlkem768x25519_server, b"\xff" * 1184 + bytes(32))


class WorkerTests(TestCase):
    def test_jobs_and_answers_are_json_lines(self) -> None:
        generator, prime = GROUP14
        good = {"id": 1, "op": "dh", "g": "2", "p": format(prime, "x"), "e": format(pow(2, 12345, prime), "x")}
        bad = {"id": 2, "op": "dh", "g": "2", "p": format(prime, "x"), "e": "1"}
        source = io.BytesIO(b"".join(json.dumps(job).encode() + b"\n" for job in (good, bad)) + b"junk\n")
        sink = io.BytesIO()
        kexworker.serve(source, sink)
        first, second, third = (json.loads(line) for line in sink.getvalue().splitlines())
        self.assertEqual(pow(int(first["f"], 16), 12345, prime), int(first["k"], 16))
        self.assertEqual((second["id"], second["error"]), (2, "Diffie-Hellman public value out of range"))
        self.assertIn("error", third)

    def test_the_pool_computes_in_worker_processes(self) -> defer.Deferred[None]:
        """The real pool, with the real reactor and processes."""
        pool = KexPool(reactor, 2)
        pool.start()
        self.addCleanup(pool.stop)  # a Deferred: until the workers have ended
        generator, prime = GROUP14
        job = {"op": "dh", "g": "2", "p": format(prime, "x"), "e": format(pow(2, 77777, prime), "x")}

        async def run() -> None:
            answers = await defer.gatherResults([pool.submit(job) for _ in range(3)])
            for answer in answers:
                self.assertEqual(pow(int(answer["f"], 16), 77777, prime), int(answer["k"], 16))
            with self.assertRaises(KexJobError):
                await pool.submit({**job, "e": "0"})
            # A client that hangs up: a queued job is dropped at once, a running one is done when answered.
            finished: list[str] = []
            running = pool.submit(job, lambda: finished.append("running"))
            pool.submit(job, lambda: finished.append("second"))  # the other worker
            queued = pool.submit(job, lambda: finished.append("queued"))
            running.addErrback(lambda _: None)
            queued.addErrback(lambda _: None)
            queued.cancel()
            running.cancel()
            self.assertEqual(finished, ["queued"])
            self.assertEqual(pool.queued, 0)
            while len(finished) < 3:
                await deferLater(reactor, 0.01)
            self.assertEqual(sorted(finished), ["queued", "running", "second"])
            if os.geteuid() == 0:  # as the gateway runs: the workers are nobody, and nicer
                for worker in pool._workers:
                    with open(f"/proc/{worker.transport.pid}/status") as status:
                        uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
                    self.assertEqual(int(uid), pwd.getpwnam("nobody").pw_uid)
                    self.assertEqual(os.getpriority(os.PRIO_PROCESS, worker.transport.pid), kexworker.NICENESS)

    def test_a_stopped_worker_is_replaced_and_its_job_answered_by_the_next(self) -> defer.Deferred[None]:
        """SIGSTOP the only worker: its job is not lost at a deadline, it is
        computed by the worker started in its place."""
        pool = KexPool(reactor, 1)
        pool.start()
        self.addCleanup(pool.stop)
        self.patch(kexpool, "STALL_CHECK", 0.3)
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        generator, prime = GROUP14
        job = {"op": "dh", "g": "2", "p": format(prime, "x"), "e": format(pow(2, 4242, prime), "x")}

        async def run() -> None:
            await pool.submit(job)  # the worker runs
            [frozen] = pool._workers
            frozen_pid = frozen.transport.pid
            os.kill(frozen_pid, signal.SIGSTOP)
            self.addCleanup(_kill_quietly, frozen_pid)
            done: list[bool] = []
            answer = await pool.submit(job, lambda: done.append(True))
            self.assertEqual(pow(int(answer["f"], 16), 4242, prime), int(answer["k"], 16))
            self.assertEqual(done, [True])  # its admission released once
            [fresh] = pool._workers
            self.assertNotEqual(fresh.transport.pid, frozen_pid)
            lines = [formatEvent(event) for event in events]
            self.assertTrue(any(f"key-exchange worker 0 (pid {frozen_pid}) did not answer" in line
                                and "it is stopped" in line and "tried again" in line for line in lines), lines)
            while frozen.running:  # killed, not left stopped
                await deferLater(reactor, 0.05)

        return defer.ensureDeferred(run())

    def test_a_job_that_stalls_two_workers_fails(self) -> None:
        """With a fake process that never answers and seems stopped: one retry, then a clear failure."""
        clock = FakeReactor()
        spawned: list[Any] = []

        class Transport:
            def __init__(self, number: int) -> None:
                self.pid, self.written, self.signals = 1000 + number, [], []

            def write(self, data: bytes) -> None:
                self.written.append(data)

            def signalProcess(self, signal: str) -> None:
                self.signals.append(signal)

        def spawnProcess(worker: Any, *args: Any, **kwargs: Any) -> None:
            worker.transport = Transport(len(spawned))
            spawned.append(worker)
            worker.connectionMade()

        clock.spawnProcess = spawnProcess  # type: ignore[attr-defined]
        pool = KexPool(clock, 1, inspect=lambda pid: ("T", 5))
        pool.start()
        failed: list[Any] = []
        released: list[bool] = []
        pool.submit({"op": "dh"}, lambda: released.append(True), "192.0.2.1").addErrback(failed.append)
        clock.advance(kexpool.STALL_CHECK)
        self.assertEqual(len(spawned), 2)
        self.assertEqual(spawned[0].transport.signals, ["KILL"])
        self.assertEqual(len(spawned[1].transport.written), 1)  # the job, again, on the fresh worker
        self.assertEqual(failed, [])
        clock.advance(kexpool.STALL_CHECK)
        self.assertEqual(len(spawned), 3)
        self.assertEqual(spawned[2].transport.written, [])
        [failure] = failed
        self.assertIn("did not answer", failure.getErrorMessage())
        self.assertEqual(released, [True])

    def test_with_every_worker_stopped_the_job_goes_to_a_fresh_one_and_the_stopped_idle_ones_are_replaced(self) -> None:
        clock = FakeReactor()
        spawned: list[Any] = []
        states: dict[int, str] = {}

        class Transport:
            def __init__(self, pid: int) -> None:
                self.pid, self.written, self.signals = pid, [], []

            def write(self, data: bytes) -> None:
                self.written.append(json.loads(data))

            def signalProcess(self, signal: str) -> None:
                self.signals.append(signal)

        def spawnProcess(worker: Any, *args: Any, **kwargs: Any) -> None:
            worker.transport = Transport(2000 + len(spawned))
            states[worker.transport.pid] = "S"
            spawned.append(worker)
            worker.connectionMade()

        clock.spawnProcess = spawnProcess  # type: ignore[attr-defined]
        pool = KexPool(clock, 2, inspect=lambda pid: (states[pid], 5))
        pool.start()
        states[2000] = states[2001] = "T"  # SIGSTOP both
        answers: list[Any] = []
        pool.submit({"op": "dh"}, source="192.0.2.1").addBoth(answers.append)
        clock.advance(kexpool.STALL_CHECK)
        self.assertEqual([w.transport.signals for w in spawned[:2]], [["KILL"], ["KILL"]])
        self.assertEqual(len(spawned), 4)  # both replaced
        fresh = spawned[2]
        [job] = fresh.transport.written
        fresh.outReceived(json.dumps({"id": job["id"], "f": "1", "k": "2"}).encode() + b"\n")
        self.assertEqual(answers, [{"id": job["id"], "f": "1", "k": "2"}])

    def test_a_slow_worker_is_left_alone(self) -> None:
        self.assertIsNone(kexlimit.stalled("R", 40, 40, 10.0, 60.0))  # waiting for a CPU: slow, not stuck
        self.assertIsNone(kexlimit.stalled("S", None, 40, 2.0, 60.0))  # the first look: no judgement yet
        self.assertIsNone(kexlimit.stalled("S", 40, 45, 4.0, 60.0))  # it computed since
        self.assertIsNone(kexlimit.stalled("Z", 40, 40, 4.0, 60.0))  # ended: the pool hears of it anyway
        self.assertEqual(kexlimit.stalled("T", None, 40, 2.0, 60.0), "it is stopped")
        self.assertIn("used no CPU", kexlimit.stalled("S", 40, 40, 4.0, 60.0) or "")
        self.assertIn("no answer after 60 s", kexlimit.stalled("R", 40, 90, 60.0, 60.0) or "")

    def test_a_worker_that_cannot_start_fails_jobs_instead_of_hanging_them(self) -> defer.Deferred[None]:
        pool = KexPool(reactor, 1, argv=[sys.executable, "-c", "import sys; sys.exit(3)"])
        pool.start()
        self.addCleanup(pool.stop)
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        waiting = pool.submit({"op": "dh"})

        async def run() -> None:
            with self.assertRaises(KexJobError):
                await waiting  # the worker ended during the job
            self.assertTrue(any("key-exchange worker 0 ended" in formatEvent(e) for e in events))
            self.assertEqual(pool._delay, 2.0)  # backing off
            with self.assertRaises(KexJobError) as raised:
                await pool.submit({"op": "dh"})  # at once, not after the next attempt
            self.assertIn("no key-exchange worker is running", str(raised.exception))

        return defer.ensureDeferred(run())

        return defer.ensureDeferred(run())


# ------------------------------------------------------------------ admission
class AdmissionTests(TestCase):
    def test_per_address(self) -> None:
        admission = KexAdmission(per_source=2, max_pending=100)
        self.assertIsNone(admission.admit("10.0.0.1"))
        self.assertIsNone(admission.admit("10.0.0.1"))
        refusal = admission.admit("10.0.0.1")
        assert refusal is not None
        self.assertEqual(refusal.scope, "address")
        self.assertIsNone(admission.admit("10.0.0.2"))  # another address is not held back
        admission.release("10.0.0.1")
        self.assertIsNone(admission.admit("10.0.0.1"))
        self.assertEqual(admission.pending, 3)

    def test_random_early_drop_in_all(self) -> None:
        draws = iter([0.99, 0.64, 0.66])
        admission = KexAdmission(per_source=100, max_pending=4, rng=lambda: next(draws))
        self.assertIsNone(admission.admit("a"))
        self.assertIsNone(admission.admit("b"))  # below half: no draw
        self.assertIsNone(admission.admit("c"))  # at half: 30 % are refused; 0.99 passes
        refusal = admission.admit("d")  # 3 of 4 pending: 65 % are refused; 0.64 is
        assert refusal is not None
        self.assertEqual(refusal.scope, "total")
        self.assertIsNone(admission.admit("d"))  # 0.66 passes
        self.assertIsNotNone(admission.admit("e"))  # full: refused, no draw left to take

    def test_addresses_take_turns_in_the_queue(self) -> None:
        queue: FairQueue[str] = FairQueue()
        for n in range(4):
            queue.push("attacker", f"a{n}")
        queue.push("victim", "v0")
        queue.push("attacker", "a4")
        self.assertTrue(queue.remove("attacker", "a4"))
        self.assertFalse(queue.remove("victim", "a1"))
        self.assertEqual(len(queue), 5)
        self.assertEqual([queue.pop() for _ in range(5)], ["a0", "v0", "a1", "a2", "a3"])
        self.assertRaises(IndexError, queue.pop)

    def test_release_without_admission_is_a_bug(self) -> None:
        self.assertRaises(ValueError, KexAdmission(2, 10).release, "nobody")

    def test_refusals_are_logged_once_per_address_per_minute(self) -> None:
        now = [0.0]
        once = OncePer(lambda: now[0], 60)
        self.assertEqual(once.allow("a"), 0)
        self.assertIsNone(once.allow("a"))
        self.assertIsNone(once.allow("a"))
        self.assertEqual(once.allow("b"), 0)
        now[0] = 61
        self.assertEqual(once.allow("a"), 2)  # with how many were left out


# ------------------------------------------------------------------ ETM framing
class EtmTests(TestCase):
    def ciphers(self) -> tuple[etm.EtmCiphers, etm.EtmCiphers]:
        sending = etm.EtmCiphers(b"aes128-ctr", b"aes128-ctr", b"hmac-sha2-256-etm@openssh.com",
                                 b"hmac-sha2-256-etm@openssh.com")
        receiving = etm.EtmCiphers(b"aes128-ctr", b"aes128-ctr", b"hmac-sha2-256-etm@openssh.com",
                                   b"hmac-sha2-256-etm@openssh.com")
        iv, key, mac = b"i" * 32, b"k" * 32, b"m" * 32
        sending.setKeys(iv, key, iv, key, mac, mac)
        receiving.setKeys(iv, key, iv, key, mac, mac)
        return sending, receiving

    def test_round_trip_with_the_length_in_clear(self) -> None:
        sending, receiving = self.ciphers()
        sealed = etm.seal(sending, 7, b"payload" * 10)
        self.assertEqual(int.from_bytes(sealed[:4], "big"), len(sealed) - 4 - 32)
        self.assertIsNone(etm.open_packet(receiving, 7, sealed[:-1]))  # incomplete
        self.assertEqual(etm.open_packet(receiving, 7, sealed + b"next"), (b"payload" * 10, len(sealed)))

    def test_a_forged_packet_is_refused_before_decryption(self) -> None:
        sending, receiving = self.ciphers()
        sealed = bytearray(etm.seal(sending, 7, b"payload"))
        sealed[10] ^= 1
        with self.assertRaises(etm.EtmError) as raised:
            etm.open_packet(receiving, 7, bytes(sealed))
        self.assertEqual(raised.exception.code, transport.DISCONNECT_MAC_ERROR)
        self.assertRaises(etm.EtmError, etm.open_packet, receiving, 8, etm.seal(sending, 7, b"x"))  # replayed


# ------------------------------------------------------------------ the transport
from tests.test_ssh_transport import _EchoService, _RecordingService, pump  # noqa: E402 -- the same test services


class _Client(etm.EtmTransport, transport.SSHClientTransport):
    supportedMACs = [*etm.ETM_MACS]
    service_requested: _RecordingService | None = None

    def verifyHostKey(self, hostKey: bytes, fingerprint: bytes) -> defer.Deferred[bool]:
        return defer.succeed(True)

    def connectionSecure(self) -> None:
        if self.service_requested is None:
            self.service_requested = _RecordingService()
            self.requestService(self.service_requested)


class _HybridClient(_Client):
    """mlkem768x25519-sha256 on the client side (Conch's client has none)."""

    supportedKeyExchanges = [b"mlkem768x25519-sha256"]

    def ssh_KEXINIT(self, packet: bytes) -> None:
        if transport.SSHTransportBase.ssh_KEXINIT(self, packet) is None:
            return
        chosen = self.nextEncryptions
        self.nextEncryptions = etm.EtmCiphers(chosen.outCipType, chosen.inCipType, chosen.outMACType, chosen.inMACType)
        self.kem, self.curve = mlkem.MLKEM768PrivateKey.generate(), x25519.X25519PrivateKey.generate()
        self.client_init = self.kem.public_key().public_bytes_raw() + self.curve.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.sendPacket(30, common.NS(self.client_init))

    def ssh_KEX_DH_GEX_GROUP(self, packet: bytes) -> None:  # 31: the hybrid reply
        host_key, reply, signature, _ = common.getNS(packet, 3)
        secret = self.kem.decapsulate(reply[:1088]) + self.curve.exchange(
            x25519.X25519PublicKey.from_public_bytes(reply[1088:]))
        shared = common.NS(hashlib.sha256(secret).digest())
        exchange_hash = hashlib.sha256(b"".join([
            common.NS(self.ourVersionString), common.NS(self.otherVersionString), common.NS(self.ourKexInitPayload),
            common.NS(self.otherKexInitPayload), common.NS(host_key), common.NS(self.client_init), common.NS(reply),
            shared])).digest()
        assert keys.Key.fromString(host_key).verify(signature, exchange_hash)
        self._keySetup(shared, exchange_hash)


class _HeldPool:
    """Keeps each job until the test releases it (computed as a worker would)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[dict[str, Any], defer.Deferred[dict[str, Any]]]] = []
        self.done: dict[int, Any] = {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def submit(self, job: dict[str, Any], done: Any, source: str) -> defer.Deferred[dict[str, Any]]:
        def cancel(waiting: defer.Deferred[dict[str, Any]]) -> None:  # as if still queued
            self.jobs.remove((job, waiting))
            self.done.pop(id(job))()

        waiting: defer.Deferred[dict[str, Any]] = defer.Deferred(cancel)
        self.jobs.append((job, waiting))
        self.done[id(job)] = done
        return waiting

    def release(self) -> None:
        job, waiting = self.jobs.pop(0)
        self.done.pop(id(job))()
        answer = kexworker.run_job(job)
        if "error" in answer:
            waiting.errback(KexJobError(answer["error"]))
        else:
            waiting.callback(answer)


class TransportTests(TestCase):
    def setUp(self) -> None:
        self.pool = _HeldPool()
        self.admission = KexAdmission(per_source=1, max_pending=10)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def factory(self, legacy: bool = True) -> NXSSHFactory:
        host_key = keys.Key(ed25519.Ed25519PrivateKey.generate())
        factory = NXSSHFactory(None, {b"ssh-ed25519": host_key}, 120, 6,
                               KexService(algorithms.policy(legacy), self.pool, self.admission, OncePer(lambda: 0.0)))
        factory.services = {b"ssh-userauth": _EchoService}
        factory.primes = {2048: [GROUP14]}  # legacy: 2048 bits allowed (a small test group)
        return factory

    def connect(self, client: _Client, factory: NXSSHFactory | None = None) -> tuple[Any, StringTransport, StringTransport]:
        server = (factory or self.factory()).buildProtocol(None)
        server_wire, client_wire = StringTransport(), StringTransport()
        server.makeConnection(server_wire)
        client.makeConnection(client_wire)
        self.pump(server, server_wire, client, client_wire)
        return server, server_wire, client_wire

    pump = staticmethod(pump)

    def finish(self, server: Any, server_wire: StringTransport, client: _Client, client_wire: StringTransport) -> None:
        while self.pool.jobs:
            self.pool.release()
            self.pump(server, server_wire, client, client_wire)
        self.assertIsNotNone(client.service_requested)
        client.sendPacket(ECHO, b"hello")
        self.pump(server, server_wire, client, client_wire)
        assert client.service_requested is not None
        self.assertEqual(client.service_requested.received, [b"hello"])

    def test_group_exchange_waits_for_the_pool_and_reads_nothing_meanwhile(self) -> None:
        client = _Client()
        client.supportedKeyExchanges = [b"diffie-hellman-group-exchange-sha256"]
        server, server_wire, client_wire = self.connect(client)
        self.assertEqual(len(self.pool.jobs), 1)  # the client's GEX_INIT is being computed
        self.assertEqual(self.pool.jobs[0][0]["op"], "dh")
        self.assertEqual(self.admission.pending, 1)
        dispatched: list[int] = []
        original = server.dispatchMessage
        server.dispatchMessage = lambda number, payload: (dispatched.append(number), original(number, payload))
        client.sendIgnore(b"meanwhile")  # the client says more before our reply
        self.pump(server, server_wire, client, client_wire)
        self.assertEqual(dispatched, [])  # held, not read
        self.finish(server, server_wire, client, client_wire)
        self.assertEqual(dispatched[0], transport.MSG_IGNORE)
        self.assertEqual(self.admission.pending, 0)
        self.assertEqual(server.nextEncryptions.inMACType, b"hmac-sha2-512-etm@openssh.com")

    def test_fixed_group_and_hybrid_go_through_the_pool(self) -> None:
        clients = [(_Client(), "dh")] + ([(_HybridClient(), "mlkem768x25519")] if mlkem is not None else [])
        for client, operation in clients:
            if operation == "dh":
                client.supportedKeyExchanges = [b"diffie-hellman-group14-sha1"]
            server, server_wire, client_wire = self.connect(client)
            self.assertEqual([job["op"] for job, _ in self.pool.jobs], [operation])
            self.finish(server, server_wire, client, client_wire)

    def test_the_hybrid_is_offered_and_chosen_by_default(self) -> None:
        need_mlkem()
        client = _HybridClient()
        server, server_wire, client_wire = self.connect(client, self.factory(legacy=False))
        self.assertEqual(server.kexAlg, b"mlkem768x25519-sha256")
        self.finish(server, server_wire, client, client_wire)

    def test_a_client_leaving_drops_its_queued_job(self) -> None:
        client = _Client()
        client.supportedKeyExchanges = [b"diffie-hellman-group-exchange-sha256"]
        server, _, _ = self.connect(client)
        self.assertEqual(len(self.pool.jobs), 1)
        server.connectionLost(None)
        self.assertEqual(self.pool.jobs, [])
        self.assertEqual(self.admission.pending, 0)

    def test_too_many_from_one_address_are_refused_and_logged_once(self) -> None:
        factory = self.factory()
        for _ in range(3):
            client = _Client()
            client.supportedKeyExchanges = [b"diffie-hellman-group-exchange-sha256"]
            server, server_wire, _ = self.connect(client, factory)
        self.assertEqual(len(self.pool.jobs), 1)  # per_source=1: only the first one queued
        self.assertTrue(server_wire.disconnecting)
        refusals = [formatEvent(e) for e in self.events if "refused" in formatEvent(e) and "key exchange" in formatEvent(e)]
        self.assertEqual(len(refusals), 1, refusals)
        self.assertIn("192.168.1.1", refusals[0])  # StringTransport's peer
        self.assertIn("already pending", refusals[0])

    def test_junk_values_cost_no_worker(self) -> None:
        client = _Client()
        client.supportedKeyExchanges = [b"diffie-hellman-group14-sha1"]
        client._startEphemeralDH = lambda: (setattr(client, "dhSecretKeyPublicMP", common.MP(1)),
                                            setattr(client, "dhSecretKey", None))
        server, server_wire, _ = self.connect(client)
        self.assertEqual(self.pool.jobs, [])
        self.assertTrue(server_wire.disconnecting)
        self.assertTrue(any("out of range" in formatEvent(e) for e in self.events))

    def test_a_client_without_common_algorithms_is_explained_in_the_log(self) -> None:
        client = _Client()
        client.supportedKeyExchanges = [b"diffie-hellman-group1-sha1"]
        self.connect(client, self.factory(legacy=False))
        lines = [formatEvent(e) for e in self.events if "no key exchange method in common" in formatEvent(e)]
        self.assertEqual(len(lines), 1)
        self.assertIn("diffie-hellman-group1-sha1", lines[0])
        self.assertIn("legacy_algorithms", lines[0])

    def test_a_second_key_exchange_message_is_refused(self) -> None:
        need_mlkem()
        """Conch would compute (and switch keys) again for each repeated INIT."""
        client = _HybridClient()
        server, server_wire, client_wire = self.connect(client, self.factory(legacy=False))
        self.finish(server, server_wire, client, client_wire)
        client.sendPacket(30, common.NS(client.client_init))
        self.pump(server, server_wire, client, client_wire)
        self.assertEqual(self.pool.jobs, [])
        self.assertTrue(server_wire.disconnecting)
        self.assertTrue(any("unexpected key-exchange message" in formatEvent(e) for e in self.events))

    def test_a_client_that_floods_while_its_exchange_is_pending_is_closed(self) -> None:
        client = _Client()
        client.supportedKeyExchanges = [b"diffie-hellman-group-exchange-sha256"]
        server, server_wire, _ = self.connect(client)
        self.assertEqual(len(self.pool.jobs), 1)
        server.dataReceived(b"x" * (server_module.HELD_INPUT_LIMIT // 2))
        self.assertFalse(server_wire.disconnecting)  # held
        server.dataReceived(b"x" * server_module.HELD_INPUT_LIMIT)
        self.assertTrue(server_wire.disconnecting)
