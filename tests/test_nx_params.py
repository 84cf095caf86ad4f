"""Parameter lists as real clients send them (reference §2.5)."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import mask_secrets, parse_params, unescape


class ParseTests(SynchronousTestCase):
    def test_nxcl_style(self):
        p = parse_params('--session="sebtest" --type="unix-kde" --cache="8M" --images="32M" --cookie="abc" '
                         '--link="adsl" --kbtype="pc102/gb" --nodelay="1" --encryption="1" --backingstore="never" '
                         '--geometry="1024x768+0+0" --media="0" --agent_server="" --agent_user="" --agent_password=""')
        self.assertEqual(p["session"], "sebtest")
        self.assertEqual(p["geometry"], "1024x768+0+0")
        self.assertEqual(p["agent_server"], "")
        self.assertEqual(len(p), 15)

    def test_values_with_spaces_and_any_order(self):
        p = parse_params('  --session="my  session"   --Type="unix-application" --application="xterm -bg red"  ')
        self.assertEqual(p["session"], "my  session")
        self.assertEqual(p["type"], "unix-application")
        self.assertEqual(p["TYPE"], "unix-application")
        self.assertEqual(p["application"], "xterm -bg red")

    def test_opennx_escapes(self):
        p = parse_params('--application="xterm%20-e%20%22top%22" --agent_server="host%3A1" --session="caf%C3%A9"')
        self.assertEqual(p["application"], 'xterm -e "top"')
        self.assertEqual(p["agent_server"], "host:1")
        self.assertEqual(p["session"], "café")

    def test_remmina_raw_values_with_quotes(self):
        p = parse_params('--agent_password="pa"ss word" --type="windows"')
        self.assertEqual(p["agent_password"], 'pa"ss word')
        self.assertEqual(p["type"], "windows")

    def test_unquoted_values(self):
        p = parse_params("--id=0123456789ABCDEF0123456789ABCDEF --display=0")
        self.assertEqual(p["display"], "0")

    def test_lone_percent_is_kept(self):
        self.assertEqual(unescape("100%"), "100%")
        self.assertEqual(unescape("%zz%41"), "%zzA")

    def test_last_duplicate_wins(self):
        self.assertEqual(parse_params('--a="1" --a="2"')["a"], "2")

    def test_empty(self):
        self.assertEqual(len(parse_params("   ")), 0)

    def test_invalid(self):
        for text in ('type="x"', '--type="unterminated', "--="'"x"', "-- type=x", '--type="x"junk'):
            with self.subTest(text=text):
                error = self.assertRaises(NXError, parse_params, text)
                self.assertEqual(error.code, 597)

    def test_invalid_message_masks_password(self):
        error = self.assertRaises(NXError, parse_params, '--agent_password="secret" garbage')
        self.assertNotIn("secret", error.text)

    def test_repr_masks_secrets(self):
        p = parse_params('--agent_password="secret" --type="vnc"')
        self.assertNotIn("secret", repr(p))
        self.assertIn("vnc", repr(p))

    def test_mask_secrets_in_raw_line(self):
        self.assertEqual(
            mask_secrets('startsession --agent_password="a b" --agent_user="u" --password=x'),
            'startsession --agent_password="***" --agent_user="u" --password="***"',
        )
