"""startsession/restoresession parameters: validated before they reach nxagent."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node.agents import nxagent
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import parse_params
from nxgate.vocabulary.model import Session
from nxgate.protocols.nx.requests import display_settings, session_id, start_request
from nxgate.vocabulary.requests import DisplaySettings

NXCL = ('--session="sebtest" --type="unix-kde" --cache="8M" --images="32M" --cookie="0123" --link="adsl" '
        '--kbtype="pc102/gb" --nodelay="1" --encryption="1" --backingstore="never" --geometry="1024x768+0+0" '
        '--media="0" --agent_server="" --agent_user="" --agent_password="" --screeninfo="1024x768x16+render"')
OPENNX = ('--session="My%20Desk" --type="unix-application" --application="xterm%20-bg%20red" --geometry="800x600" '
          '--client="linux" --keyboard="pc105/de" --link="lan" --fullscreen="0" --rootless="1" --virtualdesktop="0" '
          '--encryption="1" --screeninfo="800x600x24+render" --resize="1" --clipboard="both"')


class StartRequestTests(SynchronousTestCase):
    def test_nxcl(self):
        request = start_request(parse_params(NXCL))
        self.assertEqual((request.type, request.name, request.encrypted), ("unix-kde", "sebtest", True))
        self.assertEqual(request.display.geometry, "1024x768")
        self.assertEqual((request.display.depth, request.display.render), (16, True))
        self.assertEqual(request.display.keyboard, "pc102/gb")
        self.assertFalse(request.display.backingstore)
        self.assertFalse(request.rootless)

    def test_opennx_application(self):
        request = start_request(parse_params(OPENNX))
        self.assertEqual(request.application, ("xterm", "-bg", "red"))
        self.assertEqual(request.name, "My Desk")
        self.assertTrue(request.rootless)
        self.assertEqual(request.display.keyboard, "pc105/de")

    def test_fullscreen_geometry(self):
        settings = display_settings(parse_params('--geometry="fullscreen" --screeninfo="1920x1080x24+render"'))
        self.assertTrue(settings.fullscreen)
        self.assertEqual(settings.geometry, "1920x1080")

    def test_what_real_clients_send_for_the_size(self):
        """Each client's size parameters (reference §2.5 and the clients' source):
        the session's size, full screen or not, depth and RENDER."""
        cases = {
            # NoMachine 3.x nxclient: a window with a position, or the full screen.
            '--geometry="1024x768+0+0" --screeninfo="1280x1024x24+render"': ("1024x768", False, 24, True),
            '--geometry="fullscreen" --screeninfo="1280x1024x24+render"': ("1280x1024", True, 24, True),
            # OpenNX 0.16: the size it computed, plus --fullscreen and +fullscreen for full screen.
            '--geometry="1280x1024" --fullscreen="1" --screeninfo="1280x1024x24+render+fullscreen"':
                ("1280x1024", True, 24, True),
            '--geometry="800x600" --screeninfo="800x600x24+render"': ("800x600", False, 24, True),
            # Older OpenNX: "available" (the work area) and "fullscreen".
            '--geometry="available" --screeninfo="1280x800x24+render"': ("1280x800", False, 24, True),
            # nxcl / QtNX.
            '--geometry="1024x768+0+0" --screeninfo="1024x768x16+render"': ("1024x768", False, 16, True),
            # Remmina: screeninfo 0x0 unless the profile has a custom resolution.
            '--geometry="1280x800" --screeninfo="0x0x24+render"': ("1280x800", False, 24, True),
            '--geometry="0x0" --screeninfo="0x0x24+render"': ("800x600", False, 24, True),
            # nxgate-client.
            '--geometry="1280x800" --screeninfo="1280x800x24+render" --fullscreen="1"': ("1280x800", True, 24, True),
            '--geometry="1024x768" --screeninfo="1024x768x24"': ("1024x768", False, 24, False),
            # Only a screeninfo: its size.
            '--screeninfo="1152x864x24+render"': ("1152x864", False, 24, True),
            '--geometry="1024x768-0+0"': ("1024x768", False, 24, True),
        }
        for params, (geometry, fullscreen, depth, render) in cases.items():
            with self.subTest(params=params):
                settings = display_settings(parse_params(params))
                self.assertEqual((settings.geometry, settings.fullscreen, settings.depth, settings.render),
                                 (geometry, fullscreen, depth, render))

    def test_defaults(self):
        request = start_request(parse_params('--type="unix-console"'))
        self.assertEqual(request.display, DisplaySettings())
        self.assertEqual(request.name, "unix-console")
        self.assertEqual(request.ignored, ())

    def test_id_and_display_are_chosen_by_the_server_and_reported_ignored(self):
        """As FreeNX and Neatx: a start never takes the client's id or display,
        and is not refused for sending them (clients send them for restore and
        attach); the gateway logs what it ignored."""
        request = start_request(parse_params(
            '--type="unix-console" --id="0123456789ABCDEF0123456789ABCDEF" --display="7" --session="mine"'))
        self.assertEqual((request.type, request.name), ("unix-console", "mine"))
        self.assertEqual(request.ignored, (("id", "0123456789ABCDEF0123456789ABCDEF"), ("display", "7")))
        self.assertEqual(start_request(parse_params('--type="unix-console" --display=""')).ignored, ())

    def test_application_is_split_without_a_shell(self):
        request = start_request(parse_params('--type="unix-application" --application="sh -c \'echo $(id)\'"'))
        self.assertEqual(request.application, ("sh", "-c", "echo $(id)"))

    def test_bad_values_597(self):
        for bad in ('--type="unix-kde" --keyboard="pc105/us,accept=0.0.0.0"', '--type="unix-kde" --link="fast"',
                    '--type="unix-kde" --geometry="huge"', '--type="unix-kde" --geometry="10x10"',
                    '--type="unix-kde" --cache="lots"', '--type="unix kde"', '--type="unix-kde" --encryption="maybe"',
                    '--type="unix-kde" --screeninfo="800x600x7"',
                    '--type="unix-kde" --geometry="1024x768,x=1"', '--type="unix-kde" --screeninfo="800x600x24,x"',
                    '--type="unix-kde" --geometry="100000x768"', '--type="unix-application" --application="x \'"'):
            with self.subTest(bad=bad):
                self.assertEqual(self.assertRaises(NXError, start_request, parse_params(bad)).code, 597)

    def test_a_refused_value_is_echoed_on_one_line(self):
        error = self.assertRaises(NXError, start_request, parse_params('--type="unix-kde" --link="lan%0ANX> 999 Bye."'))
        self.assertEqual(error.text, "Error: Invalid value 'lan\\x0aNX> 999 Bye.' for parameter 'link': expected one "
                                     "of modem, isdn, adsl, wan, lan.")

    def test_refusals_quote_the_value_as_the_client_wrote_it(self):
        for bad, shown in (('--type="unix-kde" --link="Fast"', "'Fast'"),
                           ('--type="unix-kde" --encryption="Maybe"', "'Maybe'"),
                           ('--type="Unix KDE"', "'Unix KDE'")):
            with self.subTest(bad=bad):
                self.assertIn(shown, self.assertRaises(NXError, start_request, parse_params(bad)).text)
        self.assertIn("'Not-An-Id'", self.assertRaises(NXError, session_id, parse_params('--id="Not-An-Id"'), "id").text)

    def test_missing_type_and_application(self):
        self.assertIn("type missing", self.assertRaises(NXError, start_request, parse_params('--session="x"')).text)
        error = self.assertRaises(NXError, start_request, parse_params('--type="unix-application"'))
        self.assertIn("missing application", error.text)
        self.assertTrue(error.last_operation_failed)

    def test_session_name_is_never_a_path(self):
        request = start_request(parse_params('--type="unix-console" --session="../../etc/passwd\nx"'))
        self.assertEqual(request.name, "../../etc/passwd x")  # only ever shown, never used as a path


class SessionIdTests(SynchronousTestCase):
    def test_bare_full_and_lower(self):
        sid = "0123456789ABCDEF0123456789ABCDEF"
        self.assertEqual(session_id(parse_params(f'--id="{sid}"'), "id"), sid)
        self.assertEqual(session_id(parse_params(f'--id="host-1001-{sid}"'), "id"), sid)
        self.assertEqual(session_id(parse_params(f'--sessionid="{sid.lower()}"'), "id", "sessionid"), sid)

    def test_bad_ids(self):
        for text in ('--id="../../x"', '--id="XYZ"', ""):
            self.assertRaises(NXError, session_id, parse_params(text), "id")


TCP = nxagent.listen_tcp("127.0.0.1")


class OptionsTests(SynchronousTestCase):
    session = Session(id="A" * 32, user="alice", uid=1000, gid=1000, type="unix-kde", name="desk", display=1001,
                      server_name="gw.example", cookie="c0ffee" * 5 + "00")

    def test_options_line(self):
        line = nxagent.options_line(self.session, DisplaySettings(link="adsl", fullscreen=True), TCP)
        self.assertTrue(line.startswith("nx/nx,link=adsl,cache=16M,images=64M,accept=127.0.0.1,cookie="))
        self.assertIn(f",id=gw.example-1001-{'A' * 32},", line)
        self.assertIn(",type=desktop,geometry=fullscreen,fullscreen=1,resize=1:1001\n", line)
        self.assertEqual(line.count(":"), 1)
        self.assertIn(",pack=lossless,", line)  # never JPEG: text in images stays sharp
        self.assertIn(",sleep=0,", line)  # a suspended agent draws at full speed for a browser tab

    def test_rootless_has_no_geometry(self):
        line = nxagent.options_line(self.session.evolve(rootless=True), DisplaySettings(), TCP)
        self.assertIn("menu=1", line)
        self.assertNotIn("geometry", line)

    def test_shadow_plan(self):
        plan = nxagent.AgentPlan(mode="-S", extra_options=(("shadow", ":1001"), ("shadowmode", "0")),
                                 persistent=False)
        shadow = self.session.evolve(type="shadow", display=1002)
        line = nxagent.options_line(shadow, DisplaySettings(), TCP, plan.extra_options)
        self.assertIn(",type=shadow,shadow=:1001,shadowmode=0,", line)
        self.assertTrue(line.endswith(":1002\n"))
        files = nxagent.AgentFiles("/s/B", "/l/B.agent.log", "/l/B.session.log")
        argv = nxagent.agent_argv("nxagent", shadow, files, plan)
        self.assertIn("-S", argv)
        self.assertIn("-nopersistent", argv)
        self.assertEqual(nxagent.AgentPlan.from_dict(plan.as_dict()), plan)
        self.assertRaises(ValueError, nxagent.options_line, shadow, DisplaySettings(), TCP, (("shadowmode", ":1"),))

    def test_unsafe_value_is_refused(self):
        self.assertRaises(ValueError, nxagent.options_line, self.session, DisplaySettings(keyboard="a,b"), TCP)

    def test_listening_on_a_unix_socket_only(self):
        line = nxagent.options_line(self.session, DisplaySettings(), nxagent.listen_unix("/s/A/agent.sock"))
        self.assertIn(",listen=unix:/s/A/agent.sock,cookie=", line)
        self.assertNotIn("accept=", line)  # nxagent refuses accept= with listen=
        self.assertTrue(line.endswith(":1001\n"))
        self.assertEqual(nxagent.AgentFiles("/s/A", "/l/a", "/l/b").socket, "/s/A/agent.sock")
        for bad in ("/s/A/a,b", "/s/A/a:b", "/" + "x" * 107):
            self.assertRaises(ValueError, nxagent.options_line, self.session, DisplaySettings(),
                              nxagent.listen_unix(bad))

    def test_ps_shows_neither_user_nor_session_name(self):
        files = nxagent.AgentFiles("/s/A", "/l/A.agent.log", "/l/A.session.log")
        argv = " ".join(nxagent.agent_argv("nxagent", self.session, files, nxagent.AgentPlan()))
        self.assertNotIn("alice", argv)
        self.assertNotIn("desk", argv)
        self.assertIn("-name NX - gw.example:1001 ", argv)

    def test_argv_and_environment(self):
        files = nxagent.AgentFiles("/s/A", "/l/A.agent.log", "/l/A.session.log")
        argv = nxagent.agent_argv("nxagent", self.session, files, nxagent.AgentPlan())
        # Named relative to the session directory the agent runs in, and the
        # options line's file in DISPLAY (the environment): ps shows no session.
        self.assertEqual(argv[:3], ["nxagent", "-options", "options"])
        self.assertEqual(argv[argv.index("-auth") + 1], "authority")
        self.assertNotIn("/s/A", " ".join(argv))
        self.assertNotIn("-display", argv)
        self.assertEqual(argv[-1], ":1001")
        self.assertIn("-D", argv)
        self.assertIn("-extension XFIXES", " ".join(argv))  # see nxagent.DISABLED_EXTENSIONS
        self.assertNotIn(self.session.cookie, " ".join(argv))
        env = nxagent.agent_environment(self.session, files, {"HOME": "/home/alice"})
        self.assertEqual(env["XAUTHORITY"], "/s/A/authority")
        self.assertEqual(env["HOME"], "/home/alice")
        self.assertEqual(nxagent.x11_environment(self.session, files, {})["DISPLAY"], ":1001")
