"""The reply lines after a session is started, resumed or ended (pure).

After ``startsession``/``restoresession`` the server sends the FreeNX
superset (reference §2.6 and §7.4): 700, 705, 703, 701, 702, 706, 704,
707, 1009, 710, 1002, 1006.  701 (Remmina, OpenNX) and 706 (nxcl) carry
the same cookie; 710 makes nxcl and OpenNX start their proxy; 1006 is
what gnx-style clients wait for.
"""

from __future__ import annotations

#: The file-sharing port FreeNX's nxnode announced in ``NX> 709`` (CIFS).
SMB_PORT = 445


def session_ready(
    *,
    full_id: str,
    display: int,
    session_type: str,
    cookie: str,
    proxy_ip: str,
    encrypted: bool,
    status: str,
    services: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """``services``: what the session was granted; with folder sharing the
    client hears FreeNX's ``NX> 709 File-sharing port``, which OpenNX reads
    as the SMB port to mount from (FreeNX said 445 for CIFS)."""
    sharing = (f"NX> 709 File-sharing port: {SMB_PORT}",) if "sharing" in services else ()
    return (
        f"NX> 700 Session id: {full_id}",
        f"NX> 705 Session display: {display}",
        f"NX> 703 Session type: {session_type}",
        f"NX> 701 Proxy cookie: {cookie}",
        f"NX> 702 Proxy IP: {proxy_ip}",
        f"NX> 706 Agent cookie: {cookie}",
        f"NX> 704 Session cache: {session_type}",
        f"NX> 707 SSL tunneling: {1 if encrypted else 0}",
        *sharing,
        f"NX> 1009 Session status: {status}",
        "NX> 710 Session status: running",
        "NX> 1002 Commit",
        "NX> 1006 Session status: running",
    )


def terminated(session_id: str) -> tuple[str, ...]:
    """nxcl waits for the 900 line after its ``Terminate``."""
    return (
        f"NX> 716 Terminating session {session_id} on user request.",
        f"NX> 900 Session id: {session_id} terminated.",
    )


def suspended(session_id: str) -> tuple[str, ...]:
    return (f"NX> 716 Suspending session {session_id} on user request.",)


def mount_added(mounting: bool) -> tuple[str, ...]:
    """The answer to ``addmount``: FreeNX's line at once (the mount follows
    in the background), or a plain note that sharing is off, which is no
    error: the session goes on without the folder."""
    if mounting:
        return ("NX> 719 SMB filesystem: running",)
    return ("NX> 719 SMB filesystem: off (folder sharing is not enabled for this session)",)
