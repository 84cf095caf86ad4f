"""Who may shadow whom, and how (pure: the viewer's groups come with the caller)."""

from __future__ import annotations

from dataclasses import dataclass

from nxgate.config import ShadowSection


@dataclass(frozen=True)
class Decision:
    allowed: bool
    ask_owner: bool = False
    interactive: bool = False
    reason: str = ""


def decide(viewer: str, viewer_groups: frozenset[str], owner: str, settings: ShadowSection,
           view_only_requested: bool = False) -> Decision:
    """The policy's answer for ``viewer`` wanting to shadow ``owner``'s display."""
    if not settings.enabled:
        return Decision(False, reason="shadowing is disabled on this server")
    interactive = settings.interactive and not view_only_requested
    if viewer == owner:
        if settings.allow_own:
            return Decision(True, ask_owner=False, interactive=interactive)
        return Decision(False, reason="shadowing one's own sessions is disabled")
    admin = bool(viewer_groups & set(settings.admin_groups))
    if settings.allow_others == "everyone" or (settings.allow_others == "admins" and admin):
        ask = settings.ask_owner and (settings.ask_owner_for_admins or not admin)
        return Decision(True, ask_owner=ask, interactive=interactive)
    return Decision(False, reason=f"{viewer} may not shadow other users' sessions")

