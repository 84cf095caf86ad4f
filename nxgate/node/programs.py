"""What runs inside a session (pure but for looking programs up on the PATH)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from nxgate.config import SessionsSection
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.requests import StartRequest

DESKTOP_WITHOUT_XSESSION = ("x-session-manager",)
# Types that are one program in a window, not a desktop: no X session script.
PLAIN_TYPES = ("unix-console", "unix-application")


def _type_command(session_type: str, types: Mapping[str, tuple[str, ...]], settings: SessionsSection) -> tuple[str, ...]:
    if session_type == "unix-default" and not types.get(session_type):
        return (settings.xsession,) if settings.use_xsession else DESKTOP_WITHOUT_XSESSION
    return types.get(session_type, ())


def missing_program(argv: tuple[str, ...], path: str) -> str | None:
    """The program of ``argv`` if it cannot be found, else None."""
    if not argv:
        return "(no command configured)"
    return None if shutil.which(argv[0], path=path) else argv[0]


def available_types(types: Mapping[str, tuple[str, ...]], settings: SessionsSection) -> list[str]:
    names = [name for name in types if not missing_program(_type_command(name, types, settings), settings.path)]
    return sorted({*names, "unix-application"})


def session_command(request: StartRequest, types: Mapping[str, tuple[str, ...]], settings: SessionsSection) -> tuple[str, ...]:
    """The argv of the session's program, or an error naming what exists.

    Desktops start through the system's X session script (which sets up
    the user's environment, agents and ~/.xsessionrc) when it is there.
    """
    if request.type == "unix-application":
        argv = request.application
    else:
        argv = _type_command(request.type, types, settings)
    missing = missing_program(argv, settings.path) if argv else "(unknown type)"
    if request.type not in types and request.type != "unix-application":
        missing = "(unknown type)"
    if missing is not None:
        available = ", ".join(available_types(types, settings))
        if request.type == "unix-application":
            text = f"Application '{missing}' is not installed on this server."
        elif missing == "(unknown type)":
            text = f"Session type '{request.type}' is not supported. Available types: {available}."
        else:
            text = (f"Session type '{request.type}' is not available on this server: {missing} is not"
                    f" installed. Available types: {available}.")
        raise SessionError(ErrorKind.UNAVAILABLE, text)
    if request.type in PLAIN_TYPES or argv[0] == settings.xsession:
        return argv
    if settings.use_xsession and os.access(settings.xsession, os.X_OK):
        return (settings.xsession, " ".join(argv))
    return argv
