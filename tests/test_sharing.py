"""Folder sharing's pure parts (issue 14): the ``addmount`` parser, the
dispatcher's answers, the client's command, dialogue and Samba settings,
and the server's mount bookkeeping.  The real thing is tests/test_e2e_sharing.py."""

from __future__ import annotations

import os
import tempfile

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate.clients.nx import cli
from nxgate.clients.nx.sharing import parse_share, smb_conf
from nxgate.node.extras import sharing
from nxgate.protocols.nx import client_commands as commands
from nxgate.protocols.nx import client_dialogue as nx
from nxgate.protocols.nx import replies
from nxgate.protocols.nx.dispatch import NXDispatcher
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.mounts import mount_name, parse_addmount
from nxgate.protocols.nx.params import parse_params
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.requests import ShareMount
from nxgate.config import ServicesSection
from tests.harness.fakes import FakeSessionAPI
from tests.test_nx_client_dialogue import COOKIE, NXGATE_START_REPLY, PARAMS, SESSION_ID, Server
from tests.test_services import SessionSide
from tests.test_sessions_manager import caller
from tests.test_sessions_manager import nx as nx_command

CALLER = Caller("alice", 1000, 1000, frozenset(), "192.0.2.1")
OPENNX = ('--port="4001" --username="alice" --password="se%20cret" --share="Documents" '
          f'--computername="laptop.example" --session_id="{SESSION_ID}" --dir="$(SHARES)/Documents"')


def params(text: str):
    return parse_params(text)


class ParserTests(SynchronousTestCase):
    def test_what_opennx_sends(self):
        sid, mount = parse_addmount(params(OPENNX))
        self.assertEqual(sid, SESSION_ID)
        self.assertEqual(mount, ShareMount(share="Documents", name="Documents", username="alice", password="se cret",
                                           computer="laptop.example"))
        self.assertNotIn("se cret", repr(mount))

    def test_the_full_session_id_and_the_other_key_spelling(self):
        sid, _ = parse_addmount(params(f'--share="a" --sessionid="host-1001-{SESSION_ID.lower()}"'))
        self.assertEqual(sid, SESSION_ID)

    def test_the_folder_name_comes_from_dir_else_from_the_share(self):
        self.assertEqual(mount_name("$(SHARES)/My Music", "music"), "My Music")
        self.assertEqual(mount_name("%24(SHARES)/x".replace("%24", "$"), "music"), "x")
        self.assertEqual(mount_name("", "music"), "music")
        self.assertEqual(mount_name("$(SHARES)", "music"), "music")
        self.assertEqual(mount_name("/home/bob/stuff/", "music"), "stuff")

    def test_bad_values_are_refused_with_597(self):
        for bad in ('--share="../x"', '--share=".."', '--share=""', '--share="a/b"', '--share="a%0Ab"',
                    '--share="a" --dir="$(SHARES)/.."', '--share="a" --username="x\\"y"',
                    '--share="' + "x" * 81 + '"'):
            with self.assertRaises(NXError) as caught:
                parse_addmount(params(f'{bad} --session_id="{SESSION_ID}"'))
            self.assertEqual(caught.exception.code, 597, bad)

    def test_a_bad_password_is_refused_without_showing_it(self):
        with self.assertRaises(NXError) as caught:
            parse_addmount(params(f'--share="a" --password="x%22secretword" --session_id="{SESSION_ID}"'))
        self.assertEqual(caught.exception.code, 597)
        self.assertNotIn("secretword", str(caught.exception))

    def test_no_or_a_bad_session_id(self):
        with self.assertRaises(NXError) as caught:
            parse_addmount(params('--share="a"'))
        self.assertEqual(caught.exception.code, 500)
        with self.assertRaises(NXError) as caught:
            parse_addmount(params('--share="a" --session_id="xyz"'))
        self.assertEqual(caught.exception.code, 597)


def sharing_api(answer=True) -> FakeSessionAPI:
    """The session API whose ``add_mount`` answers ``answer`` (or raises it)."""
    return FakeSessionAPI(add_mount=answer)


def run(coroutine):
    return defer.ensureDeferred(coroutine)


class DispatchTests(SynchronousTestCase):
    def execute(self, service, text=OPENNX):
        return self.successResultOf(run(NXDispatcher(service).execute(CALLER, "addmount", params(text))))

    def test_a_mount_is_handed_to_the_service_and_answered_as_freenx_did(self):
        service = sharing_api()
        reply = self.execute(service)
        self.assertEqual(reply.lines, ("NX> 719 SMB filesystem: running",))
        self.assertEqual([(c.user, sid, m.share) for c, sid, m in service.called("add_mount")],
                         [("alice", SESSION_ID, "Documents")])

    def test_sharing_switched_off_is_a_plain_note_not_an_error(self):
        reply = self.execute(sharing_api(False))
        self.assertEqual(reply.lines, replies.mount_added(False))
        self.assertTrue(reply.lines[0].startswith("NX> 719 SMB filesystem: off"))

    def test_someone_elses_session_is_not_found(self):
        error = SessionError(Kind.NOT_YOURS, f"Could not find session {SESSION_ID}.", session_id=SESSION_ID)
        failure = self.failureResultOf(run(NXDispatcher(sharing_api(error)).execute(
            CALLER, "addmount", params(OPENNX))), NXError)
        self.assertEqual(failure.value.lines(), [f"NX> 596 Error: Could not find session {SESSION_ID}.",
                                                 "NX> 500 ERROR: Last operation failed."])

    def test_bad_input_never_reaches_the_service(self):
        service = sharing_api()
        self.failureResultOf(run(NXDispatcher(service).execute(CALLER, "addmount", params('--share="../x"'))), NXError)
        self.assertEqual(service.received, [])


class ServerBookkeepingTests(SynchronousTestCase):
    def test_mounts_under_a_session_deepest_first_with_escapes(self):
        info = "\n".join([
            "36 25 0:32 / /var/lib/nxgate/sessions/ABC/shares/k1/mnt rw - fuse.smbnetfs smbnetfs rw",
            "37 25 0:33 / /var/lib/nxgate/sessions/ABC/shares/k\\0402/mnt rw - fuse.smbnetfs smbnetfs rw",
            "38 25 0:34 / /var/lib/nxgate/sessions/ABCD/shares/k1/mnt rw - fuse.smbnetfs smbnetfs rw",
            "39 25 0:35 / /var/lib/nxgate/sessions/ABC/shares rw - tmpfs tmpfs rw",
            "short line",
        ])
        self.assertEqual(sharing.mounts_under(info, "/var/lib/nxgate/sessions/ABC/shares/"), [
            "/var/lib/nxgate/sessions/ABC/shares/k 2/mnt", "/var/lib/nxgate/sessions/ABC/shares/k1/mnt",
            "/var/lib/nxgate/sessions/ABC/shares"])

    def test_the_smbnetfs_configuration_carries_the_login_and_rereads_nothing(self):
        config = sharing.smbnetfs_config("alice", "p4ss word")
        self.assertIn('auth "alice" "p4ss word"\n', config)
        self.assertIn("config_update_period 0\n", config)
        self.assertIn('smb_query_browsers "false"\n', config)

    def test_paths(self):
        self.assertEqual(sharing.share_path("/s/mnt", 4001, "Documents"), "/s/mnt/127.0.0.1:4001/Documents")
        self.assertEqual(len(sharing.mount_key("Documents")), 16)
        self.assertNotEqual(sharing.mount_key("a"), sharing.mount_key("b"))
        self.assertNotIn("/", sharing.mount_key("../../etc"))


class ClientTests(SynchronousTestCase):
    def test_the_addmount_command_is_opennx_s(self):
        line = commands.addmount_command(SESSION_ID, 4001, "work", "bob", "p w", "box")
        self.assertEqual(line, f'addmount --port="4001" --username="bob" --password="p%20w" --share="work" '
                               f'--computername="box" --session_id="{SESSION_ID}" --dir="%24(SHARES)/work"')
        sid, mount = parse_addmount(params(line.partition(" ")[2]))
        self.assertEqual((sid, mount.share, mount.name, mount.password), (SESSION_ID, "work", "work", "p w"))

    def test_samba_is_asked_for_only_with_shares(self):
        self.assertNotIn(("samba", "1"), PARAMS.pairs())
        self.assertIn(("samba", "1"), commands.SessionParameters(name="n", type="unix-console", width=1, height=1,
                                                                 samba=True).pairs())

    def test_share_option(self):
        folder = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, folder)
        self.assertEqual(parse_share(f"work={folder}"), ("work", folder))
        for bad in ("work", f"=/{folder}", f"a b={folder}", f".hidden={folder}", "work=/no/such/folder"):
            self.assertRaises(ValueError, parse_share, bad)
        options = cli.parse_options(["alice@gw", "--share", f"work={folder}"], {"DISPLAY": ":0"})
        self.assertEqual(options.shares, {"work": folder})
        self.assertTrue(options.request.params.samba)
        with self.assertRaises(cli.UsageError):
            cli.parse_options(["alice@gw", "--share", f"w={folder}", "--share", f"w={folder}"], {"DISPLAY": ":0"})
        with self.assertRaises(cli.UsageError):
            cli.parse_options(["alice@gw", "--list", "--share", f"w={folder}"], {})

    def test_the_private_samba_serves_only_loopback_one_port_one_account(self):
        conf = smb_conf("/tmp/x", 4455, "bob", {"work": "/home/bob/work", "music": "/m"})
        self.assertIn("interfaces = 127.0.0.1\n  bind interfaces only = yes\n  smb ports = 4455\n", conf)
        self.assertIn("[work]\n  path = /home/bob/work\n  read only = no\n  valid users = bob\n", conf)
        self.assertIn("[music]", conf)
        self.assertIn("passdb backend = tdbsam:/tmp/x/private/passdb.tdb", conf)
        self.assertIn("load printers = no", conf)


class ClientDialogueTests(SynchronousTestCase):
    SHARING_REPLY = NXGATE_START_REPLY.replace(b"NX> 1009", b"NX> 709 File-sharing port: 445\nNX> 1009")

    def ready(self, reply: bytes = SHARING_REPLY) -> tuple[Server, nx.SessionInfo]:
        server = Server(nx.StartSession(PARAMS))
        server.login()
        server.say(reply)
        (ready,) = server.results()
        return server, ready.info

    def test_709_says_the_server_shares_folders(self):
        self.assertEqual(self.ready()[1].file_sharing_port, 445)
        self.assertIsNone(self.ready(NXGATE_START_REPLY)[1].file_sharing_port)
        self.assertEqual(self.ready()[1].cookie, COOKIE)

    def test_addmount_answers_are_notices_and_the_password_never_shows(self):
        server, info = self.ready()
        line = commands.addmount_command(info.session_id, 4001, "work", "bob", "pw%secret", "box")
        events = server.client.add_mounts([line], ("pw%secret",))
        self.assertIn(b"--password=", b"".join(e.data for e in events if isinstance(e, nx.Send)))
        self.assertNotIn("secret", "\n".join(e.text for e in events if isinstance(e, nx.Trace)))
        echo = line.replace("pw%25secret", "***")
        events = server.client.data_received(f"{echo}\nNX> 719 SMB filesystem: running\nNX> 105 ".encode())
        self.assertEqual([e for e in events if isinstance(e, nx.Notice)],
                         [nx.Notice("NX> 719 SMB filesystem: running")])
        self.assertIs(server.client.phase, nx.Phase.READY)

    def test_a_refused_addmount_costs_the_session_nothing(self):
        server, info = self.ready()
        server.client.add_mounts(["addmount x"], ("pw",))
        events = server.client.data_received(b"NX> 597 Error: Invalid value\nNX> 105 ")
        self.assertEqual([type(e) for e in events if not isinstance(e, nx.Trace)], [nx.Notice])
        self.assertFalse(server.client.error_pending)
        self.assertEqual(server.client.proxy_connected()[-1].data, b"bye\n")

    def test_an_error_without_addmount_still_fails(self):
        server, _ = self.ready()
        server.client.data_received(b"NX> 596 Session failed.\n")
        self.assertTrue(server.client.error_pending)


class ServiceTests(TestCase):
    """``addmount`` through the real session service (stand-in agents, the
    mount itself recorded: the e2e test makes real ones)."""

    # tests.test_services' stand-in service, without its tests.
    setUp = SessionSide.setUp
    service = SessionSide.service
    running = SessionSide.running

    def started(self, services: ServicesSection = ServicesSection(), samba: str = "1"):
        service = self.service(services)
        self.mounted: list = []

        async def mount(session, mount):
            self.mounted.append((session.id, mount))

        if "sharing" in service.extras.by_name:
            service.extras.by_name["sharing"].mount = mount
        session, reply = self.running(service, f'--samba="{samba}"')
        return service, session, reply

    def addmount(self, service, who, session_id: str, share: str = "docs"):
        return nx_command(service, who, "addmount", f'--share="{share}" --password="pw" --session_id="{session_id}"')

    def test_the_owner_s_folder_is_mounted_once_the_session_runs(self) -> None:
        service, session, reply = self.started()
        self.assertIn("NX> 709 File-sharing port: 445", reply.lines)
        answer = self.successResultOf(self.addmount(service, caller(), session.id))
        self.assertEqual(answer.lines, ("NX> 719 SMB filesystem: running",))
        self.assertEqual([(sid, m.share, m.password) for sid, m in self.mounted], [(session.id, "docs", "pw")])

    def test_switched_off_or_not_asked_for_is_off_not_an_error(self) -> None:
        for services, samba in ((ServicesSection(sharing=False), "1"), (ServicesSection(), "0")):
            service, session, _ = self.started(services, samba)
            answer = self.successResultOf(self.addmount(service, caller(), session.id))
            self.assertTrue(answer.lines[0].startswith("NX> 719 SMB filesystem: off"))
            self.assertEqual(self.mounted, [])
            for sid in list(service.sessions):
                service.sessions.pop(sid)  # the next service starts afresh on the same display range

    def test_nobody_else_mounts_into_a_session_not_even_an_admin(self) -> None:
        service, session, _ = self.started()
        for who in (caller(user="mallory"), Caller("theadmin", 0, 0, frozenset(), "192.0.2.9", admin=True)):
            failure = self.failureResultOf(self.addmount(service, who, session.id), NXError)
            self.assertEqual(failure.value.lines()[0], f"NX> 596 Error: Could not find session {session.id}.")
        self.assertEqual(self.mounted, [])
