"""X2Go's shared folders and printer, the pure parts: key bundles, x2gomountdirs' words, where mounts land, the
kernel's mount table, the mount point's ownership walk, and the printer's backend writing into a spool."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.conch.x2go import folders
from nxgate.node.services import x2go_folders, x2go_print
from nxgate.node.services.printing import RefusedRequests, x2go_printers_conf, x2go_server_bin
from nxgate.vocabulary.requests import SharedFolder


def rsa_bundle(directory: str) -> bytes:
    key = os.path.join(directory, "id")
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-f", key], check=True)
    host = os.path.join(directory, "host")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host], check=True)
    with open(key, "rb") as private, open(host + ".pub", "rb") as public:
        return private.read() + folders.IDENTITY_MARKER + public.read()


class KeyBundleTests(TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.directory)

    def test_a_bundle_gives_its_private_key_and_host_key(self):
        bundle = folders.parse_bundle(rsa_bundle(self.directory))
        self.assertTrue(bundle.private.startswith(b"-----BEGIN RSA PRIVATE KEY-----"))
        self.assertRegex(bundle.host_key, r"^ssh-ed25519 [A-Za-z0-9+/=]+$")
        self.assertNotIn("PRIVATE", repr(bundle))

    def test_what_is_not_a_bundle_is_refused_with_its_reason(self):
        good = rsa_bundle(self.directory)
        private, _, host = good.partition(folders.IDENTITY_MARKER)
        cases = {
            b"garbage": "no ----BEGIN RSA IDENTITY----",
            b"-----BEGIN RSA PRIVATE KEY-----\nnot a key\n-----END RSA PRIVATE KEY-----\n"
            + folders.IDENTITY_MARKER + host: "the private key is not one",
            host + folders.IDENTITY_MARKER + host: "a public key where the private key belongs",
            private + folders.IDENTITY_MARKER + b"ssh-rsa AAAA": "the host key is not one",
            private + folders.IDENTITY_MARKER + b"x-unknown AAAA": "the host key is not",
            b"x" * (folders.MAX_BUNDLE + 1): "more than a key bundle has",
        }
        for data, reason in cases.items():
            with self.assertRaises(folders.NotABundle) as raised:
                folders.parse_bundle(data)
            self.assertIn(reason, str(raised.exception))

    def test_kept_bundles_are_bounded_per_user_and_expire(self):
        now = [0.0]
        keys = folders.FolderKeys(lambda: now[0])
        bundle = folders.KeyBundle(b"k", "ssh-ed25519 AAAA")
        for number in range(folders.MAX_KEYS_PER_USER + 3):
            keys.put("alice", f"key.{number}", bundle)
        self.assertEqual(len([key for key in keys.kept if key[0] == "alice"]), folders.MAX_KEYS_PER_USER)
        self.assertIsNone(keys.get("bob", f"key.{folders.MAX_KEYS_PER_USER + 2}"))
        self.assertIs(keys.get("alice", f"key.{folders.MAX_KEYS_PER_USER + 2}"), bundle)
        now[0] = folders.KEY_LIFETIME + 1
        self.assertIsNone(keys.get("alice", f"key.{folders.MAX_KEYS_PER_USER + 2}"))

    def test_key_places(self):
        self.assertEqual(folders.key_name([".x2go", "ssh", "key.z123"]), "key.z123")
        self.assertIsNone(folders.key_name([".x2go", "C-x", ".pulse-cookie"]))
        self.assertIsNone(folders.key_name([".x2go", "ssh", "sub", "key.z"]))
        self.assertIsNone(folders.key_name([".x2go", "ssh", "keyring"]))


class MountDirsTests(TestCase):
    def test_python_x2go_and_x2goclient_forms(self):
        request = folders.parse_mountdirs(("dir", "alice-50-1_stDXFCE_dp24", "root", "/home/alice/.x2go/ssh/key.z1",
                                           "/home/root/my", "share__REVERSESSH_PORT__30003"))
        self.assertEqual(request.folders, (folders.SharedFolder("/home/root/my share", "disk"),))
        self.assertEqual(request.port, 30003)
        spool = folders.parse_mountdirs(("dir", "s", "bob", "key", "/a:/b/spool__PRINT_SPOOL_:/c__MIMEBOX_SPOOL___"
                                         "REVERSESSH_PORT__7"))
        self.assertEqual([(f.path, f.kind) for f in spool.folders],
                         [("/a", "disk"), ("/b/spool", "spool"), ("/c", "mimebox")])
        removable = folders.parse_mountdirs(("rem", "s", "bob", "key", "/media/usb__REVERSESSH_PORT__7"))
        self.assertEqual(removable.folders[0].kind, "removable")

    def test_refusals(self):
        for args, words in (
                (("dir", "s", "bob", "key", "/a__SSH_PORT__22"), "reverse forward"),
                (("dir", "s", "bob", "key", "/a"), "reverse forward"),
                (("dir", "s", "bob", "key", "relative__REVERSESSH_PORT__7"), "full path"),
                (("dir", "s", "bob", "key", "/a__REVERSESSH_PORT__x"), "the port"),
                (("dir", "s", "b b;", "key", "/a__REVERSESSH_PORT__7"), "user name"),
                (("dir", "s", "", "key", "/a__REVERSESSH_PORT__7"), "named no user of its machine"),
                (("cp", "s", "bob", "key", "/a__REVERSESSH_PORT__7"), "dir or rem"),
                (("dir", "s", "bob", "key", "/a\nb__REVERSESSH_PORT__7"), "full path"),
        ):
            with self.assertRaises(folders.MountRefused) as raised:
                folders.parse_mountdirs(args)
            self.assertIn(words, str(raised.exception))

    def test_the_output_python_x2go_counts(self):
        request = folders.parse_mountdirs(("dir", "s", "root", "key", "/x/y__REVERSESSH_PORT__7"))
        lines = (folders.mountdirs_header(request, "alice")
                 + folders.mountdirs_folder(request, "/x/y", "/tmp/.x2go-alice/media/disk/_x_y", True)).split("\n")
        self.assertTrue(lines[5].endswith("ok"))  # python-x2go: stdout[5].endswith('ok')
        self.assertEqual(folders.listmounts_output(["/p"]), "127.0.0.1|/p\n")


class MountPointTests(TestCase):
    def test_where_x2goserver_mounts(self):
        point = x2go_folders.mount_point
        self.assertEqual(point("alice", "ID", SharedFolder("/home/al ice/share")),
                         "/tmp/.x2go-alice/media/disk/_home_al_ice_share")
        self.assertEqual(point("alice", "ID", SharedFolder("/x", "spool")), "/tmp/.x2go-alice/spool/C-ID")
        self.assertEqual(point("alice", "ID", SharedFolder("/x", "mimebox")), "/tmp/.x2go-alice/mimebox/C-ID")
        self.assertEqual(point("alice", "ID", SharedFolder("/ramdrive/mnt/usb", "removable")),
                         "/tmp/.x2go-alice/media/rm/usb")
        for bad in ("relative", "/a\nb", "/" + "x" * 300):
            self.assertRaises(x2go_folders.FolderRefused, point, "alice", "ID", SharedFolder(bad))

    def test_the_sessions_mounts_from_the_kernels_table(self):
        table = ("40 27 0:40 / /tmp/.x2go-alice/media/disk/_a\\040b rw - fuse.sshfs nxgate-x2go:ID rw,user_id=1\n"
                 "41 27 0:41 / /tmp/.x2go-alice/spool/C-ID rw - fuse.sshfs nxgate-x2go:ID rw,user_id=1\n"
                 "42 27 0:42 / /tmp/.x2go-alice/media/disk/_c rw - fuse.sshfs nxgate-x2go:OTHER rw\n"
                 "43 27 0:43 / /etc rw - fuse.sshfs nxgate-x2go:ID rw\n"
                 "44 27 0:44 / /tmp/.x2go-alice/media/disk/_d rw shared:1 - fuse.smbnetfs nxgate-x2go:ID rw\n")
        self.assertEqual(x2go_folders.session_mounts(table, "ID", "alice"),
                         ["/tmp/.x2go-alice/media/disk/_a b", "/tmp/.x2go-alice/spool/C-ID"])
        self.assertEqual(x2go_folders.mounted_by_whom(table, "/tmp/.x2go-alice/media/disk/_c"), "nxgate-x2go:OTHER")
        self.assertIsNone(x2go_folders.mounted_by_whom(table, "/nowhere"))

    def test_sshfs_is_run_with_its_own_ssh_configuration(self):
        argv = x2go_folders.sshfs_argv(4000, "root", "/a b", "/tmp/.x2go-u/media/disk/_a_b", "/s/config", 1000, 1000,
                                       "ID")
        self.assertEqual(argv[:5], ["sshfs", "-F", "/s/config", "-p", "4000"])
        self.assertIn("fsname=nxgate-x2go:ID", argv[6])
        self.assertNotIn("allow_other", argv[6])
        self.assertEqual(argv[-2:], ["root@127.0.0.1:/a b", "/tmp/.x2go-u/media/disk/_a_b"])
        config = x2go_folders.ssh_config("/s/key", "/s/known")
        for line in ("IdentityFile /s/key", "StrictHostKeyChecking yes", "BatchMode yes", "HostKeyAlias x2go-client"):
            self.assertIn(f"  {line}\n", config)

    def test_the_ownership_walk_refuses_links_and_others_directories(self):
        base = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, base)
        os.chmod(base, 0o700)
        os.makedirs(os.path.join(base, "media", "disk"), mode=0o700)
        uid = os.getuid()
        self.assertIsNone(x2go_folders.owned_chain(base, os.path.join(base, "media", "disk"), uid))
        os.symlink("/etc", os.path.join(base, "media", "disk", "link"))
        self.assertRegex(x2go_folders.owned_chain(base, os.path.join(base, "media", "disk", "link"), uid),
                         r"is a symbolic link$")
        self.assertRegex(x2go_folders.owned_chain(base, os.path.join(base, "media"), uid + 1), r"belongs to uid")
        os.chmod(os.path.join(base, "media"), 0o777)
        self.assertRegex(x2go_folders.owned_chain(base, os.path.join(base, "media", "disk"), uid),
                         r"may be written by others")
        self.assertRegex(x2go_folders.owned_chain(base, "/etc", uid), r"is outside")


class PrinterTests(TestCase):
    def setUp(self) -> None:
        self.spool = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.spool)

    def job(self, data: bytes) -> int:
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        self.addCleanup(os.close, read)
        return read

    def test_a_job_becomes_a_pdf_and_its_ready_file(self):
        code, what = x2go_print.deliver(self.spool, "7", "alice", "a title\nwith a line", self.job(b"%PDF-1.4 x"),
                                        1000)
        self.assertEqual(code, x2go_print.CUPS_BACKEND_OK, what)
        names = sorted(os.listdir(self.spool))
        self.assertEqual(len(names), 2)
        pdf, ready = names
        self.assertRegex(pdf, r"^7-alice-cupsjob[0-9a-f]{16}\.pdf$")
        self.assertEqual(ready, pdf + ".ready")
        with open(os.path.join(self.spool, ready), encoding="utf-8") as handle:
            self.assertEqual(handle.read(), f"{pdf}\na title with a line")
        with open(os.path.join(self.spool, pdf), "rb") as handle:
            self.assertEqual(handle.read(), b"%PDF-1.4 x")

    def test_a_job_over_the_cap_is_cancelled_and_leaves_nothing(self):
        code, what = x2go_print.deliver(self.spool, "8", "alice", "big", self.job(b"x" * 5000), 1000)
        self.assertEqual(code, x2go_print.CUPS_BACKEND_CANCEL)
        self.assertIn("refused: larger than", what)
        self.assertEqual(os.listdir(self.spool), [])

    def test_no_spool_stops_the_queue(self):
        code, _ = x2go_print.deliver(os.path.join(self.spool, "gone"), "9", "a", "t", self.job(b""), 10)
        self.assertEqual(code, x2go_print.CUPS_BACKEND_STOP)
        self.assertEqual(x2go_print.spool_of("x2go:/tmp/.x2go-a/spool/C-1"), "/tmp/.x2go-a/spool/C-1")
        self.assertIsNone(x2go_print.spool_of("ipp://x/y"))
        self.assertIsNone(x2go_print.spool_of("x2go:/tmp/../etc"))

    def test_the_queue_and_its_programs(self):
        conf = x2go_printers_conf("/tmp/.x2go-a/spool/C-1")
        self.assertIn("<DefaultPrinter X2Go>", conf)
        self.assertIn("DeviceURI x2go:/tmp/.x2go-a/spool/C-1", conf)
        links = x2go_server_bin("/venv/bin/nxgate-x2go-print")
        self.assertEqual(links["backend/x2go"], "/venv/bin/nxgate-x2go-print")
        self.assertEqual(links["filter"], "/usr/lib/cups/filter")

    def test_cupsds_refusals_of_a_requests_size_are_read_from_its_access_log_once_each(self):
        """cupsd says nothing else of a request past MaxRequestSize: its access log has the request's line with
        HTTP 413, twice (as read and as closed); each refusal is one line in the gateway's log."""
        refused = RefusedRequests()
        line = ('localhost - - [06/Dec/2026:05:23:07 +0000] "POST /printers/X2Go HTTP/1.1" 413 104858000 '
                'Send-Document -')
        self.assertIsNone(refused.words('localhost - - [06/Dec/2026:05:23:07 +0000] "POST /printers/X2Go HTTP/1.1"'
                                        ' 200 362 Create-Job successful-ok'))
        words = refused.words(line)
        self.assertIn("Send-Document request to /printers/X2Go larger than X2Go's printer takes (100 MiB", words)
        self.assertIsNone(refused.words(line.replace("05:23:07", "05:23:09")))  # its repeat, as the connection closes
        self.assertIsNotNone(refused.words(line.replace("05:23:07", "05:24:00")))  # another job of the same size
        refused.words('localhost - - [06/Dec/2026:05:24:00 +0000] "POST /jobs/ HTTP/1.1" 200 169 Cancel-Job '
                      'successful-ok')
        self.assertIsNotNone(refused.words(line.replace("05:23:07", "05:24:01")))  # after another request: new
        for noise in ("", "x" * 5000, "413", 'a b c [t] "POST / HTTP/1.1" 413', "\x00" * 10):
            self.assertIsNone(refused.words(noise))
