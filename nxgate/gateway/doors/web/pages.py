"""The portal's HTML, as pure functions of what the page shows.

Every value is escaped; no page carries inline script or style (the
Content-Security-Policy forbids both), a session appears only by its opaque
per-login handle, and every form that changes something carries the CSRF token.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS = {
    b"Content-Security-Policy": CSP.encode(),
    b"X-Content-Type-Options": b"nosniff",
    b"X-Frame-Options": b"DENY",
    b"Referrer-Policy": b"no-referrer",
    b"Cache-Control": b"no-store",
    b"Cross-Origin-Opener-Policy": b"same-origin",
}

#: What a page says after a redirect (``?m=started``): fixed words, never text from the URL.
NOTICES = {
    "started": "A new session was started; it is listed as Suspended until you open it.",
    "opening": "A new session was started; opening it in this window…",
    "suspended": "The session was suspended.",
    "terminated": "The session was terminated.",
    "drain": "This node is draining: no new sessions.",
    "undrain": "This node accepts new sessions again.",
}


@dataclass(frozen=True)
class Row:
    """One session as a page lists it."""

    handle: str
    name: str
    type: str
    state: str
    since: float
    thumbnail: bool  # running or suspended: a picture is offered
    user: str = ""
    node: str = ""
    client: str = ""
    openable: bool = False
    shadowable: bool = False  # the admin page: the shadow policy lets this admin watch it now (running, not jailed)
    asks_owner: bool = False  # ...after its owner agrees (the viewer's page says so while it waits)


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def hidden(name: str, value: str) -> str:
    return f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'


def button(action: str, csrf: str, label: str, css: str = "", **fields: str) -> str:
    inputs = hidden("csrf", csrf) + "".join(hidden(k, v) for k, v in fields.items())
    return (f'<form method="post" action="{escape(action)}" class="inline">{inputs}'
            f'<button type="submit" class="{escape(css)}">{escape(label)}</button></form>')


def document(title: str, body: str, user: str = "", csrf: str = "", admin: bool = False,
             scripts: Sequence[str] = ()) -> str:
    nav = ""
    if user:
        links = '<a href="/">My sessions</a>' + (' <a href="/admin">All sessions</a>' if admin else "")
        nav = (f'<nav>{links}<span class="who">{escape(user)}</span>'
               f'{button("/logout", csrf, "Log out", "logout")}</nav>')
    tags = "".join(f'<script src="{escape(src)}" defer></script>' for src in scripts)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)} – nxgate</title><link rel=\"stylesheet\" href=\"/static/portal.css\">{tags}"
            f"</head><body><header><h1>nxgate</h1>{nav}</header><main>{body}</main></body></html>\n")


def login_form(token: str, message: str = "", user: str = "") -> str:
    note = f'<p class="error" role="alert">{escape(message)}</p>' if message else ""
    return (f'<section class="login"><h2>Log in</h2>{note}'
            f'<form method="post" action="/login">{hidden("csrf", token)}'
            f'<label>User <input name="user" autocomplete="username" required value="{escape(user)}"></label>'
            '<label>Password <input name="password" type="password" autocomplete="current-password" required>'
            '</label><button type="submit">Log in</button></form></section>')


def _thumb(row: Row) -> str:
    if not row.thumbnail:
        return '<span class="nothumb">no picture yet</span>' if row.openable else '<span class="nothumb">–</span>'
    return f'<img class="thumb" src="/thumb/{escape(row.handle)}" alt="{escape(row.name)}">'


def session_table(rows: Iterable[Row], csrf: str, *, admin: bool, viewer: bool, action: str) -> str:
    head = ("<th>Picture</th>" + ("<th>User</th><th>Node</th>" if admin else "")
            + "<th>Name</th><th>Type</th><th>State</th><th>Since</th>"
            + ("<th>Client</th>" if admin else "") + "<th></th>")
    lines = []
    for row in rows:
        buttons = []
        if viewer and admin and row.shadowable:
            buttons.append(button("/view/shadow", csrf, "Shadow", "open", handle=row.handle,
                                  asks="1" if row.asks_owner else "0"))
        elif viewer and not admin and row.openable:
            buttons.append(button("/view/open", csrf, "Open in browser", "open", handle=row.handle))
        if row.state == "Running":
            buttons.append(button(action, csrf, "Suspend", "suspend", op="suspend", handle=row.handle))
        buttons.append(button(action, csrf, "Terminate", "terminate", op="terminate", handle=row.handle))
        cells = (f"<td>{_thumb(row)}</td>"
                 + (f"<td>{escape(row.user)}</td><td>{escape(row.node)}</td>" if admin else "")
                 + f'<td class="name">{escape(row.name)}</td><td>{escape(row.type)}</td>'
                 + f'<td class="state">{escape(row.state)}</td><td class="when">{escape(when(row.since))}</td>'
                 + (f"<td>{escape(row.client)}</td>" if admin else "")
                 + f'<td class="actions">{"".join(buttons)}</td>')
        lines.append(f'<tr class="session">{cells}</tr>')
    if not lines:
        return '<p class="empty">No sessions.</p>'
    return f'<table class="sessions"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'


def message_line(message: str, error: bool = False) -> str:
    """A notice (what was done) or, in the error colour, a refusal."""
    if not message:
        return ""
    if error:
        return f'<p class="error" role="alert">{escape(message)}</p>'
    return f'<p class="notice" role="status">{escape(message)}</p>'


def open_now(csrf: str, handle: str) -> str:
    """The viewer's form for a session just started with "Start and open": portal.js sends it at
    once (no inline script); without script, its button does."""
    return (f'<form method="post" action="/view/open" class="open-now">{hidden("csrf", csrf)}'
            f'{hidden("handle", handle)}<button type="submit" class="open">Open the new session</button></form>')


def portal(rows: Sequence[Row], csrf: str, types: Sequence[str], viewer: bool, message: str = "",
           capacity_reached: bool = False, error: bool = False, opening: str = "") -> str:
    """The user's page.  ``types``: the installed types a browser may start; ``opening``: the handle
    of a session to open in the viewer now ("Start and open")."""
    note = message_line(message, error)
    options = "".join(f'<option value="{escape(t)}">{escape(t)}</option>' for t in types)
    start = ""
    if types and not capacity_reached:
        open_button = ('<button type="submit" name="then" value="open" class="start-open">Start and open</button>'
                       if viewer else "")
        start = (f'<form method="post" action="/act" class="start">{hidden("csrf", csrf)}{hidden("op", "start")}'
                 f'<label>New session <select name="type">{options}</select></label>'
                 '<label>Name <input name="name" maxlength="64"></label>'
                 f'<button type="submit" name="then" value="" class="start-only">Start</button>{open_button}</form>')
    elif capacity_reached:
        start = ('<p class="notice capacity">No new session can be started now: you have as many as you may, '
                 'or the server takes no new ones for the moment.</p>')
    elif not types:
        start = '<p class="notice">No session type can be started from the browser on this server.</p>'
    now = open_now(csrf, opening) if opening and viewer else ""
    return (f"<h2>My sessions</h2>{note}{now}{session_table(rows, csrf, admin=False, viewer=viewer, action='/act')}"
            f"{start}")


def admin(rows: Sequence[Row], csrf: str, viewer: bool, draining: bool, message: str = "",
          error: bool = False) -> str:
    note = message_line(message, error)
    drain = button("/admin/act", csrf, "Stop draining" if draining else "Drain this node", "drain",
                   op="undrain" if draining else "drain")
    state = "draining: no new sessions" if draining else "accepting sessions"
    return (f'<h2>All sessions</h2>{note}<p class="node">This node is {state}. {drain}</p>'
            f"{session_table(rows, csrf, admin=True, viewer=viewer, action='/admin/act')}")
