"""End to end: jailed sessions ([jail] enabled) with the real bubblewrap.

Two users run jailed sessions at once.  Alice's session program is a probe
that writes what it can see (``ls /home``, ``ls -a /tmp``, ``ps ax``, Bob's
X display, a world-readable file in Bob's home and in /tmp) into her home,
then draws a green xterm through nxproxy.  Nothing of Bob's may show; the
session still suspends, survives a gateway SIGKILL, resumes and ends with
no process left behind.

Issue 22: a jailed session's portal thumbnails come from its own agent
while Bob listens on every host address of its display and gets nothing;
its program has no_new_privs; ps shows no session id.
"""

from __future__ import annotations

import html
import io
import json
import os
import pwd
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from twisted.trial.unittest import SkipTest

from nxgate.node.cgroups import SessionCgroups, own_cgroup
from tests.harness.gateway import Gateway
from tests.harness.process import wait_for
from tests.harness.web import web_base, web_options
from tests.test_e2e_sessions import BLUE, GREEN, TYPES, SessionTestCase, agent_processes, proc_status

PROBE = r"""#!/bin/sh
out="$HOME/probe.out"
{
echo "== home"; ls -a /home
echo "== tmp"; ls -a /tmp /tmp/.X11-unix /var/tmp
echo "== ps"; ps ax -o pid=,user:32=,args=
echo "== bob"; cat "@BOBHOME@/public.txt" "/tmp/@BOB@-public.txt"
echo "== bobx"
python3 - <<'EOF'
import socket
for name in ("/tmp/.X11-unix/X@BOBDISPLAY@", "\0/tmp/.X11-unix/X@BOBDISPLAY@"):
    try:
        socket.socket(socket.AF_UNIX).connect(name)
        print("CONNECTED", repr(name))
    except OSError as error:
        print("refused", repr(name), error)
EOF
echo "== end"
} > "$out.part" 2>&1
mv "$out.part" "$out"
exec xterm -bg '#00ff00' -geometry 50x10+30+30
"""


def processes_of(user: str) -> list[str]:
    result = subprocess.run(["ps", "-u", user, "-o", "pid=,args="], capture_output=True, text=True)
    return [line.strip() for line in result.stdout.splitlines()]


def cgroup_of(pid: int) -> str | None:
    """The cgroup v2 path of process ``pid``."""
    with open(f"/proc/{pid}/cgroup") as handle:
        return own_cgroup(handle.read())


class JailTests(SessionTestCase):
    options = {"jail": {"enabled": "yes", "pids_max": "200"}}

    def setUp(self):
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        super().setUp()

    def test_alice_sees_nothing_of_bob_and_her_session_lives_on(self):
        alice, bob = self.user, self.other
        # Bob's session runs, and he leaves world-readable files around.
        bob_session = self.start(self.login(bob), name="bob")
        for bob_agent in agent_processes(bob.name):  # his session is jailed too
            self.assertNotEqual(os.readlink(f"/proc/{bob_agent}/ns/pid"), os.readlink("/proc/self/ns/pid"))
        os.chmod(bob.home, 0o755)
        for path in (os.path.join(bob.home, "public.txt"), f"/tmp/{bob.name}-public.txt"):
            with open(path, "w") as handle:
                handle.write("BOB-SECRET\n")
            os.chmod(path, 0o644)
            self.addCleanup(lambda p=path: os.path.exists(p) and os.unlink(p))
        probe = os.path.join(alice.home, "probe.sh")
        with open(probe, "w") as handle:
            handle.write(PROBE.replace("@BOBHOME@", bob.home).replace("@BOB@", bob.name)
                         .replace("@BOBDISPLAY@", str(bob_session.display)))
        shutil.chown(probe, alice.name)
        os.chmod(probe, 0o755)

        client = self.login(alice)
        info = self.start(client, "unix-application", name="jailed", extra=f'--application="{probe}"')
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(GREEN, 10000)  # drawn through nxproxy from inside the jail
        output_path = os.path.join(alice.home, "probe.out")
        wait_for(lambda: os.path.exists(output_path), 15, "the probe's output")
        with open(output_path) as handle:
            output = handle.read()
        sections = dict(part.split("\n", 1) for part in output.split("== ")[1:])
        self.assertNotIn("BOB-SECRET", output)
        self.assertEqual(sections["bob"].count("No such file or directory"), 2)
        for name in ("home", "tmp", "ps", "bobx"):
            self.assertNotIn(bob.name, sections[name])
        self.assertEqual(sections["home"].split(), [".", "..", os.path.basename(alice.home)])
        # /tmp holds only the session's own X socket (and the path to the
        # test's state directory, which lives in /tmp); /var/tmp is empty.
        self.assertEqual(sorted(set(sections["tmp"].split()) - {".", "..", "/tmp:", "/tmp/.X11-unix:", "/var/tmp:"}),
                         sorted([".X11-unix", f".X{info.display}-lock", f"X{info.display}",
                                 os.path.basename(self.gateway.workdir)]))
        processes = [line.split(None, 2) for line in sections["ps"].splitlines() if line.strip()]
        # The jail's init (bubblewrap, root's) and the session's own processes.
        self.assertEqual(processes[0][:2], ["1", "root"])
        self.assertIn("bwrap", processes[0][2])
        self.assertEqual({user for _pid, user, _args in processes[1:]}, {alice.name})
        self.assertIn("nxagent", sections["ps"])
        self.assertLess(len(sections["ps"].splitlines()), 12)  # the session's processes, not the machine's
        self.assertNotIn("CONNECTED", sections["bobx"])
        # Resource limits: applied wherever this machine can (the test fails if they are not), else said once.
        groups = SessionCgroups(own=cgroup_of(self.gateway.process.pid))
        if groups.unavailable({"pids.max": "200"}) is None:
            with open(os.path.join(groups.parent, info.session_id, "pids.max")) as handle:
                self.assertEqual(handle.read().strip(), "200")
            with open(os.path.join(groups.parent, info.session_id, "cgroup.procs")) as handle:
                members = handle.read().split()
            self.assertTrue(members)
            self.assertTrue(set(map(str, agent_processes(alice.name))) & set(members))
        else:
            print(f"\njail limits cannot apply on this machine: {groups.unavailable({'pids.max': '200'})}")
            self.assertEqual(self.gateway.log().count("jailed sessions run WITHOUT their resource limits "
                                                      "(pids.max=200): "), 1)
        self.assertEqual(len([line for line in sections["bobx"].splitlines() if line.startswith("refused ")]), 2)

        # The gateway still manages the jailed agent: suspend...
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        # ... survive a SIGKILL of the gateway and take the session back ...
        agents = sorted(agent_processes(alice.name))
        self.gateway.process.kill()
        self.gateway.process.wait()
        self.gateway.process.stderr.close()
        self.gateway.process = None
        time.sleep(1)
        self.assertEqual(sorted(agent_processes(alice.name)), agents)
        restarted = Gateway(state_dir=self.gateway.state_dir, options={
            "sessions": {"display_base": "700", "display_limit": "100"}, "types": dict(TYPES),
            "jail": {"enabled": "yes", "pids_max": "200"}}).start()
        self.addCleanup(restarted.stop)
        self.gateway, old = restarted, self.gateway
        self.addCleanup(lambda: setattr(self, "gateway", old))
        wait_for(lambda: self.listing().get(info.session_id) == "Suspended", 30, "the session taken back")
        # ... resume it ...
        self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100)
        client = self.login(alice)
        resumed = self.restore(client, info.session_id)
        self.attach(client, resumed)
        self.screen.wait_for_colour(GREEN, 10000)
        self.wait_status(info.session_id, "Running")
        # ... and end it with nothing of hers left running.
        reply = self.login(alice).command(f'terminate --sessionid="{info.session_id}"', timeout=30)
        self.assertIn(b"NX> 900 ", reply)
        wait_for(lambda: not processes_of(alice.name), 15, f"{alice.name}'s processes to end")
        self.assertIn(f"session {info.session_id} of {alice.name}: jailed", old.log())


class JailedDesktopTests(SessionTestCase):
    """A whole XFCE desktop (session bus, panel, window manager) in a jail."""

    options = {"jail": {"enabled": "yes", "types": "unix-xfce"}}

    def test_xfce_desktop_renders_its_panel_in_a_jail(self):
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        self.xfce_desktop()
        agent = min(agent_processes(self.user.name))
        self.assertNotEqual(os.readlink(f"/proc/{agent}/ns/pid"), os.readlink("/proc/self/ns/pid"))
        panels = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xfce4-panel"], capture_output=True, text=True)
        (panel,) = panels.stdout.split()
        for namespace in ("pid", "mnt", "ipc"):  # the desktop shares the agent's jail
            self.assertEqual(os.readlink(f"/proc/{panel}/ns/{namespace}"), os.readlink(f"/proc/{agent}/ns/{namespace}"))


#: Bob on the host, where a jailed session's display does not exist: he
#: tries to take its abstract X socket, listens on its TCP port 6000+N and
#: on the host path /tmp/.X11-unix/XN (every address libxcb tries for
#: ``:N``), counts the connections he gets until stdin closes, then says
#: what he got as JSON.
LISTENER = r"""
import json, os, select, socket, sys
n = int(sys.argv[1])
listeners, result = [], {"abstract": "bound", "connections": []}
abstract = socket.socket(socket.AF_UNIX)
try:
    abstract.bind("\0/tmp/.X11-unix/X%d" % n)
    abstract.listen(8)
    listeners.append(("abstract", abstract))
except OSError as error:
    result["abstract"] = "refused: %s" % error
path = socket.socket(socket.AF_UNIX)
path.bind("/tmp/.X11-unix/X%d" % n)
path.listen(8)
listeners.append(("path", path))
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", 6000 + n))
tcp.listen(8)
listeners.append(("tcp", tcp))
print("listening", flush=True)
while True:
    ready, _, _ = select.select([sys.stdin] + [s for _, s in listeners], [], [])
    if sys.stdin in ready:
        break
    for name, s in listeners:
        if s in ready:
            connection, _ = s.accept()
            connection.settimeout(2)
            try:
                first = connection.recv(64)
            except OSError:
                first = b""
            result["connections"].append([name, first.hex()])
            connection.close()
os.unlink("/tmp/.X11-unix/X%d" % n)
print(json.dumps(result), flush=True)
"""


def insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None


def fetch(url: str, cookies: dict[str, str], data: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A plain HTTPS request to the portal; cookies it sets go into ``cookies``."""
    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=insecure()))
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={
        "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})
    try:
        with opener.open(request, timeout=60) as answer:
            status, content, headers = answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as error:
        status, content, headers = error.code, error.read(), error.headers
    for header in headers.get_all("Set-Cookie") or []:
        name, _, rest = header.partition("=")
        cookies[name.strip()] = rest.split(";", 1)[0]
    return status, content


class JailedThumbnailTests(SessionTestCase):
    """A jailed session's thumbnail comes from its own agent, and nobody
    listening on the host where its display would be gets a connection."""

    options = {"jail": {"enabled": "yes"}, **web_options(thumbnail_ttl="0.5")}

    def setUp(self):
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        super().setUp()

    def portal_login(self, user) -> tuple[str, dict[str, str]]:
        base = web_base(self.gateway)
        cookies: dict[str, str] = {}
        status, page = fetch(base + "/login", cookies)
        self.assertEqual(status, 200)
        token = html.unescape(re.search(rb'name="csrf" value="([^"]*)"', page).group(1).decode())
        status, _ = fetch(base + "/login", cookies, {"csrf": token, "user": user.name, "password": user.password})
        self.assertEqual(status, 303)
        self.assertIn("nxgate_login", cookies)
        return base, cookies

    def jailed_bluebox(self):
        client = self.login()
        info = self.start(client, "unix-bluebox", name="jailed-blue")
        self.attach(client, info)
        self.screen.wait_for_colour(BLUE, 10000)
        (agent,) = [pid for pid in agent_processes(self.user.name)
                    if proc_status(pid)["PPid"] not in map(str, agent_processes(self.user.name))]
        self.assertNotEqual(os.readlink(f"/proc/{agent}/ns/pid"), os.readlink("/proc/self/ns/pid"))  # jailed
        return info

    def test_thumbnails_come_from_the_jailed_agent_and_nobody_on_the_host_gets_a_connection(self):
        from PIL import Image

        info = self.jailed_bluebox()
        bob = pwd.getpwnam(self.other.name)
        listener = subprocess.Popen([sys.executable, "-c", LISTENER, str(info.display)], user=bob.pw_uid,
                                    group=bob.pw_gid, extra_groups=[], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, cwd="/")
        self.addCleanup(lambda: listener.poll() is None and (listener.kill(), listener.wait()))
        self.addCleanup(lambda: os.path.lexists(f"/tmp/.X11-unix/X{info.display}")
                        and os.unlink(f"/tmp/.X11-unix/X{info.display}"))
        self.assertEqual(listener.stdout.readline().strip(), "listening")

        base, cookies = self.portal_login(self.user)
        status, page = fetch(base + "/", cookies)
        self.assertEqual(status, 200)
        (thumb,) = re.findall(rb'<img class="thumb" src="(/thumb/[^"]+)"', page)
        # thumbnail_ttl is 0.5 s: each fetch 0.6 s after the last is a
        # redraw, 20 of them as many as a portal page left open for a
        # minute makes with the default 3 s.
        answers = []
        for _ in range(20):
            answers.append(fetch(base + thumb.decode(), cookies))
            time.sleep(0.6)
        listener.stdin.close()
        got = json.loads(listener.stdout.readline())
        self.assertEqual(got["connections"], [], "a host-side listener was reached with the session's cookie")
        self.assertEqual([status for status, _ in answers], [200] * 20, answers[-1])
        pictures = [png for _, png in answers]
        # The jail holds the display's abstract name: nobody can take it.
        self.assertTrue(got["abstract"].startswith("refused"), got)
        # ... and the picture is the session's: its blue xterm on black.
        image = Image.open(io.BytesIO(pictures[-1])).convert("RGB")
        colours = image.getcolors(image.width * image.height)
        blue = sum(count for count, colour in colours if colour == BLUE)
        self.assertGreater(blue, image.width * image.height // 20, colours[:5])
        self.assertNotIn(f"no thumbnail of session {info.session_id}", self.gateway.log())

    def test_the_jailed_session_program_has_no_new_privs(self):
        self.jailed_bluebox()
        jail = os.readlink(f"/proc/{min(agent_processes(self.user.name))}/ns/pid")
        programs = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xterm"], capture_output=True, text=True)
        # The session's program (one of an earlier test's may still be ending).
        (program,) = [pid for pid in programs.stdout.split() if os.readlink(f"/proc/{pid}/ns/pid") == jail]
        self.assertEqual(proc_status(int(program))["NoNewPrivs"], "1")

    def test_ps_shows_no_session_id(self):
        """The jailed agent's and its bubblewrap's command lines (world-
        readable) name neither the session nor its directory."""
        info = self.jailed_bluebox()
        agent = min(agent_processes(self.user.name))
        init = int(proc_status(agent)["PPid"])
        outer = int(proc_status(init)["PPid"])
        for pid in (agent, init, outer):
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().decode().split("\0")
            self.assertNotIn(info.session_id, " ".join(argv), argv)
            self.assertNotIn("sessions", " ".join(argv), argv)
        self.assertEqual(argv[:3], [shutil.which("bwrap"), "--args", "4"])


class JailedShadowTests(SessionTestCase):
    """Issue 25: a jailed session cannot be shadowed (its display exists only in its jail), so it is
    not offered, and asked for by id the answer says why -- never "refused by user" when the owner was
    never asked."""

    options = {"jail": {"enabled": "yes", "types": "unix-bluebox"},
               "shadow": {"admin_groups": "nxgatetestadmins", "consent_timeout": "8"},
               **web_options(admin_groups="nxgatetestadmins")}

    def setUp(self):
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        super().setUp()
        subprocess.run(["groupadd", "-f", "nxgatetestadmins"], check=True)
        subprocess.run(["usermod", "-aG", "nxgatetestadmins", self.other.name], check=True)

    def shadow_rows(self, user) -> set[str]:
        reply = self.login(user).command('listsession --type="shadow"')
        self.assertTrue(reply.endswith(b"NX> 105 "), reply)
        return {sid.decode() for sid in re.findall(rb"^\d+\s+[\w-]+\s+([0-9A-F]{32})\s", reply, re.MULTILINE)}

    def test_a_jailed_session_is_not_offered_and_refused_with_the_reason(self):
        from tests.harness.x11 import ClientScreen

        client = self.login()
        jailed = self.start(client, "unix-bluebox", name="jailed-blue")
        self.attach(client, jailed)
        self.screen.wait_for_colour(BLUE, 10000)
        other_screen = ClientScreen(800, 600)
        self.addCleanup(other_screen.close)
        client = self.login()
        free = self.start(client, "unix-console", name="free")  # not jailed: offered
        self.attach(client, free, other_screen)
        wait_for(lambda: free.session_id in self.shadow_rows(self.other), 20, "the free session offered")
        self.assertNotIn(jailed.session_id, self.shadow_rows(self.other))
        # The portal's admin page offers Shadow for the free session only (it offered it for every one).
        base, cookies = JailedThumbnailTests.portal_login(self, self.other)  # type: ignore[arg-type]
        status, page = fetch(base + "/admin", cookies)
        self.assertEqual(status, 200)
        rows = {html.unescape(name.decode()): b'action="/view/shadow"' in row
                for row in re.findall(rb'<tr class="session">.*?</tr>', page)
                for name in re.findall(rb'<td class="name">([^<]*)</td>', row)}
        self.assertEqual(rows, {"jailed-blue": False, "free": True})

        viewer = self.login(self.other)
        viewer.send(f'attachsession --type="shadow" --id="{jailed.session_id}" --display="0" '
                    '--geometry="800x600" --link="lan" --encryption="1"')
        reply = viewer.prompt(timeout=40)
        self.assertNotIn(b"refused by user", reply)
        self.assertNotIn(b"726 Asking user", reply)
        self.assertIn(b"runs in a jail", reply)
        self.assertIn(b"NX> 596 Error: Session", reply)
        self.assertIn(f"may not shadow {jailed.session_id} of {self.user.name}: it runs in a jail", self.gateway.log())
