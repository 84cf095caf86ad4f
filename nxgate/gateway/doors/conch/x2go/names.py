"""X2Go's names and numbers for nxgate sessions, and X2Go's output formats (pure).

X2Go clients know a session by a name such as
``alice-1003-1733339233_stDXFCE_dp24`` and by integer display, agent pid
and TCP ports; nxgate knows it by a 32-digit id.  Everything X2Go needs is
derived here from the session's view, for every session (started by an
NX client, the browser, D-Bus or an X2Go client alike), so that nothing
new is stored and any door's session is listed and resumable:

* the name from user, display, creation time, type (D/R/S and a command
  word) and depth; the command word is the session's own name when one was
  given (the NX client's profile, the portal, D-Bus ``rename``): it is what
  x2goclient shows in its sessions' "Command" column and part of the
  "Session Name" pyhoca-cli prints, the only place X2Go's listing has;
* the graphics/sound/folder ports as *virtual* numbers from the session id
  (nxgate's agents listen on a Unix socket only; this door alone resolves
  the number in a ``direct-tcpip`` request);
* the cookie listed: a keyed hash of the session id (with a secret of this
  gateway process) that the X2Go door asks the agent to take at the resume
  that follows (clients take the cookie from the listing they make before
  resuming); the agent's cookie itself is never listed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from nxgate.vocabulary.results import DesktopEntry, SessionView

#: What X2Go's own session-name check accepts (x2goserver's X2Go::Utils).
NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._@-]*-\d{2,5}-\d{9,12}_st[A-Za-z0-9.@-]*_dp\d{1,2}")
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")

#: nxgate session types and the word X2Go clients use for them.
TYPE_WORDS = {
    "unix-xfce": "XFCE", "unix-kde": "KDE", "unix-gnome": "GNOME", "unix-mate": "MATE", "unix-lxde": "LXDE",
    "unix-console": "TERMINAL", "unix-default": "DEFAULT", "unix-published": "PUBLISHED",
}
#: What a client may send as the command of x2gostartagent/x2goruncommand
#: (profile names, and the binaries the clients map them to), and the type.
DESKTOPS = {
    "XFCE": "unix-xfce", "XFCE4": "unix-xfce", "xfce4-session": "unix-xfce", "startxfce4": "unix-xfce",
    "KDE": "unix-kde", "startkde": "unix-kde", "startplasma-x11": "unix-kde",
    "GNOME": "unix-gnome", "gnome-session": "unix-gnome",
    "MATE": "unix-mate", "mate-session": "unix-mate",
    "LXDE": "unix-lxde", "startlxde": "unix-lxde",
    "TERMINAL": "unix-console",
}
PORT_BASE = 30000
PORT_SPAN = 10000  # graphics ports 30000..59997, each with sound and folder ports after it


@dataclass(frozen=True)
class X2GoNumbers:
    name: str
    display: int
    agent_pid: int
    gr_port: int
    sound_port: int
    fs_port: int
    cookie: str


def given_name(view: SessionView) -> str | None:
    """The session's name as an X2Go command word, when it is a name of its
    own (not its type or its program, which the word shows anyway): blanks
    become ``-``, what X2Go's names cannot hold goes."""
    name = (view.name or "").strip()
    defaults = {view.type, view.type.removeprefix("unix-"), TYPE_WORDS.get(view.type, ""),
                str(view.options.get("x2go_command", ""))}
    if not name or name.lower() in {default.lower() for default in defaults if default}:
        return None
    if view.type == "unix-application" and len(name.split()) == 1:
        return None  # an application's program: the word below
    word = _UNSAFE.sub("", re.sub(r"\s+", "-", name)).strip("-")[:40]
    return word or None


def command_word(view: SessionView) -> str:
    """The ``_st<kind><word>`` part's word: the session's own name, else a
    desktop's profile name or an application's program name (no ``_``:
    clients split the name on it)."""
    given = given_name(view)
    if given is not None:
        return given
    word = TYPE_WORDS.get(view.type)
    if word is None and view.type == "unix-application":
        word = str(view.options.get("x2go_command", "") or view.name or "APPLICATION").split()[0].rsplit("/", 1)[-1]
    elif word is None:
        word = view.type.removeprefix("unix-").upper()
    return _UNSAFE.sub("", word)[:40] or "APPLICATION"


def kind_letter(view: SessionView) -> str:
    if view.type.startswith("shadow"):
        return "S"
    return "R" if view.rootless else "D"


def session_name(view: SessionView) -> str:
    user = re.sub(r"[^A-Za-z0-9._@-]", "", view.user) or "user"
    return f"{user}-{view.display}-{int(view.created)}_st{kind_letter(view)}{command_word(view)}_dp{view.depth}"


def graphics_port(session_id: str) -> int:
    digest = hashlib.sha256(session_id.encode()).digest()
    return PORT_BASE + (int.from_bytes(digest[:4], "big") % PORT_SPAN) * 3


def link_cookie(secret: bytes, session_id: str) -> str:
    """The cookie this door shows for a session (32 hex digits)."""
    return hmac.new(secret, session_id.encode(), hashlib.sha256).hexdigest()[:32]


def numbers(view: SessionView, secret: bytes) -> X2GoNumbers:
    port = graphics_port(view.id)
    return X2GoNumbers(session_name(view), view.display, view.agent_pid or 1, port, port + 1, port + 2,
                       link_cookie(secret, view.id))


def find(views: Iterable[SessionView], name: str) -> SessionView | None:
    """The session an X2Go name stands for among ``views`` (the caller's)."""
    views = list(views)
    for view in views:
        if session_name(view) == name:
            return view
    # Tolerate a client that rewrote the command word: user, display and time decide.
    prefix = name.split("_st", 1)[0]
    for view in views:
        if session_name(view).split("_st", 1)[0] == prefix:
            return view
    return None


def status_letter(view: SessionView) -> str | None:
    status = view.status
    return {"Running": "R", "Suspended": "S"}.get(status or "")


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def _address(text: str) -> str:
    clean = re.sub(r"[^0-9A-Fa-f.:]", "", text.split(" ", 1)[0])
    return clean or "127.0.0.1"


def list_line(view: SessionView, secret: bytes, hostname: str, now: float) -> str | None:
    """One ``x2golistsessions`` line (16 ``|`` fields), None for a session
    X2Go would not list (ending, ended, or on a member that is down)."""
    letter = status_letter(view)
    if letter is None or view.lost:
        return None
    n = numbers(view, secret)
    fields = [n.agent_pid, n.name, n.display, hostname, letter, _when(view.created), n.cookie,
              _address(view.client_address), n.gr_port, n.sound_port, _when(view.changed), view.user,
              max(0, int(now - view.changed)), n.fs_port, -1, -1]
    return "|".join(str(value).replace("|", "").replace(" ", "") for value in fields)


def listing(views: Iterable[SessionView], secret: bytes, hostname: str, now: float) -> str:
    """``x2golistsessions``' output: suspended ones first, as X2Go's SQL orders them."""
    lines = [(status_letter(view) or "", line) for view in views
             if (line := list_line(view, secret, hostname, now)) is not None]
    lines.sort(key=lambda pair: pair[0], reverse=True)
    return "".join(line + "\n" for _, line in lines)


def start_output(n: X2GoNumbers) -> str:
    """``x2gostartagent``'s seven lines."""
    return "".join(f"{value}\n" for value in (n.display, n.cookie, n.agent_pid, n.name, n.gr_port, n.sound_port,
                                              n.fs_port))


def resume_output(n: X2GoNumbers) -> str:
    return f"gr_port={n.gr_port}\nsound_port={n.sound_port}\nfs_port={n.fs_port}\n"


#: x2goversion: pyhoca-cli wants an ``x2goserver`` line (else exit 1337).
SERVER_VERSION = "4.1.0.3"


def version_output(nxgate_version: str) -> str:
    return (f"x2goserver: {SERVER_VERSION}\nx2goserver-common: {SERVER_VERSION}\n"
            f"x2goserver-extensions: {SERVER_VERSION}\nnxgate: {nxgate_version}\n")


#: What x2gofeaturelist advertises: only what this door answers.
FEATURES = ("X2GO_LIST_DESKTOPS", "X2GO_CLIPBOARD_MODES", "X2GO_PUBLISHED_APPLICATIONS", "X2GO_MOUNTDIRS",
            "X2GO_UMOUNTSESSION_ALL", "X2GO_UMOUNTSESSION_ONLYPATH")


def _base64_chunks(data: bytes) -> list[str]:
    """Perl's ``encode_base64`` of each 3420-byte read, as x2gogetapps prints
    them: 76-character lines, each ending in a new line."""
    chunks = []
    for start in range(0, len(data), 60 * 57):
        text = base64.b64encode(data[start:start + 60 * 57]).decode()
        chunks.append("".join(text[i:i + 76] + "\n" for i in range(0, len(text), 76)))
    return chunks


def applications_output(entries: Iterable[DesktopEntry]) -> str:
    """``x2gogetapps``' output, byte for byte as x2goserver prints it: each
    entry's kept lines between ``<desktop>`` and ``</desktop>``, its icon in
    base64 between ``<icon>`` and ``</icon>`` where its ``Icon`` line stood."""
    out = []
    for entry in entries:
        parts = ["<desktop>"]
        for index, line in enumerate(entry.lines):
            if index == entry.icon_at:
                parts += ["<icon>", *_base64_chunks(entry.icon), "</icon>"]
            parts.append(line)
        if entry.icon_at >= len(entry.lines):
            parts += ["<icon>", *_base64_chunks(entry.icon), "</icon>"]
        parts.append("</desktop>")
        out.append("\n".join(parts) + "\n")
    return "".join(out)
