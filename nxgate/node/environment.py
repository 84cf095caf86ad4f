"""The environment a session's programs start with on this node: a login
environment built from the user's passwd entry and the [sessions] settings
(PAM's own variables are added by the launcher)."""

from __future__ import annotations

import pwd

from nxgate.config import SessionsSection


def login_environment(user: pwd.struct_passwd, settings: SessionsSection) -> dict[str, str]:
    """A login environment (PAM's own variables are added by the launcher)."""
    return {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": user.pw_shell or "/bin/sh",
        "PATH": settings.path,
        "LANG": settings.lang,
    }
