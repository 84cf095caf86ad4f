"""startsession/restoresession parameters: validated before they reach nxagent."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.backends import nxagent
from nxgate.nx.errors import NXError
from nxgate.nx.params import parse_params
from nxgate.session.model import Session
from nxgate.session.request import DisplaySettings, display_settings, session_id, start_request

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

    def test_defaults(self):
        request = start_request(parse_params('--type="unix-console"'))
        self.assertEqual(request.display, DisplaySettings())
        self.assertEqual(request.name, "unix-console")

    def test_application_is_split_without_a_shell(self):
        request = start_request(parse_params('--type="unix-application" --application="sh -c \'echo $(id)\'"'))
        self.assertEqual(request.application, ("sh", "-c", "echo $(id)"))

    def test_bad_values_597(self):
        for bad in ('--type="unix-kde" --keyboard="pc105/us,accept=0.0.0.0"', '--type="unix-kde" --link="fast"',
                    '--type="unix-kde" --geometry="huge"', '--type="unix-kde" --geometry="10x10"',
                    '--type="unix-kde" --cache="lots"', '--type="unix kde"', '--type="unix-kde" --encryption="maybe"',
                    '--type="unix-kde" --screeninfo="800x600x7"', '--type="unix-application" --application="x \'"'):
            with self.subTest(bad=bad):
                self.assertEqual(self.assertRaises(NXError, start_request, parse_params(bad)).code, 597)

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


class OptionsTests(SynchronousTestCase):
    session = Session(id="A" * 32, user="alice", uid=1000, gid=1000, type="unix-kde", name="desk", display=1001,
                      server_name="gw.example", cookie="c0ffee" * 5 + "00")

    def test_options_line(self):
        line = nxagent.options_line(self.session, DisplaySettings(link="adsl", fullscreen=True), "127.0.0.1")
        self.assertTrue(line.startswith("nx/nx,link=adsl,cache=16M,images=64M,accept=127.0.0.1,cookie="))
        self.assertIn(f",id=gw.example-1001-{'A' * 32},", line)
        self.assertIn(",type=desktop,geometry=800x600,resize=1,fullscreen=1:1001\n", line)
        self.assertEqual(line.count(":"), 1)
        self.assertIn(",pack=lossless,", line)  # never JPEG: text in images stays sharp

    def test_rootless_has_no_geometry(self):
        line = nxagent.options_line(self.session.evolve(rootless=True), DisplaySettings(), "127.0.0.1")
        self.assertIn("menu=1", line)
        self.assertNotIn("geometry", line)

    def test_shadow_plan(self):
        plan = nxagent.AgentPlan(mode="-S", extra_options=(("shadow", ":1001"), ("shadowmode", "0")),
                                 persistent=False)
        shadow = self.session.evolve(type="shadow", display=1002)
        line = nxagent.options_line(shadow, DisplaySettings(), "127.0.0.1", plan.extra_options)
        self.assertIn(",type=shadow,shadow=:1001,shadowmode=0,", line)
        self.assertTrue(line.endswith(":1002\n"))
        files = nxagent.AgentFiles("/s/B", "/l/B.agent.log", "/l/B.session.log")
        argv = nxagent.agent_argv("nxagent", shadow, files, plan)
        self.assertIn("-S", argv)
        self.assertIn("-nopersistent", argv)
        self.assertEqual(nxagent.AgentPlan.from_dict(plan.as_dict()), plan)
        self.assertRaises(ValueError, nxagent.options_line, shadow, DisplaySettings(), "x", (("shadowmode", ":1"),))

    def test_unsafe_value_is_refused(self):
        self.assertRaises(ValueError, nxagent.options_line, self.session, DisplaySettings(keyboard="a,b"), "x")

    def test_argv_and_environment(self):
        files = nxagent.AgentFiles("/s/A", "/l/A.agent.log", "/l/A.session.log")
        argv = nxagent.agent_argv("nxagent", self.session, files, nxagent.AgentPlan())
        self.assertEqual(argv[:5], ["nxagent", "-display", "nx/nx,options=/s/A/options:1001", "-options", "/s/A/options"])
        self.assertEqual(argv[-1], ":1001")
        self.assertIn("-D", argv)
        self.assertIn("-extension XFIXES", " ".join(argv))  # see nxagent.DISABLED_EXTENSIONS
        self.assertNotIn(self.session.cookie, " ".join(argv))
        env = nxagent.agent_environment(self.session, files, {"HOME": "/home/alice"})
        self.assertEqual(env["XAUTHORITY"], "/s/A/authority")
        self.assertEqual(env["HOME"], "/home/alice")
        self.assertEqual(nxagent.x11_environment(self.session, files, {})["DISPLAY"], ":1001")
