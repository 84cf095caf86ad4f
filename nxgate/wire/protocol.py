"""What gateway and node say to each other over AMP: one generic call.

The node answers the node interface (:class:`nxgate.vocabulary.api.NodeAPI`:
the session API and what doors need beyond it) for the gateways.  Rather than one AMP command and one hand-written
converter per method, there is one command, :class:`Call` (method name,
arguments, outcome), and one serialiser for the session vocabulary's
frozen dataclasses, driven by their type hints: :func:`encode` makes JSON
values of them, :func:`decode` rebuilds exactly the declared type (tuples,
frozensets, enums, nested dataclasses, optional values).  The argument and
result types of a method are read from ``NodeAPI`` itself, so a new
method or field needs no change here.

A refusal travels as its :class:`~nxgate.vocabulary.errors.SessionError`
kind and sentence, so the door on the gateway answers with the same NX
line as it would for a local session.  ``attach_shadow``'s progress
(asking the owner) comes back as :class:`Progress` boxes for the call;
after :class:`Subscribe` the node pushes its sessions' changes as
:class:`Event` boxes (D-Bus signals, the portal's refreshes on every member).

``open_stream`` is no AMP call: its result is a connection.  Its request
travels as the first line of a stream connection of its own
(:func:`stream_request`, read by :func:`read_stream_request`), with the
same encoding of its arguments; the node answers ``OK`` or ``ERR`` and the
refusal's kind and words (:func:`stream_refusal`, :func:`read_stream_answer`).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import inspect
import json
import types
import typing
from typing import Any

from twisted.protocols import amp

from nxgate.vocabulary.api import NodeAPI
from nxgate.vocabulary.errors import Kind, SessionError

#: The NodeAPI methods whose result is a connection: each has a connection of its own, not an AMP call.
STREAMED = frozenset({"open_stream"})
#: The methods a gateway may call over AMP: the public coroutine methods of NodeAPI (and so of SessionAPI).
METHODS: frozenset[str] = frozenset(name for owner in NodeAPI.__mro__ for name, value in vars(owner).items()
                                    if inspect.iscoroutinefunction(value) and not name.startswith("_")) - STREAMED

#: A value bigger than AMP's 64 KiB is cut into keys ``name``, ``name.1``, ...
_CHUNK = amp.MAX_VALUE_LENGTH


# ------------------------------------------------------------- serialiser
def encode(value: Any) -> Any:
    """``value`` as JSON-ready data (dataclasses as objects by field name)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (frozenset, set)):
        return sorted(encode(item) for item in value)
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(key): encode(item) for key, item in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot send a {type(value).__name__} to another member")


_hints_cache: dict[Any, dict[str, Any]] = {}


def _hints(owner: Any) -> dict[str, Any]:
    hints = _hints_cache.get(owner)
    if hints is None:
        hints = _hints_cache[owner] = typing.get_type_hints(owner)
    return hints


def decode(hint: Any, data: Any) -> Any:
    """Rebuild a value of type ``hint`` from :func:`encode`'s data; a value
    of another shape raises ValueError (a peer's bug, not a crash here)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [arg for arg in args if arg is not type(None)]
        if len(options) != 1:
            raise ValueError(f"cannot decode the union {hint}")
        return decode(options[0], data)
    if origin is tuple:
        _expect(data, list, hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], item) for item in data)
        if len(args) != len(data):
            raise ValueError(f"expected {len(args)} items for {hint}, got {len(data)}")
        return tuple(decode(arg, item) for arg, item in zip(args, data))
    if origin is frozenset:
        _expect(data, list, hint)
        return frozenset(decode(args[0], item) for item in data)
    if origin is dict:
        _expect(data, dict, hint)
        return {key: decode(args[1], item) for key, item in data.items()}
    if dataclasses.is_dataclass(hint):
        _expect(data, dict, hint)
        hints = _hints(hint)
        values = {f.name: decode(hints[f.name], data[f.name])
                  for f in dataclasses.fields(hint) if f.init and f.name in data}
        return hint(**values)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(data)
    if hint is bytes:
        _expect(data, str, hint)
        try:
            return base64.b64decode(data, validate=True)
        except ValueError as error:
            raise ValueError(f"bad base64 for bytes: {error}") from None
    if hint is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if hint in (str, int, float, bool):
        if type(data) is not hint:
            raise ValueError(f"expected {hint.__name__}, got {type(data).__name__}")
        return data
    raise ValueError(f"cannot decode a {hint}")


def _expect(data: Any, kind: type, hint: Any) -> None:
    if not isinstance(data, kind):
        raise ValueError(f"expected a {kind.__name__} for {hint}, got {type(data).__name__}")


def signature(method: str) -> tuple[list[tuple[str, Any]], Any]:
    """``([(argument, type), ...], result type)`` of a NodeAPI method,
    without ``self`` and the progress callback (that travels as boxes)."""
    hints = _hints(getattr(NodeAPI, method))
    parameters = [name for name in inspect.signature(getattr(NodeAPI, method)).parameters
                  if name not in ("self", "progress")]
    return [(name, hints[name]) for name in parameters], hints["return"]


def encode_arguments(method: str, arguments: tuple[Any, ...], methods: frozenset[str] = METHODS) -> list[Any]:
    """The arguments of a call of one of ``methods`` (the AMP calls; :data:`STREAMED` for a stream's request)."""
    if method not in methods:
        raise ValueError(f"no session method {method!r}")
    return [encode(value) for value in arguments]


def decode_arguments(method: str, data: Any, methods: frozenset[str] = METHODS) -> list[Any]:
    """The arguments of a call, checked against the method's signature
    (a trailing optional argument may be left out)."""
    if method not in methods:
        raise ValueError(f"no session method {method!r}")
    parameters, _ = signature(method)
    _expect(data, list, method)
    if len(data) > len(parameters):
        raise ValueError(f"too many arguments for {method}")
    return [decode(hint, value) for (_, hint), value in zip(parameters, data)]


def encode_error(error: SessionError) -> dict[str, Any]:
    return {"error": {"kind": error.kind.value, "message": error.message, "session_id": error.session_id}}


def decode_outcome(method: str, outcome: Any) -> Any:
    """The result of a call, or its SessionError raised again here."""
    _expect(outcome, dict, "outcome")
    if "error" in outcome:
        error = outcome["error"]
        try:
            kind = Kind(error["kind"])
        except ValueError:  # a kind this version does not know
            kind = Kind.INTERNAL
        raise SessionError(kind, str(error["message"]), session_id=error.get("session_id"))
    return decode(signature(method)[1], outcome["ok"])


# ---------------------------------------------------------- streams
#: A stream connection starts with this, then its request as JSON, then a newline.
STREAM_HELLO = b"NXSTREAM "
#: The longest request line a node reads (a caller's groups make it grow).
MAX_STREAM_REQUEST = 64 * 1024
#: The longest answer line a gateway reads.
MAX_STREAM_ANSWER = 4096


def stream_request(caller: Any, session_id: str, kind: Any) -> bytes:
    """The first line of a stream connection: ``open_stream(caller, session_id, kind)``."""
    arguments = encode_arguments("open_stream", (caller, session_id, kind), STREAMED)
    return STREAM_HELLO + json.dumps(arguments, separators=(",", ":")).encode() + b"\n"


def read_stream_request(line: bytes) -> list[Any]:
    """``[caller, session_id, kind]`` of a request line (without its newline), checked
    against ``open_stream``'s signature; ValueError if it is not one."""
    if not line.startswith(STREAM_HELLO):
        raise ValueError("not a stream request")
    try:
        data = json.loads(line[len(STREAM_HELLO):])
    except ValueError as error:
        raise ValueError(f"a stream request that is not JSON: {error}") from None
    values = decode_arguments("open_stream", data, STREAMED)
    if len(values) != 3:
        raise ValueError("a stream request without its three arguments")
    return values


def stream_refusal(error: SessionError) -> bytes:
    """The node's answer when it does not open the stream: the refusal's kind and words."""
    line = b"ERR " + json.dumps(encode_error(error), separators=(",", ":")).encode()
    if len(line) >= MAX_STREAM_ANSWER:
        short = SessionError(error.kind, error.message[:1000], session_id=error.session_id)
        line = b"ERR " + json.dumps(encode_error(short), separators=(",", ":")).encode()
    return line + b"\n"


def read_stream_answer(line: bytes) -> None:
    """Nothing for ``OK``; the node's refusal raised again; ValueError for anything else."""
    if line == b"OK":
        return
    if not line.startswith(b"ERR "):
        raise ValueError("the node's answer was unreadable")
    try:
        outcome = json.loads(line[4:])
    except ValueError:
        raise ValueError("the node's refusal was unreadable") from None
    if not isinstance(outcome, dict) or not isinstance(outcome.get("error"), dict):
        raise ValueError("the node's refusal was unreadable")
    try:
        decode_outcome("open_stream", outcome)  # raises the SessionError
    except (KeyError, TypeError):
        pass
    raise ValueError("the node's refusal was unreadable")


# ----------------------------------------------------------------- AMP
class JSON(amp.Argument):
    """A JSON value of any size (split over several keys past 64 KiB)."""

    def toBox(self, name: bytes, strings: Any, objects: Any, proto: Any) -> None:
        data = json.dumps(objects.pop(name.decode()), separators=(",", ":")).encode()
        strings[name] = data[:_CHUNK]
        for index, start in enumerate(range(_CHUNK, len(data), _CHUNK), 1):
            strings[name + b".%d" % index] = data[start:start + _CHUNK]

    def fromBox(self, name: bytes, strings: Any, objects: Any, proto: Any) -> None:
        parts, index = [strings.pop(name)], 1
        while name + b".%d" % index in strings:
            parts.append(strings.pop(name + b".%d" % index))
            index += 1
        objects[name.decode()] = json.loads(b"".join(parts))


class Call(amp.Command):
    """Run ``method`` of the node's session service with ``arguments``; the
    outcome is ``{"ok": result}`` or ``{"error": {kind, message, session_id}}``."""

    arguments = [(b"call", amp.Integer()), (b"method", amp.Unicode()), (b"arguments", JSON())]
    response = [(b"outcome", JSON())]


class Progress(amp.Command):
    """Node to gateway: call ``call`` has this progress (nxgate.vocabulary.results.Progress)."""

    arguments = [(b"call", amp.Integer()), (b"progress", amp.Unicode())]
    response: list[Any] = []
    requiresAnswer = False


class Subscribe(amp.Command):
    """Gateway to node: push me every change of your sessions (:class:`Event`) while this connection lasts."""

    arguments: list[Any] = []
    response: list[Any] = []


class Event(amp.Command):
    """Node to gateway: one of its sessions changed (an encoded nxgate.vocabulary.results.SessionEvent)."""

    arguments = [(b"event", JSON())]
    response: list[Any] = []
    requiresAnswer = False
