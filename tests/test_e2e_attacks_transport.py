"""End to end: attacks on the SSH transport and the doors' guard, played against the real gateway.

* **A zlib bomb**: one SSH_MSG_IGNORE of 400 MB of zeros, about 390 KiB
  compressed (tests/harness/sshattack.py).  With plain ``zlib`` it was
  inflated before login (780 MB of peak memory); now plain zlib is not
  negotiated, and ``zlib@openssh.com`` after the nx key's public login is cut
  at the 1 MiB packet limit: the gateway's peak memory grows by less than
  10 MB and the connection is closed.  OpenSSH with ``-C`` still logs in and
  rekeys with compression on.
* **Log floods**: global requests in a loop as ``nx`` (50,000 warning lines in
  10 s before) and 300 SFTP channels of a user each with a malformed packet
  (300 tracebacks at critical level before; a warning and a close each since
  the X2Go door checks its packets): now a few lines each and one count;
  rotated log files are bounded in number, and a rotation that meets EMFILE
  does not lose the log.
* **Idle connections from many addresses**: twenty addresses holding ten
  silent connections each on the SSH port, twenty more on the portal's: every
  NX login and every portal login still succeeds (11 of 13 failed before).
* **Frozen key-exchange workers**: with every worker SIGSTOPped, a login with
  group exchange only still succeeds (each failed at the 30 s deadline before).

Figures are printed; timings of logins under attack are bench/attacks.py's.
"""

from __future__ import annotations

import glob
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO, Gateway
from tests.harness.process import Timeout, wait_for
from tests.harness.ssh import NXClient
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.web import web_base, web_options
from tests.test_e2e_preauth import Flood, web_login

#: What the attack may cost the gateway's peak memory.
BOMB_BUDGET_KB = 10 * 1024
GEX_ONLY = ["-o", "KexAlgorithms=diffie-hellman-group-exchange-sha256"]
#: Generous: a login under attack must succeed, not be fast (bench/attacks.py times it).
DEADLINE = 30.0


def attack(port: int, *args: str, timeout: float = 300) -> dict:
    """tests/harness/sshattack.py's report."""
    done = subprocess.run([sys.executable, "-m", "tests.harness.sshattack", *args, "--port", str(port)],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                          timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise AssertionError(f"the attacker said nothing: {done.stderr[-3000:]}")
    return json.loads(lines[-1])


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))


def peak_growth_kb(pid: int, run) -> tuple[int, object]:  # type: ignore[no-untyped-def]
    """How far above its memory before ``run()`` the process's peak RSS went
    (the peak is reset first: /proc/PID/clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as handle:
        handle.write("5")
    before = status_kb(pid, "VmRSS")
    result = run()
    return status_kb(pid, "VmHWM") - before, result


def settled_files(pid: int) -> set[int] | None:
    """The process's open descriptors, once they stay the same for a second (its start is over)."""
    first = set(map(int, os.listdir(f"/proc/{pid}/fd")))
    time.sleep(1)
    return first if first == set(map(int, os.listdir(f"/proc/{pid}/fd"))) else None


def all_logs(gateway: Gateway) -> str:
    text = ""
    for path in sorted(glob.glob(gateway.logfile + "*")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            text += handle.read()
    return text


class RootTestCase(TestCase):
    timeout = 600

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)

    def gateway(self, options: dict[str, dict[str, str]] | None = None) -> Gateway:
        gateway = Gateway(options).start()
        self.addCleanup(gateway.stop)
        return gateway


class CompressionBombTests(RootTestCase):
    def test_plain_zlib_is_not_negotiated_so_a_bomb_before_login_costs_nothing(self) -> None:
        gateway = self.gateway()
        growth, report = peak_growth_kb(gateway.process.pid, lambda: attack(gateway.port, "bomb", "--compression",
                                                                            "zlib", "--before-login"))
        print(f"\n    plain zlib before login: {report}; the gateway's peak memory grew {growth} kB")
        self.assertLess(growth, BOMB_BUDGET_KB)
        self.assertIsNone(report["compression"])  # no compression in common: the client gave up
        self.assertEqual(report["sent"], 0)
        self.assertTrue(report["closed"])
        wait_for(lambda: "no compression in common (the client offers zlib)" in gateway.log(), 10, "the refusal")
        self.assertIn("never plain zlib", gateway.log())

    def test_a_bomb_after_the_nx_keys_login_is_cut_at_the_packet_limit(self) -> None:
        """zlib@openssh.com starts after user authentication: the nx key is
        public, so anyone gets that far, and the inflate must be bounded."""
        gateway = self.gateway()
        attack(gateway.port, "global-requests", "--seconds", "0.1")  # one login first: its own cost is not the bomb's
        growth, report = peak_growth_kb(gateway.process.pid, lambda: attack(gateway.port, "bomb", "--compression",
                                                                            "zlib@openssh.com,zlib"))
        print(f"\n    zlib@openssh.com after the nx key's login: {report}; the gateway's peak memory grew {growth} kB")
        self.assertEqual((report["compression"], report["authenticated"], report["sent"]),
                         ("zlib@openssh.com", True, 1))
        self.assertGreater(report["bomb_bytes"], 300_000)
        self.assertLess(growth, BOMB_BUDGET_KB)
        self.assertTrue(report["closed"])
        self.assertIn("inflates to more than 1048576 bytes, the packet limit", report["disconnect"])
        self.assertRegex(gateway.log(), r"SSH connection from 127\.0\.0\.1:\d+ closed: a compressed packet of \d+ bytes"
                                        r" inflates to more than 1048576 bytes")
        self.assertNotIn("Traceback", gateway.log())

    def test_openssh_with_compression_logs_in_and_rekeys(self) -> None:
        """``ssh -C`` negotiates zlib@openssh.com: compression after the
        login, fresh at each key exchange (a rekey every 2 KB here)."""
        user = create_user()
        self.addCleanup(user.remove)
        gateway = self.gateway()
        client = NXClient(gateway.port, extra=["-C", "-v", "-o", "RekeyLimit=2K"])
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103", client.login(user.name, user.password))
        client.prompt()
        for _ in range(40):
            self.assertIn(b"NX> 503", client.command("nosuchcommand " + "x" * 200))
        client.process.stdin.close()
        client.process.wait(30)
        debug = client.stderr().decode(errors="replace")
        negotiated = sorted({line.split("compression: ")[1].strip() for line in debug.splitlines()
                             if "compression: " in line})
        self.assertEqual(negotiated, ["zlib@openssh.com"])
        self.assertIn("Enabling compression at level 6", debug)
        self.assertGreaterEqual(debug.count("SSH2_MSG_KEXINIT received"), 3)


class LogFloodTests(RootTestCase):
    def test_floods_of_refusals_and_tracebacks_write_a_few_lines_and_then_a_count(self) -> None:
        user = create_user()
        self.addCleanup(user.remove)
        gateway = self.gateway()
        requests = attack(gateway.port, "global-requests", "--seconds", "10")
        junk = attack(gateway.port, "sftp-junk", "--user", user.name, "--password", user.password, "--count", "300",
                      "--linger", "3")
        self.assertTrue(requests["authenticated"] and junk["authenticated"])
        self.assertGreater(requests["replies"], 1000)  # the flood ran, and was answered
        self.assertEqual(junk["sent"], 300)
        logs = all_logs(gateway)
        refusals = logs.count("refused global request")
        tracebacks = logs.count("Traceback")
        malformed = len(re.findall(r"malformed SFTP packet|Failed to handle packet", logs))
        print(f"\n    {requests['replies']} global requests in 10 s: {refusals} lines; 300 SFTP channels with a malformed"
              f" packet: {malformed} lines, {tracebacks} tracebacks; log {len(logs)} bytes")
        self.assertLessEqual(refusals, 10)
        self.assertLessEqual(tracebacks, 10)
        self.assertLessEqual(malformed, 10)
        self.assertLess(len(logs), 100_000)
        # When their minute is over, each flood is told as one count.
        wait_for(lambda: len(re.findall(r"refused global request .* more like it", gateway.log())) == 1
                 and re.search(r"(malformed SFTP packet|Failed to handle packet).* \.\.\. and 29\d more like it",
                               gateway.log()),
                 90, "the counts of what was held back", interval=1)
        counted = re.search(r"refused global request .* \.\.\. and (\d+) more like it", gateway.log())
        assert counted is not None
        self.assertEqual(int(counted.group(1)) + refusals, requests["replies"])

    def test_rotated_log_files_are_bounded_in_number(self) -> None:
        gateway = self.gateway({"server": {"log_rotated_files": "3"}})
        for n in range(6):  # twistd rotates on SIGUSR1 as at 1 MB
            gateway.process.send_signal(signal.SIGUSR1)
            wait_for(lambda: os.path.exists(gateway.logfile + f".{min(n + 1, 3)}"), 10, "the rotation")
            with socket.create_connection(("127.0.0.1", gateway.port), timeout=10):
                pass  # a line in the new file
            wait_for(lambda: "SSH connection from" in gateway.log(), 10, "a line in the new file")
        rotated = sorted(os.path.basename(path) for path in glob.glob(gateway.logfile + ".*"))
        self.assertEqual(rotated, ["gateway.log.1", "gateway.log.2", "gateway.log.3"])

    def test_the_log_goes_on_after_a_rotation_that_finds_no_free_file(self) -> None:
        """EMFILE at a rotation: lines go on into the renamed file, and into
        a new one once files are free again.  (Twisted closed the file first
        and left the gateway with no log until a restart.)"""
        gateway = self.gateway()
        pid = gateway.process.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        used = wait_for(lambda: settled_files(pid), 60, "the gateway to finish starting", interval=0.5)
        lowest_free = next(n for n in range(len(used) + 1) if n not in used)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, hard))  # every open now fails with EMFILE
        try:
            gateway.process.send_signal(signal.SIGUSR1)
            wait_for(lambda: os.path.exists(gateway.logfile + ".1"), 10, "the rotation")
            with socket.socket() as sock:  # the gateway cannot even accept it: a line about that
                sock.settimeout(5)
                sock.connect(("127.0.0.1", gateway.port))
                time.sleep(1)
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        time.sleep(1.5)  # a new file is tried once a second
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            sock.recv(100)
        wait_for(lambda: "SSH connection from" in gateway.log(), 20, "a line in a new log file")
        self.assertIn("the log could not be reopened at its rotation (Too many open files)", gateway.log())
        with open(gateway.logfile + ".1", encoding="utf-8", errors="replace") as handle:
            self.assertIn("EMFILE encountered", handle.read())  # what happened meanwhile went on into the old file


class IdleFloodTests(RootTestCase):
    """Twenty addresses with ten silent connections each on the SSH port,
    twenty more on the portal's (400 in all, each door's total full), kept up
    as the gateway closes them: NX and portal logins from another address all
    succeed."""

    ADDRESSES = 20
    EACH = 10
    LOGINS = 13

    def test_idle_connections_from_many_addresses_stop_no_login_at_any_door(self) -> None:
        user = create_user()
        self.addCleanup(user.remove)
        gateway = self.gateway({**web_options(), "server": {"login_grace_time": "120"}})
        base = web_base(gateway)
        web_port = int(base.rsplit(":", 1)[1])
        ssh_sources = ",".join(f"127.0.1.{n}" for n in range(1, self.ADDRESSES + 1))
        web_sources = ",".join(f"127.0.2.{n}" for n in range(1, self.ADDRESSES + 1))
        for sources, port in ((ssh_sources, gateway.port), (web_sources, web_port)):
            flood = Flood(sources, port, self.EACH)
            self.addCleanup(flood.close)
        time.sleep(5)  # the floods hold their connections, reopening what is closed
        nx_ok = portal_ok = 0
        failures = []
        for _ in range(self.LOGINS):
            client = NXClient(gateway.port)
            try:
                client.greet()
                if b"NX> 103" in client.login(user.name, user.password):
                    nx_ok += 1
            except Timeout as error:
                failures.append(f"NX: {str(error)[:200]}")
            finally:
                client.close()
            try:
                if 'action="/logout"' in web_login(base, user.name, user.password):
                    portal_ok += 1
            except OSError as error:
                failures.append(f"portal: {error}")
        status = json.loads(subprocess.run(
            [sys.executable, "-m", "nxgate.gateway.doors.admin.cli", "--state-dir", gateway.state_dir, "--json",
             "status"], capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=REPO)).stdout)
        print(f"\n    under 2 x {self.ADDRESSES} x {self.EACH} idle connections: NX logins {nx_ok}/{self.LOGINS},"
              f" portal logins {portal_ok}/{self.LOGINS}; gateway: {status.get('result')}; {failures[:3]}")
        self.assertEqual((nx_ok, portal_ok), (self.LOGINS, self.LOGINS), failures)
        self.assertIn("to make room for newcomers", all_logs(gateway))


class FrozenWorkerTests(RootTestCase):
    def test_a_group_exchange_login_succeeds_with_every_key_exchange_worker_stopped(self) -> None:
        user = create_user()
        self.addCleanup(user.remove)
        gateway = self.gateway()
        workers = wait_for(lambda: len(kex_workers(gateway.process.pid)) == 2 and kex_workers(gateway.process.pid),
                           20, "the key-exchange workers")
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
            self.addCleanup(_kill_quietly, pid)
        times = []
        for _ in range(2):
            started = time.monotonic()
            client = NXClient(gateway.port, extra=GEX_ONLY)
            try:
                client.greet()
                answer = client.login(user.name, user.password)
            finally:
                client.close()
            times.append(round(time.monotonic() - started, 2))
            self.assertIn(b"NX> 103", answer)
            self.assertLess(times[-1], DEADLINE)
        print(f"\n    group-exchange logins with the workers stopped: {times} s")
        self.assertIn("it is stopped; it is replaced and the job tried again", gateway.log())
        for pid in workers:  # killed by the gateway, not left stopped
            wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z", 10, "the stopped worker's end")


def kex_workers(gateway_pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline") as handle:
                command = handle.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == gateway_pid and "kexworker" in command:
            found.append(int(entry))
    return found


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2:].split()[0]


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
