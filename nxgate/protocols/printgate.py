"""The client's gate in front of its print server (issue 14), pure (sans-IO).

The session's side of the NX cups channel listens on 127.0.0.1:2000+display
on the server, where every local user can connect (a Unix socket cannot be
kept there, see :mod:`nxgate.protocols.channels`).  What comes out of the channel on
the client's side therefore first meets this gate: each HTTP request must
carry ``Authorization: Basic`` for :data:`USER` and the credential derived
from the session cookie (:func:`credential`), which only the session's owner
(in its cupsd's 0600 printers.conf) and the client (who got the cookie in
``NX> 701``) know.  Without it the gate answers ``401`` and closes; with it
the header is removed (the local CUPS must not see, check or log it) and
``Host`` is set to the print server's own name (a CUPS checks it), and the
request goes on to the local print server unchanged.  Answers go back untouched.

Requests that come through the session's own SSH channel (issue 25,
:mod:`nxgate.protocols.service_tunnel`) need no credential: the gateway let only the session
user's processes into that channel, which is what the credential stood for,
and CUPS's backend would otherwise pay a 401 and a new connection per job.
The header is still taken off and ``Host`` still set.

CUPS's ``ipp`` backend sends the credential from the device URI's user info
after the ``401``; it sends it again with every later request on the same
connection, so every request is checked.  Request bodies are framed
(``Content-Length`` or chunked) only to find where the next request starts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

USER = "nxgate"
REALM = "nxgate printing"
MAX_HEAD = 16384
MAX_CHUNK_LINE = 1024

UNAUTHORIZED = (
    "HTTP/1.1 401 Unauthorized\r\n"
    f'WWW-Authenticate: Basic realm="{REALM}"\r\n'
    "Content-Length: 0\r\n"
    "Connection: close\r\n\r\n"
).encode()
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def credential(session_cookie: str) -> str:
    """The password of a session's cups channel: derived from the session
    cookie, so a new one comes with every resume."""
    return hmac.new(session_cookie.encode(), b"nxgate printing", hashlib.sha256).hexdigest()


def authorization(session_cookie: str) -> str:
    """The ``Authorization`` value that opens the gate."""
    token = base64.b64encode(f"{USER}:{credential(session_cookie)}".encode()).decode()
    return f"Basic {token}"


@dataclass
class Output:
    """What one call to :meth:`Gate.feed` asks for."""

    to_server: bytes = b""
    to_client: bytes = b""
    close: bool = False
    refused: int = 0  # requests refused in this call (for the log)


@dataclass
class Gate:
    """One channel connection's requests, checked and passed on."""

    session_cookie: str
    host: str = "localhost"
    #: False for connections that came through the session's own SSH channel
    #: (nxgate.protocols.service_tunnel): the gateway let in only the session user's processes.
    credential_required: bool = True
    _buffer: bytes = b""
    _state: str = "head"  # head, body, chunk-size, chunk-data, chunk-end, trailer, closed
    _left: int = 0
    _expected: str = field(init=False)

    def __post_init__(self) -> None:
        self._expected = authorization(self.session_cookie)

    def feed(self, data: bytes) -> Output:
        out = Output()
        if self._state == "closed":
            return out
        self._buffer += data
        while self._buffer and self._state != "closed":
            if not self._step(out):
                break
        return out

    def _refuse(self, out: Output, answer: bytes) -> None:
        out.to_client += answer
        out.close = True
        out.refused += 1
        self._state = "closed"
        self._buffer = b""

    def _step(self, out: Output) -> bool:
        """One piece of work; False when more data is needed."""
        if self._state == "head":
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    self._refuse(out, BAD_REQUEST)
                return False
            head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
            self._head(head, out)
            return True
        if self._state == "body":
            piece = self._buffer[:self._left]
            self._buffer = self._buffer[len(piece):]
            self._left -= len(piece)
            out.to_server += piece
            if self._left == 0:
                self._state = "head"
            return True
        if self._state in ("chunk-size", "chunk-end", "trailer"):
            end = self._buffer.find(b"\r\n")
            if end < 0:
                if len(self._buffer) > MAX_CHUNK_LINE:
                    self._refuse(out, BAD_REQUEST)
                return False
            line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
            out.to_server += line + b"\r\n"
            if self._state == "chunk-end":
                self._state = "chunk-size"
            elif self._state == "trailer":
                if not line:
                    self._state = "head"
            else:
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    self._refuse(out, BAD_REQUEST)
                    return False
                if size < 0:
                    self._refuse(out, BAD_REQUEST)
                    return False
                self._state, self._left = ("trailer", 0) if size == 0 else ("chunk-data", size)
            return True
        # chunk-data
        piece = self._buffer[:self._left]
        self._buffer = self._buffer[len(piece):]
        self._left -= len(piece)
        out.to_server += piece
        if self._left == 0:
            self._state = "chunk-end"
        return True

    def _head(self, head: bytes, out: Output) -> None:
        lines = head.split(b"\r\n")
        request_line, headers = lines[0], lines[1:]
        if len(request_line.split(b" ")) != 3:
            self._refuse(out, BAD_REQUEST)
            return
        authorized, length, chunked, kept = False, 0, False, []
        for line in headers:
            name, sep, value = line.partition(b":")
            if not sep:
                self._refuse(out, BAD_REQUEST)
                return
            key = name.strip().lower()
            text = value.strip().decode("latin-1")
            if key == b"authorization":
                authorized = hmac.compare_digest(text.encode(), self._expected.encode())
                continue  # never passed on
            if key == b"host":
                continue  # replaced below
            if key == b"transfer-encoding":
                chunked = "chunked" in text.lower()
            elif key == b"content-length":
                if not text.isdigit():
                    self._refuse(out, BAD_REQUEST)
                    return
                length = int(text)
            kept.append(line)
        if not authorized and self.credential_required:
            self._refuse(out, UNAUTHORIZED)
            return
        out.to_server += b"\r\n".join([request_line, b"Host: " + self.host.encode(), *kept]) + b"\r\n\r\n"
        if chunked:
            self._state = "chunk-size"
        elif length:
            self._state, self._left = "body", length
