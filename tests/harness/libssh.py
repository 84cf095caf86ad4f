"""A password login as x2goclient makes it: Debian's libssh (the library x2goclient links) through ctypes.

x2goclient's ``SshMasterConnection::userAuthWithPass`` sends ``none``, then
keyboard-interactive when the server offers it (a first prompt that starts
with ``Password:`` answered with the password), then the password method
with the same password when that failed -- one typo, two SSH methods, on
one connection.  :func:`password_login` does exactly that with libssh's own
calls, so the test meets the server as x2goclient's library does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import tempfile

SSH_OK = 0
SSH_AUTH_SUCCESS, SSH_AUTH_DENIED, SSH_AUTH_PARTIAL, SSH_AUTH_INFO, SSH_AUTH_AGAIN = 0, 1, 2, 3, 4
METHOD_PASSWORD, METHOD_INTERACTIVE = 0x0002, 0x0010
OPTION_HOST, OPTION_PORT_STR, OPTION_USER, OPTION_SSH_DIR, OPTION_PROCESS_CONFIG = 0, 2, 4, 5, 38


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("ssh") or "libssh.so.4")
    lib.ssh_new.restype = ctypes.c_void_p
    lib.ssh_options_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    for name in ("ssh_connect", "ssh_disconnect", "ssh_free", "ssh_userauth_none", "ssh_userauth_list",
                 "ssh_userauth_kbdint", "ssh_userauth_kbdint_getnprompts", "ssh_userauth_kbdint_setanswer",
                 "ssh_userauth_password", "ssh_get_error", "ssh_userauth_kbdint_getprompt"):
        getattr(lib, name).argtypes = {
            "ssh_userauth_none": [ctypes.c_void_p, ctypes.c_char_p],
            "ssh_userauth_list": [ctypes.c_void_p, ctypes.c_char_p],
            "ssh_userauth_kbdint": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p],
            "ssh_userauth_kbdint_setanswer": [ctypes.c_void_p, ctypes.c_uint, ctypes.c_char_p],
            "ssh_userauth_kbdint_getprompt": [ctypes.c_void_p, ctypes.c_uint, ctypes.c_char_p],
            "ssh_userauth_password": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p],
        }.get(name, [ctypes.c_void_p])
    lib.ssh_get_error.restype = ctypes.c_char_p
    lib.ssh_userauth_kbdint_getprompt.restype = ctypes.c_char_p
    return lib


def password_login(host: str, port: int, user: str, password: str) -> tuple[bool, list[str]]:
    """(logged in, the methods tried in order), as x2goclient tries them."""
    lib = _library()
    session = lib.ssh_new()
    tried: list[str] = []
    config_dir = tempfile.mkdtemp(prefix="libssh-")
    try:
        no = ctypes.c_bool(False)
        for option, value in ((OPTION_HOST, host.encode()), (OPTION_PORT_STR, str(port).encode()),
                              (OPTION_USER, user.encode()), (OPTION_SSH_DIR, config_dir.encode())):
            lib.ssh_options_set(session, option, ctypes.c_char_p(value))
        lib.ssh_options_set(session, OPTION_PROCESS_CONFIG, ctypes.byref(no))
        if lib.ssh_connect(session) != SSH_OK:
            raise ConnectionError(f"libssh could not connect: {lib.ssh_get_error(session).decode()}")
        if lib.ssh_userauth_none(session, None) == SSH_AUTH_SUCCESS:
            return True, ["none"]
        methods = lib.ssh_userauth_list(session, None)
        if methods & METHOD_INTERACTIVE:
            tried.append("keyboard-interactive")
            result = lib.ssh_userauth_kbdint(session, None, None)
            while result == SSH_AUTH_INFO:
                for index in range(lib.ssh_userauth_kbdint_getnprompts(session)):
                    echo = ctypes.create_string_buffer(1)
                    prompt = lib.ssh_userauth_kbdint_getprompt(session, index, echo) or b""
                    if prompt.startswith(b"Password:"):
                        lib.ssh_userauth_kbdint_setanswer(session, index, password.encode())
                result = lib.ssh_userauth_kbdint(session, None, None)
            if result == SSH_AUTH_SUCCESS:
                return True, tried
        if methods & METHOD_PASSWORD:
            tried.append("password")
            if lib.ssh_userauth_password(session, None, password.encode()) == SSH_AUTH_SUCCESS:
                return True, tried
        return False, tried
    finally:
        lib.ssh_disconnect(session)
        lib.ssh_free(session)
        shutil.rmtree(config_dir, ignore_errors=True)
