"""The plumbing of issue 14 (sound, printing, folder sharing): what each NX
client variant sends, what the admin allows, what the agent and the client
are told (pure parts; tests/test_e2e_sound.py runs the real thing)."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.trial.unittest import TestCase

from nxgate.protocols import channels
from nxgate.config import ServicesSection
from nxgate.node.extras import Extras, grant
from nxgate.node.extras.ports import endpoints
from nxgate.protocols.nx import replies
from nxgate.protocols.nx.params import parse_params
from nxgate.protocols.nx.requests import restore_request, start_request
from tests.harness.clock import FakeReactor

# What the clients send on startsession (reference §2.5; the parts that matter here).
NOMACHINE_3 = ('--session="work" --type="unix-xfce" --cache="16M" --images="64M" --link="lan" --kbtype="pc105/us"'
               ' --media="1" --mediahelper="esd" --agent_server="" --agent_user="" --samba="1" --cups="1"'
               ' --nodelay="1" --encryption="1" --screeninfo="1024x768x24+render" --geometry="800x600"')
OPENNX = ('--session="work" --type="unix-xfce" --geometry="800x600" --client="linux" --keyboard="pc105/us"'
          ' --link="adsl" --samba="1" --cups="0" --media="1" --mediahelper="pa-44100" --encryption="1"')
NXCL = ('--session="nxcl" --type="unix-kde" --cache="8M" --images="32M" --cookie="abc" --link="adsl"'
        ' --kbtype="pc102/gb" --nodelay="1" --encryption="1" --backingstore="never" --geometry="fullscreen"'
        ' --media="0" --agent_server="" --agent_user="" --agent_password="" --screeninfo="1024x768x24+render"')


class ClientVariants(TestCase):
    def test_nomachine_gets_no_sound_for_its_esd_helper(self) -> None:
        """nxclient 3.x's sound server is nxesd (ESD): PulseAudio clients in
        the session could not talk to it."""
        self.assertEqual(start_request(parse_params(NOMACHINE_3)).services, {"printing", "sharing"})
        without_helper = NOMACHINE_3.replace(' --mediahelper="esd"', "")
        self.assertEqual(start_request(parse_params(without_helper)).services, {"sound", "printing", "sharing"})

    def test_opennx_native_pulseaudio_media_and_samba(self) -> None:
        self.assertEqual(start_request(parse_params(OPENNX)).services, {"sound", "sharing"})

    def test_nxcl_media_off(self) -> None:
        self.assertEqual(start_request(parse_params(NXCL)).services, frozenset())

    def test_restore_asks_again(self) -> None:
        request = restore_request(parse_params('--id="' + "A" * 32 + '" --media="1" --samba="0"'))
        self.assertEqual(request.services, {"sound"})

    def test_odd_values_are_no(self) -> None:
        request = start_request(parse_params('--type="unix-xfce" --media="esd" --cups="" --samba="yes"'))
        self.assertEqual(request.services, {"sharing"})

    def test_none_sent(self) -> None:
        self.assertEqual(start_request(parse_params('--type="unix-xfce"')).services, frozenset())


class Grant(TestCase):
    def test_admin_switch(self) -> None:
        self.assertEqual(grant({"sound", "printing"}, ServicesSection(printing=False)), ["sound"])
        self.assertEqual(grant({"sound", "bogus"}, ServicesSection()), ["sound"])
        self.assertEqual(grant(set(), ServicesSection()), [])


class Replies(TestCase):
    def lines(self, services: tuple[str, ...]) -> tuple[str, ...]:
        return replies.session_ready(full_id="h-1001-X", display=1001, session_type="unix-xfce", cookie="c",
                                     proxy_ip="127.0.0.1", encrypted=True, status="starting", services=services)

    def test_709_with_sharing_only(self) -> None:
        with_sharing = self.lines(("sharing", "sound"))
        self.assertIn("NX> 709 File-sharing port: 445", with_sharing)
        # FreeNX's order: after 707, before 1009/710.
        self.assertEqual(with_sharing.index("NX> 709 File-sharing port: 445"),
                         with_sharing.index("NX> 707 SSL tunneling: 1") + 1)
        self.assertFalse([line for line in self.lines(("sound",)) if line.startswith("NX> 709")])


class Channels(TestCase):
    def test_agent_options(self) -> None:
        self.assertEqual(channels.agent_options(["sound", "sharing", "printing"], 1001),
                         [("media", "8001"), ("cups", "3001"), ("smb", "4001")])
        self.assertEqual(channels.agent_options([], 1001), [])

    def test_too_high_display_has_no_port(self) -> None:
        self.assertIsNone(channels.channel_port("sound", 59000))
        self.assertEqual(channels.agent_options(["sound"], 59000), [])

    def test_endpoints(self) -> None:
        session = SimpleNamespace(display=1002, options={"services": ["sound", "printing"]})
        self.assertEqual(endpoints(session), {"sound": "127.0.0.1:8002", "printing": "127.0.0.1:3002"})

    def test_sound_cookie(self) -> None:
        cookie = channels.sound_cookie("0123456789abcdef0123456789abcdef")
        self.assertEqual(len(cookie), 256)
        self.assertEqual(cookie, channels.sound_cookie("0123456789abcdef0123456789abcdef"))
        self.assertNotEqual(cookie, channels.sound_cookie("0123456789abcdef0123456789abcdee"))


class Broken:
    name = "sound"

    def environment(self, session: object) -> dict[str, str]:
        raise RuntimeError("boom")

    async def start(self, session: object) -> None:
        raise RuntimeError("boom")

    async def stop(self, session: object) -> None:
        raise RuntimeError("boom")


class Hooks(TestCase):
    async def test_a_failing_extra_never_raises(self) -> None:
        session = SimpleNamespace(id="S", user="u", options={"services": ["sound"]})
        extras = Extras([Broken()])
        self.assertEqual(extras.environment(session), {})
        await extras.start(session)
        await extras.stop(session)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 3)

    def test_an_extra_that_cannot_be_imported_is_logged(self) -> None:
        """Issue 23: an ImportError used to skip an extra without a word."""
        extras = Extras.load(SimpleNamespace(), {"sound": "nxgate.node.extras.no_such_module"})
        self.assertEqual(extras.by_name, {})
        self.assertEqual(len(self.flushLoggedErrors(ImportError)), 1)

    def test_only_granted_extras(self) -> None:
        extras = Extras([Broken()])
        self.assertEqual(extras.of(SimpleNamespace(options={"services": ["printing"]})), [])
        self.assertEqual(len(extras.of(SimpleNamespace(options={"services": ["sound"]}))), 1)


class ClientSide(TestCase):
    """nxgate-client --sound: what it asks for and what its nxproxy is told."""

    def options(self, *argv: str):
        from nxgate.clients.nx.cli import parse_options

        return parse_options([*argv, "u@h"], {"DISPLAY": ":9"} if "--list" not in argv else {})

    def test_sound_asks_for_media(self) -> None:
        options = self.options("--geometry", "800x600", "--sound")
        self.assertIn(("media", "1"), options.request.params.pairs())
        self.assertEqual(options.sound_server, "")
        plain = self.options("--geometry", "800x600")
        self.assertIn(("media", "0"), plain.request.params.pairs())
        self.assertIsNone(plain.sound_server)

    def test_sound_server_needs_sound_and_a_session(self) -> None:
        from nxgate.clients.nx.cli import UsageError

        self.assertRaises(UsageError, self.options, "--geometry", "800x600", "--sound-server", "unix:/x")
        self.assertRaises(UsageError, self.options, "--list", "--sound")
        self.assertEqual(self.options("--geometry", "800x600", "--sound", "--sound-server", "unix:/x").sound_server,
                         "unix:/x")

    def test_nxproxy_gets_the_media_port(self) -> None:
        from nxgate.clients.nx.proxy import proxy_options
        from nxgate.protocols.nx.client_dialogue import SessionInfo

        info = SessionInfo(full_id="h-1001-" + "A" * 32, session_id="A" * 32, display=1001,
                           cookie="0123456789abcdef0123456789abcdef")
        self.assertIn(",media=4713,", proxy_options(info, "s", 1234, {"media": 4713}))
        self.assertNotIn("media", proxy_options(info, "s", 1234))

    def test_the_pulse_module_demands_the_cookie_on_loopback(self) -> None:
        from nxgate.clients.nx.sound import load_argv

        argv = load_argv("unix:/run/pulse", 4713, "/tmp/c")
        self.assertEqual(argv[:3], ["pactl", "--server", "unix:/run/pulse"])
        for word in ("listen=127.0.0.1", "auth-anonymous=0", "auth-cookie=/tmp/c", "port=4713"):
            self.assertIn(word, argv)
        self.assertEqual(load_argv("", 1, "/c")[:2], ["pactl", "load-module"])


class SessionSide(TestCase):
    """The session service with stand-in agents (tests.test_sessions_manager's
    fakes): what a granted service changes in the agent's options, the
    program's environment and the session directory, and what start-up
    cleans up after a killed gateway."""

    def setUp(self) -> None:
        import os

        from nxgate.node import files
        from tests.harness.stores import inline_store
        from tests.test_sessions_manager import FakeLauncher, FakeNotifier, short_state_dir

        self.os = os
        self.reactor = FakeReactor()
        self.layout = files.StateLayout(short_state_dir(self))
        self.layout.prepare()
        self.store = inline_store(self.layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)
        self.notifier = FakeNotifier()

    def service(self, services: ServicesSection = ServicesSection()):
        from nxgate.config import Config, SessionsSection
        from nxgate.node.service import SessionService

        config = Config(sessions=SessionsSection(display_base=3300, display_limit=20), services=services,
                        types={"unix-console": ("true",)})
        return SessionService(self.reactor, config, self.store.deferred, self.layout, notifier=self.notifier,
                              launcher=self.launcher, listens=lambda pid, port: True)

    def running(self, manager, params: str):
        from tests.test_sessions_manager import READY, STARTED, caller, nx

        d = nx(manager, caller(), "startsession", '--type="unix-console" --session="t" ' + params)
        (session_id,) = list(manager.sessions)
        manager._agent_line(session_id, READY)
        reply = self.successResultOf(d)
        manager._agent_line(session_id, STARTED)
        return manager.sessions[session_id], reply

    def options_line(self, session) -> str:
        with open(self.layout.agent_files(session.id).options) as handle:
            return handle.read()

    def test_granted_sound_opens_the_media_channel_and_sets_the_programs_environment(self) -> None:
        session, reply = self.running(self.service(), '--media="1" --samba="1"')
        self.assertEqual(session.options["services"], ["sharing", "sound"])
        line = self.options_line(session)
        self.assertIn(f",media={7000 + session.display},", line)
        self.assertIn(f",smb={3000 + session.display},", line)
        self.assertIn("NX> 709 File-sharing port: 445", reply.lines)
        program = self.launcher.requests[-1]["env_fixed"]
        self.assertEqual(program["PULSE_SERVER"], f"tcp:127.0.0.1:{7000 + session.display}")
        with open(program["PULSE_COOKIE"], "rb") as handle:
            self.assertEqual(handle.read(), channels.sound_cookie(session.cookie))
        self.assertEqual(self.os.stat(program["PULSE_COOKIE"]).st_mode & 0o777, 0o600)

    def test_switched_off_sound_is_left_out_cleanly(self) -> None:
        session, reply = self.running(self.service(ServicesSection(sound=False)), '--media="1"')
        self.assertEqual(session.options["services"], [])
        self.assertNotIn("media=", self.options_line(session))
        self.assertNotIn("PULSE_SERVER", self.launcher.requests[-1]["env_fixed"])
        self.assertIn("NX> 710 Session status: running", reply.lines)

    def test_start_up_stops_the_services_of_a_session_left_suspended(self) -> None:
        from twisted.internet import defer

        from nxgate.vocabulary.model import Session, State
        from tests.test_sessions_manager import ME, READY, STARTED, SUSPENDED

        agent = self.successResultOf(defer.ensureDeferred(self.launcher.start({})))
        session = Session(id="C" * 32, user=ME, uid=self.os.getuid(), gid=self.os.getgid(), type="unix-console",
                          name="left", display=3301, server_name="h", cookie="0" * 32, state=State.RUNNING,
                          ever_attached=True, agent_pid=agent.pid, agent_started=agent.started,
                          options={"plan": {"program": ["true"]}, "services": ["sound"]})
        self.store.insert(session)
        agent_files = self.layout.agent_files(session.id)
        self.os.mkdir(agent_files.directory, 0o700)
        with open(agent_files.log, "w") as log:
            log.write("\n".join([READY, STARTED, SUSPENDED]) + "\n")
        stale = self.os.path.join(agent_files.directory, "pulse-cookie")
        with open(stale, "wb") as handle:
            handle.write(b"x" * 256)
        manager = self.service()
        manager.reconcile()
        self.assertEqual(manager.sessions[session.id].state, State.SUSPENDED)
        self.assertFalse(self.os.path.exists(stale))

    def test_a_taken_channel_port_leaves_the_service_out_not_the_session(self) -> None:
        import socket

        holders = []
        for display in range(3300, 3306):  # where the session's display will be
            holder = socket.socket()
            holder.bind(("127.0.0.1", 7000 + display))
            holder.listen(1)
            holders.append(holder)
            self.addCleanup(holder.close)
        session, reply = self.running(self.service(), '--media="1"')
        self.assertIn(session.display, range(3300, 3306))
        self.assertEqual(session.options["services"], [])
        self.assertNotIn("media=", self.options_line(session))
        self.assertNotIn("PULSE_SERVER", self.launcher.requests[-1]["env_fixed"])
