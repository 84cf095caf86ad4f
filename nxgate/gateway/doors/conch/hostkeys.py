"""SSH host keys: loaded from the state directory, generated on first start."""

from __future__ import annotations

import os
import stat

from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from twisted.conch.ssh import keys
from twisted.logger import Logger

from nxgate.gateway.doors.keyfiles import ensure_private_dir, write_private_file

log = Logger()

HOST_KEY_FILES = {
    "ssh_host_ed25519_key": lambda: ed25519.Ed25519PrivateKey.generate(),
    "ssh_host_rsa_key": lambda: rsa.generate_private_key(public_exponent=65537, key_size=3072),
}


def load_host_keys(directory: str) -> dict[bytes, keys.Key]:
    """Private host keys by SSH key type; missing ones are generated (0600)."""
    ensure_private_dir(directory)
    result: dict[bytes, keys.Key] = {}
    for name, generate in HOST_KEY_FILES.items():
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            key = keys.Key(generate())
            write_private_file(path, key.toString("openssh"))
            write_public = path + ".pub"
            if not os.path.exists(write_public):
                with open(write_public, "wb") as handle:
                    handle.write(key.public().toString("openssh") + b"\n")
            log.info(
                "generated SSH host key {path} ({fingerprint})",
                path=path,
                fingerprint=key.fingerprint(keys.FingerprintFormats.SHA256_BASE64),
            )
        else:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & 0o077:
                log.warn("host key {path} had mode {mode:o}; set to 600", path=path, mode=mode)
                os.chmod(path, 0o600)
            key = keys.Key.fromFile(path)
        result[key.sshType()] = key
    return result
