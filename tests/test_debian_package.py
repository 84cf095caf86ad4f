"""The Debian package, built, installed and used as an admin would.

Builds ``nxgate_*.deb`` with ``dpkg-buildpackage`` from a copy of this
checkout, installs it with apt (so every dependency comes from Debian:
Twisted 22.4, python-pam 2.0.2, ...), starts the *installed* gateway the way
its systemd unit does (Debian's ``/usr/bin/python3``, not the venv), logs in
over the real OpenSSH client as a real Unix user, starts a session, draws it
on an Xvfb client screen with nxproxy through the gateway, terminates it, and
purges the package again.  Before that, it installs and purges the package
over an admin's own /etc/pam.d/nxgate, which must survive both.

It installs and removes system packages, so it only runs when asked:

    NXGATE_TEST_DEB=1 PYTHONPATH=. .venv/bin/trial tests.test_debian_package

as root, with ``dpkg-buildpackage`` installed (dpkg-dev).  Missing build
dependencies are installed with ``apt-get build-dep``.  Set
NXGATE_KEEP_TEST_DIRS=1 to keep the build directory and the gateway's log.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import stat
import subprocess
import tempfile

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO
from tests.harness.process import stop, wait_for
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.harness.users import create_user, is_root
from tests.harness.x11 import ClientScreen

ENABLE = "NXGATE_TEST_DEB"
# Debian 12 installs units in /lib, later releases in /usr/lib.
UNITS = ("/lib/systemd/system/nxgate.service", "/usr/lib/systemd/system/nxgate.service")
CONFIG = "/etc/nxgate/nxgate.conf"
PAM_SERVICE = "/etc/pam.d/nxgate"
# The installed programs see nothing of the test's environment (no PYTHONPATH
# pointing at the checkout, no venv): as under systemd.
SYSTEM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
START = ('startsession --session="deb" --type="unix-console" --geometry="800x600" '
         '--screeninfo="800x600x24+render" --link="lan" --encryption="1" --cache="16M" --images="64M" '
         '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1" --cookie="0123456789abcdef"')
LISTENING = re.compile(r"NXSSHFactory starting on (\d+)")


def skip_reason() -> str | None:
    if os.environ.get(ENABLE) != "1":
        return f"builds, installs and purges the Debian package: set {ENABLE}=1 to run it (CI does)"
    if not is_root():
        return "installing the Debian package needs root"
    for program in ("dpkg-buildpackage", "apt-get", "git", "Xvfb"):
        if shutil.which(program) is None:
            return f"{program} is not installed"
    return None


def run(argv: list[str], log: str, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 900) -> None:
    """Run a command with its output in ``log``; fail with the log's end."""
    with open(log, "ab") as handle:
        handle.write(f"\n$ {' '.join(argv)}\n".encode())
        handle.flush()
        result = subprocess.run(argv, cwd=cwd, env=env or APT_ENV, stdin=subprocess.DEVNULL, stdout=handle,
                                stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if result.returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as handle:
            tail = handle.read()[-6000:]
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{tail}")


def copy_checkout(target: str) -> None:
    """The files git would commit, as they are in the working tree: tracked
    files with their current changes, plus new files not ignored (debian/ may
    not be committed yet); build products and ignored files stay behind."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, check=True).stdout
    for name in sorted(set(filter(None, listing.decode().split("\0")))):
        source = os.path.join(REPO, name)
        if not os.path.lexists(source):  # deleted in the working tree
            continue
        destination = os.path.join(target, name)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        if os.path.islink(source):
            os.symlink(os.readlink(source), destination)
        else:
            shutil.copy2(source, destination)


def unit_path() -> str:
    found = [path for path in UNITS if os.path.isfile(path)]
    if not found:
        raise AssertionError(f"no unit in {UNITS}")
    return found[0]


def unit_exec_start() -> list[str]:
    path = unit_path()
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("ExecStart="):
                return line[len("ExecStart="):].split()
    raise AssertionError(f"no ExecStart= in {path}")


def unit_settings() -> dict[str, str]:
    with open(unit_path(), encoding="utf-8") as handle:
        return dict(line.strip().split("=", 1) for line in handle
                    if "=" in line and not line.lstrip().startswith(("#", ";")))


def installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return result.stdout.strip().endswith(" installed")


class DebianPackageTests(TestCase):
    timeout = 1800

    def setUp(self):
        reason = skip_reason()
        if reason:
            raise SkipTest(reason)
        self.workdir = tempfile.mkdtemp(prefix="nxgate-deb-")
        os.chmod(self.workdir, 0o755)
        self.log = os.path.join(self.workdir, "build.log")
        if not os.environ.get("NXGATE_KEEP_TEST_DIRS"):
            self.addCleanup(shutil.rmtree, self.workdir, True)

    def test_build_install_login_purge(self):
        deb = self.build()
        self.keep_real_pam_service()
        self.addCleanup(self.purge_quietly)
        self.admins_pam_service_survives(deb)
        os.unlink(PAM_SERVICE)  # a fresh machine: the package installs the PAM service, and purges it
        self.install(deb)
        self.check_installed_files()
        self.use_installed_gateway()
        run(["apt-get", "purge", "-y", "-q", "nxgate"], self.log)
        self.assertFalse(installed("nxgate"))
        for path in ("/etc/nxgate", "/var/lib/nxgate", "/usr/lib/nxgate", PAM_SERVICE, *UNITS):
            self.assertFalse(os.path.lexists(path), f"{path} is still there after the purge")
        # The package's trigger had python3-twisted rebuild its plugin cache.
        for cache in glob.glob("/usr/lib/python3/dist-packages/twisted/plugins/dropin.cache"):
            with open(cache, "rb") as handle:
                self.assertNotIn(b"nxgate", handle.read())

    # ------------------------------------------------------------------ steps
    def install(self, deb: str) -> None:
        install = ["apt-get", "install", "-y", "-q", "--reinstall", deb]
        try:
            run(install, self.log)
        except AssertionError:  # stale or missing package lists: once more, after an update
            run(["apt-get", "update", "-q"], self.log)
            run(install, self.log)

    def keep_real_pam_service(self) -> None:
        """This machine's own /etc/pam.d/nxgate (other gateways on it log in
        with it) comes back as it was, whatever the test does to it."""
        try:
            with open(PAM_SERVICE, "rb") as handle:
                saved: bytes | None = handle.read()
        except FileNotFoundError:
            saved = None

        def restore():
            if saved is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(PAM_SERVICE)
                return
            with open(PAM_SERVICE + ".nxgate-test", "wb") as handle:
                handle.write(saved)
            os.chmod(PAM_SERVICE + ".nxgate-test", 0o644)
            os.replace(PAM_SERVICE + ".nxgate-test", PAM_SERVICE)

        self.addCleanup(restore)

    def admins_pam_service_survives(self, deb: str) -> None:
        """A PAM service that was there before the package (``make install``
        puts one there) is the admin's: install and purge leave it alone."""
        with open(os.path.join(REPO, "conf", "pam.d", "nxgate"), "rb") as handle:
            admins = handle.read() + b"# the admin's own line, kept by the package\n"
        with open(PAM_SERVICE + ".nxgate-test", "wb") as handle:
            handle.write(admins)
        os.chmod(PAM_SERVICE + ".nxgate-test", 0o644)
        os.replace(PAM_SERVICE + ".nxgate-test", PAM_SERVICE)
        self.install(deb)
        with open(PAM_SERVICE, "rb") as handle:
            self.assertEqual(handle.read(), admins)
        run(["apt-get", "purge", "-y", "-q", "nxgate"], self.log)
        with open(PAM_SERVICE, "rb") as handle:
            self.assertEqual(handle.read(), admins, "the purge changed or removed the admin's PAM service")

    def build(self) -> str:
        source = os.path.join(self.workdir, "nxgate")
        copy_checkout(source)
        checked = subprocess.run(["dpkg-checkbuilddeps"], cwd=source, capture_output=True, check=False)
        if checked.returncode != 0:
            run(["apt-get", "update", "-q"], self.log)
            run(["apt-get", "build-dep", "-y", "-q", "./"], self.log, cwd=source)
        run(["dpkg-buildpackage", "-us", "-uc", "-b"], self.log, cwd=source)
        debs = glob.glob(os.path.join(self.workdir, "nxgate_*.deb"))
        self.assertEqual(len(debs), 1, debs)
        return debs[0]

    def purge_quietly(self):
        if installed("nxgate") or os.path.exists("/etc/nxgate"):
            subprocess.run(["apt-get", "purge", "-y", "-q", "nxgate"], env=APT_ENV, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def check_installed_files(self):
        for path in (CONFIG, "/etc/nxgate/nx_authorized_keys", PAM_SERVICE):
            self.assertTrue(os.path.isfile(path), path)
        with open("/var/lib/dpkg/info/nxgate.conffiles", encoding="utf-8") as handle:
            conffiles = handle.read().split()
        for path in (CONFIG, "/etc/nxgate/nx_authorized_keys"):
            self.assertIn(path, conffiles)
        # Not a conffile (dpkg would purge an admin's own), but the package's.
        self.assertNotIn(PAM_SERVICE, conffiles)
        with open(PAM_SERVICE, "rb") as installed_file, \
                open(os.path.join(REPO, "conf", "pam.d", "nxgate"), "rb") as shipped:
            self.assertEqual(installed_file.read(), shipped.read())

        state = os.stat("/var/lib/nxgate")
        self.assertEqual((stat.S_IMODE(state.st_mode), state.st_uid), (0o711, 0))

        # nxcopy: where nxgate-shell looks, built as a hardened PIE.
        nxcopy = "/usr/lib/nxgate/nxcopy"
        self.assertTrue(os.access(nxcopy, os.X_OK))
        self.assertFalse(os.path.exists("/usr/bin/nxcopy"))
        with open(nxcopy, "rb") as handle:
            header = handle.read(18)
        self.assertEqual(header[:4], b"\x7fELF")
        self.assertEqual(int.from_bytes(header[16:18], "little"), 3, "nxcopy is not a PIE (ET_DYN)")
        dynamic = subprocess.run(["readelf", "-d", nxcopy], capture_output=True, text=True, check=True).stdout
        self.assertIn("BIND_NOW", dynamic)

        # The unit runs a program that exists, and keeps sessions on restart.
        argv = unit_exec_start()
        self.assertTrue(os.access(argv[0], os.X_OK), f"the unit's ExecStart program {argv[0]} is missing")
        self.assertEqual(unit_settings().get("KillMode"), "process")
        result = subprocess.run(["systemd-analyze", "verify", unit_path()], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

        # The installed code, with the installed configuration.
        where = subprocess.run(["/usr/bin/python3", "-c", "import nxgate; print(nxgate.__file__)"],
                               env=SYSTEM_ENV, cwd="/", capture_output=True, text=True, check=True).stdout
        self.assertTrue(where.startswith("/usr/lib/python3/dist-packages/nxgate/"), where)
        check = subprocess.run(["/usr/bin/nxgate-config", "check", CONFIG], env=SYSTEM_ENV, cwd="/",
                               capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        keys = subprocess.run(["/usr/bin/python3", "-c", "from nxgate import config; "
                               f"print(config.load({CONFIG!r}).ssh.nx_authorized_keys)"],
                              env=SYSTEM_ENV, cwd="/", capture_output=True, text=True, check=True).stdout
        self.assertEqual(keys.strip(), "/etc/nxgate/nx_authorized_keys")

    def use_installed_gateway(self):
        state = os.path.join(self.workdir, "state")
        logfile = os.path.join(self.workdir, "gateway.log")
        program = unit_exec_start()[0]  # /usr/bin/twistd3 on Debian 12
        process = subprocess.Popen(
            [program, "--nodaemon", "--pidfile=", "--logfile", logfile, "nxgate", "--config", CONFIG,
             "--port", "tcp:0:interface=127.0.0.1", "--state-dir", state],
            cwd=self.workdir, env=SYSTEM_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

        def log() -> str:
            try:
                with open(logfile, encoding="utf-8", errors="replace") as handle:
                    return handle.read()
            except FileNotFoundError:
                return ""

        def listening() -> int | None:
            if process.poll() is not None:
                raise AssertionError(f"the installed gateway exited {process.returncode}:\n"
                                     f"{process.stderr.read().decode(errors='replace')}\n{log()}")
            found = LISTENING.findall(log())
            return int(found[-1]) if found else None

        def finish():
            stop(process)
            process.stderr.close()

        self.addCleanup(finish)
        port = wait_for(listening, 60, "the installed gateway to listen")
        self.assertRegex(log(), r"twistd [\d.]+ \(/usr/bin/python3 ")

        user = create_user()
        self.addCleanup(user.remove)  # also kills what is left of the user's processes

        client = NXClient(port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 404 ", client.login(user.name, "not-" + user.password))
        client.prompt()
        answer = client.login(user.name, user.password)
        self.assertIn(f" user: {user.name}\n".encode(), answer)
        self.assertIn(b"NX> 103 Welcome to: ", answer)
        client.prompt()
        listing = client.command('listsession --status="suspended,running" --type="unix-console"')
        self.assertIn(f"NX> 127 Session list of user '{user.name}':".encode(), listing)

        # A session: PAM session, setuid to the user, nxagent, xterm; then
        # nxproxy draws it on a client screen through the gateway's relay.
        reply = client.command(START, timeout=90)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        info = SessionInfo.parse(reply)
        screen = ClientScreen(800, 600)
        self.addCleanup(screen.close)
        attachment = Attachment(client, info, screen.name, self.workdir)
        self.addCleanup(attachment.detach)
        wait_for(lambda: f"{info.session_id} of {user.name}: waiting -> running" in log(), 60,
                 f"the session to run:\n{log()}")
        wait_for(lambda: screen.shot().colours() > 1, 30, "the session's picture on the client screen")

        controller = NXClient(port)
        self.addCleanup(controller.close)
        controller.greet()
        self.assertIn(b"NX> 103 ", controller.login(user.name, user.password))
        controller.prompt()
        reply = controller.command(f'terminate --sessionid="{info.session_id}"', timeout=60)
        self.assertIn(f"NX> 900 Session id: {info.session_id} terminated.".encode(), reply)
        controller.send("quit")
        controller.out.read_to_eof()
        wait_for(lambda: subprocess.run(["pgrep", "-u", user.name, "-x", "nxagent"],
                                        capture_output=True).returncode == 1, 20, "the agent to end")

        text = log()
        self.assertIn(f"NX login: user '{user.name}' from 127.0.0.1", text)
        for bad in ("Traceback", "Unhandled Error", "Unhandled error"):
            self.assertNotIn(bad, text, text)
        finish()
        # twistd ends itself with the signal it was stopped with.
        self.assertIn(process.returncode, (0, -15), log())
