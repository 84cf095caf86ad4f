"""The words of a session's byte streams: which end a door asks for, and what it gets.

Every door reaches a session's bytes one way, ``open_stream(caller,
session_id, kind)`` of the node interface (:class:`nxgate.vocabulary.api.NodeAPI`,
which the router routes to the session's node like any other call).  The
node checks the owner, opens the end that ``kind`` names, and hands back a
:class:`Stream`: connected, not read yet.

A kind is a word, and for the kinds that pick one of several things of a
session (a connection waiting on its node, say), a number: ``agent`` (the
agent's NX stream, after ``bye``), ``view`` (RFB of the session's own
screen, from an x11vnc its node starts for this stream), and whatever a
node learns to open later (each kind is one opener on the node; a node
that does not know a kind refuses it with words, so an old node and a new
gateway still talk).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any, Protocol

_WORD = re.compile(r"[a-z][a-z0-9_-]{0,31}")


@dataclass(frozen=True)
class StreamKind:
    """Which of a session's ends a stream reaches (see the module's docstring)."""

    word: str
    number: int | None = None

    def __post_init__(self) -> None:
        if not _WORD.fullmatch(self.word):
            raise ValueError(f"not a stream kind: {self.word[:40]!r}")
        if self.number is not None and not 0 <= self.number < 2 ** 31:
            raise ValueError(f"not a stream number: {self.number}")

    def __str__(self) -> str:
        return self.word if self.number is None else f"{self.word} {self.number}"


#: The session's agent: the NX proxy's bytes, both ways.
AGENT = StreamKind("agent")
#: RFB of the session's own screen (an x11vnc next to its agent, for this stream only).
VIEW = StreamKind("view")


class Stream(Protocol):
    """A connected byte stream to one end of a session (what ``open_stream`` gives).

    Its taker does exactly one of :meth:`attach`, :meth:`take_socket` or
    :meth:`close`.  Nothing is read before that: the end may wait, and
    what it sends meanwhile waits for the taker."""

    session_id: str
    kind: StreamKind
    #: The member that runs the session ("": this machine), for the logs.
    node: str

    def attach(self, protocol: Any) -> None:
        """``protocol`` (a Twisted ``IProtocol``) gets the connection now:
        ``makeConnection``, then every byte and the end.  The bytes go
        straight to it: no copy, no hop beyond the connection itself."""

    def take_socket(self) -> socket.socket:
        """The stream as a connected socket that the taker owns from now on
        (to hand to another process: the OpenSSH door's ``nxgate-shell``).
        On this machine it is the end's own socket; for a session on another
        member, one end of a socket pair this process joins to that member."""

    def close(self) -> None:
        """Not wanted after all: close it (and whatever the node started for it)."""

    def ended(self) -> str:
        """Why the node ended the stream, in words for the user ("" when it did not,
        or cannot tell): a live view ends when an NX client takes the session."""
