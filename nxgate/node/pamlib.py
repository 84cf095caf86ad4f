"""Blocking PAM transactions over python-pam's ctypes bindings.

python-pam's ``authenticate()`` answers every prompt with one password and
offers no session calls, so we use its bindings (``pam.__internals``, the
same in python-pam 2.0 and 2.1) with a conversation function of our own.
Everything here blocks: call it from a thread (authentication) or from the
launcher process (sessions), never from the reactor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from ctypes import POINTER, byref, c_char, c_char_p, c_int, c_void_p, cast, memmove, sizeof
from typing import Any

from pam import __internals as libpam

PAM_SUCCESS = 0
PAM_CONV_ERR = 19
PAM_TTY = 3
PAM_RHOST = 4
PAM_DISALLOW_NULL_AUTHTOK = 0x0001
PAM_ESTABLISH_CRED = 0x0002
PAM_DELETE_CRED = 0x0004
PAM_DATA_SILENT = 0x40000000
PAM_PROMPT_ECHO_OFF = 1
PAM_PROMPT_ECHO_ON = 2

# One prompt from PAM: (style, text); styles 1-4 as in <security/_pam_types.h>.
Prompt = tuple[int, str]
Responder = Callable[[Sequence[Prompt]], Sequence[str | None]]

_library: Any = None


def library() -> Any:
    """libpam's functions, bound once by python-pam."""
    global _library
    if _library is None:
        lib = libpam.PamAuthenticator()
        lib.pam_setcred.restype = c_int
        lib.pam_setcred.argtypes = [libpam.PamHandle, c_int]
        lib.pam_getenvlist.restype = POINTER(c_char_p)
        lib.pam_getenvlist.argtypes = [libpam.PamHandle]
        _library = lib
    return _library


def encode(text: str) -> bytes:
    """The client's exact bytes (the protocol layer decoded them losslessly)."""
    return text.encode("utf-8", "surrogateescape")


class Transaction:
    """One PAM handle: ``pam_start`` ... ``pam_end``."""

    def __init__(self, service: str, username: str, respond: Responder | None = None) -> None:
        self.lib = library()
        self.respond = respond
        self.handle = libpam.PamHandle()
        self._conversation = libpam.conv_func(self._converse)  # keep alive while the handle is
        self._conv = libpam.PamConv(self._conversation, None)
        self._items: list[Any] = []
        self.code = self.lib.pam_start(service.encode(), encode(username), byref(self._conv), byref(self.handle))
        if self.code != PAM_SUCCESS:
            raise OSError(f"pam_start failed ({self.code})")

    def _converse(self, count, messages, responses, _appdata):  # type: ignore[no-untyped-def]
        prompts = [
            (messages[i].contents.msg_style, (messages[i].contents.msg or b"").decode("utf-8", "replace"))
            for i in range(count)
        ]
        try:
            if self.respond is None:
                raise LookupError("this transaction cannot answer questions")
            answers = list(self.respond(prompts))
        except Exception:
            return PAM_CONV_ERR
        array = cast(self.lib.calloc(count, sizeof(libpam.PamResponse)), POINTER(libpam.PamResponse))
        for i, (style, _text) in enumerate(prompts):
            answer = answers[i] if i < len(answers) else None
            if style in (PAM_PROMPT_ECHO_OFF, PAM_PROMPT_ECHO_ON) and answer is not None:
                data = encode(answer)
                address = self.lib.calloc(len(data) + 1, sizeof(c_char))  # PAM frees it
                memmove(address, data, len(data))
                array[i].resp = cast(address, c_char_p)
            array[i].resp_retcode = 0
        responses[0] = array
        return PAM_SUCCESS

    def set_item(self, item: int, value: str | None) -> None:
        if value:
            buffer = c_char_p(value.encode())
            self._items.append(buffer)
            self.lib.pam_set_item(self.handle, item, cast(buffer, c_void_p))

    def call(self, name: str, flags: int = 0) -> int:
        self.code = getattr(self.lib, name)(self.handle, flags)
        return self.code

    def message(self, code: int | None = None) -> str:
        text = self.lib.pam_strerror(self.handle, self.code if code is None else code)
        return (text or b"").decode("utf-8", "replace")

    def environment(self) -> dict[str, str]:
        """The variables PAM modules set (pam_env, pam_systemd, ...)."""
        result: dict[str, str] = {}
        entries = self.lib.pam_getenvlist(self.handle)
        if not entries:
            return result
        index = 0
        while entries[index]:
            name, _, value = entries[index].decode("utf-8", "replace").partition("=")
            result[name] = value
            index += 1
        return result

    def end(self, flags: int = 0) -> None:
        self.lib.pam_end(self.handle, self.code | flags)


def authenticate(service: str, username: str, respond: Responder | None, remote_host: str | None) -> tuple[int, str]:
    """Authenticate (when ``respond`` is given) and check the account."""
    transaction = Transaction(service, username, respond)
    try:
        transaction.set_item(PAM_RHOST, remote_host)
        code = PAM_SUCCESS
        if respond is not None:
            code = transaction.call("pam_authenticate", PAM_DISALLOW_NULL_AUTHTOK)
        if code == PAM_SUCCESS:
            code = transaction.call("pam_acct_mgmt", PAM_DISALLOW_NULL_AUTHTOK)
        return code, transaction.message(code)
    finally:
        transaction.end()


def open_session(service: str, username: str, remote_host: str | None, tty: str | None) -> Transaction:
    """Establish credentials and open a session; the caller ends the handle."""
    transaction = Transaction(service, username)
    transaction.set_item(PAM_RHOST, remote_host)
    transaction.set_item(PAM_TTY, tty)
    for call, flags in (("pam_setcred", PAM_ESTABLISH_CRED), ("pam_open_session", 0)):
        if transaction.call(call, flags) != PAM_SUCCESS:
            message = f"{call}: {transaction.message()} ({transaction.code})"
            transaction.end()
            raise OSError(message)
    return transaction


def close_session(service: str, username: str, remote_host: str | None, tty: str | None) -> tuple[int, str]:
    """Close a session opened by another process (the gateway may have restarted)."""
    transaction = Transaction(service, username)
    try:
        transaction.set_item(PAM_RHOST, remote_host)
        transaction.set_item(PAM_TTY, tty)
        code = transaction.call("pam_close_session", 0)
        transaction.call("pam_setcred", PAM_DELETE_CRED)
        return code, transaction.message(code)
    finally:
        transaction.end()


def resolve_service(name: str, pam_dir: str = "/etc/pam.d") -> str:
    """The PAM service to use: ``name`` if it is configured, else ``login``."""
    if os.path.exists(os.path.join(pam_dir, name)):
        return name
    # Imported here: the launcher (nxgate.node.runas) imports this module at
    # every session start, and Twisted's logger would double its start-up.
    from twisted.logger import Logger

    Logger().warn(
        "PAM service {service!r} has no file in {dir}; using 'login' instead",
        service=name,
        dir=pam_dir,
    )
    return "login"
