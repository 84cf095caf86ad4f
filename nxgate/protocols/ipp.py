"""The little IPP (RFC 8010/8011) that printing through NX needs,
pure: no sockets here (the HTTP around it is twisted.web's Agent).

The session's side asks the client's print server, through the NX cups
channel, which printers it has (``CUPS-Get-Printers``, or for a bare IPP
printer such as ``ippeveprinter`` ``Get-Printer-Attributes`` of
``/ipp/print``), so that the session's own cupsd gets one queue per client
printer.  Everything else (the jobs themselves) is spoken by CUPS's own
``ipp`` backend; this module only builds those few requests and reads the
answers, which come from a peer that may be anyone who can listen on the
channel's loopback port: every length is checked, sizes are bounded, and a
malformed answer is an :class:`IPPError`, never an exception of another kind.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

# Operations.
GET_PRINTER_ATTRIBUTES = 0x000B
CUPS_GET_DEFAULT = 0x4001
CUPS_GET_PRINTERS = 0x4002

# Delimiter tags.
OPERATION_GROUP, JOB_GROUP, END, PRINTER_GROUP, UNSUPPORTED_GROUP = 0x01, 0x02, 0x03, 0x04, 0x05

# Value tags used here.
INTEGER, BOOLEAN, ENUM = 0x21, 0x22, 0x23
TEXT, NAME, KEYWORD, URI, CHARSET, LANGUAGE = 0x41, 0x42, 0x44, 0x45, 0x47, 0x48

STATUS_OK_MAX = 0x00FF  # successful-ok ... successful-ok-*
OPERATION_NOT_SUPPORTED = 0x0501

#: The most an answer may hold: a print server's printer list is a few KiB.
MAX_RESPONSE = 1 << 20

PRINTER_ATTRIBUTES = ("printer-name", "printer-uri-supported", "printer-info", "printer-make-and-model")


class IPPError(Exception):
    """An answer that is not well-formed IPP over HTTP."""


@dataclass
class Message:
    """A decoded IPP response: its status and its attribute groups, each a
    (delimiter tag, {name: [values]}) pair; strings are decoded as UTF-8,
    integers and enums as int, booleans as bool, other values as bytes."""

    status: int
    request_id: int
    groups: list[tuple[int, dict[str, list[object]]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status <= STATUS_OK_MAX

    def group(self, tag: int) -> list[dict[str, list[object]]]:
        return [attributes for group_tag, attributes in self.groups if group_tag == tag]


def _attribute(tag: int, name: str, values: list[str | int]) -> bytes:
    out = b""
    for index, value in enumerate(values):
        encoded = struct.pack(">i", value) if isinstance(value, int) else value.encode("utf-8")
        key = name.encode() if index == 0 else b""
        out += struct.pack(">BH", tag, len(key)) + key + struct.pack(">H", len(encoded)) + encoded
    return out


def request(operation: int, request_id: int, printer_uri: str | None = None,
            requested: tuple[str, ...] = (), user: str = "nxgate") -> bytes:
    """An IPP/2.0 request with the operation attributes every request needs."""
    body = struct.pack(">BBHI", 2, 0, operation, request_id) + bytes([OPERATION_GROUP])
    body += _attribute(CHARSET, "attributes-charset", ["utf-8"])
    body += _attribute(LANGUAGE, "attributes-natural-language", ["en"])
    if printer_uri is not None:
        body += _attribute(URI, "printer-uri", [printer_uri])
    body += _attribute(NAME, "requesting-user-name", [user])
    if requested:
        body += _attribute(KEYWORD, "requested-attributes", list(requested))
    return body + bytes([END])


def decode(data: bytes) -> Message:
    """Decode an IPP response (raises IPPError on anything malformed)."""
    if len(data) < 9:
        raise IPPError("too short for an IPP message")
    _major, _minor, status, request_id = struct.unpack(">BBHI", data[:8])
    message = Message(status, request_id)
    position, current, last_name = 8, None, ""
    while True:
        if position >= len(data):
            raise IPPError("no end-of-attributes tag")
        tag = data[position]
        position += 1
        if tag == END:
            return message
        if tag < 0x10:  # a new group
            current = {}
            message.groups.append((tag, current))
            last_name = ""
            continue
        if current is None:
            raise IPPError("an attribute outside of any group")
        if position + 2 > len(data):
            raise IPPError("truncated attribute name length")
        (name_length,) = struct.unpack(">H", data[position:position + 2])
        position += 2
        name = data[position:position + name_length]
        position += name_length
        if position + 2 > len(data):
            raise IPPError("truncated attribute value length")
        (value_length,) = struct.unpack(">H", data[position:position + 2])
        position += 2
        value = data[position:position + value_length]
        if len(value) != value_length or len(name) != name_length:
            raise IPPError("truncated attribute")
        position += value_length
        if name_length:
            last_name = name.decode("utf-8", "replace")
        elif not last_name:
            raise IPPError("an additional value with no attribute before it")
        current.setdefault(last_name, []).append(_value(tag, value))


def _value(tag: int, value: bytes) -> object:
    if tag in (INTEGER, ENUM) and len(value) == 4:
        return struct.unpack(">i", value)[0]
    if tag == BOOLEAN and len(value) == 1:
        return value != b"\0"
    if 0x41 <= tag <= 0x49:
        return value.decode("utf-8", "replace")
    return value


# ------------------------------------------------------------------ HTTP
def http_post(path: str, body: bytes, host: str, authorization: str | None = None) -> bytes:
    """One IPP POST that asks the server to close the connection after it
    (raw bytes for tests that speak to a port by hand; the session side
    itself asks through twisted.web's Agent)."""
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/ipp",
            f"Content-Length: {len(body)}", "Connection: close"]
    if authorization is not None:
        head.append(f"Authorization: {authorization}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


# -------------------------------------------------------------- printers
_QUEUE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Printer:
    """One of the client's printers: its name there, the path of its IPP
    resource on the client's print server, and its description."""

    name: str
    resource: str
    info: str = ""
    default: bool = False

    @property
    def queue(self) -> str:
        """The session's queue name: CUPS allows fewer characters than
        printer names may hold (no spaces, '/', '#'), and the name also goes
        into cupsd's configuration, so anything else becomes '_'."""
        return (_QUEUE_UNSAFE.sub("_", self.name) or "printer")[:100]


def _text(value: object) -> str:
    text = value if isinstance(value, str) else ""
    return "".join(char for char in text if char.isprintable() and char not in "<>\"\\")[:200]


def _resource(uri: object, fallback: str) -> str:
    if not isinstance(uri, str):
        return fallback
    try:
        path = urlsplit(uri).path
    except ValueError:
        return fallback
    if not path.startswith("/"):
        return fallback
    return quote(unquote(path), safe="/")


def printers_of(message: Message, default_name: str | None = None) -> list[Printer]:
    """The printers in a CUPS-Get-Printers answer (one printer group each)."""
    found: dict[str, Printer] = {}
    for attributes in message.group(PRINTER_GROUP):
        name = _text((attributes.get("printer-name") or [""])[0])
        if not name:
            continue
        resource = _resource((attributes.get("printer-uri-supported") or [None])[0], "/printers/" + quote(name))
        info = _text((attributes.get("printer-info") or [""])[0])
        printer = Printer(name, resource, info, default=name == default_name)
        found.setdefault(printer.queue, printer)
    return list(found.values())


def default_name(message: Message) -> str | None:
    for attributes in message.group(PRINTER_GROUP):
        name = (attributes.get("printer-name") or [None])[0]
        if isinstance(name, str):
            return name
    return None
