"""Shadowing: listing what a user may watch, asking the owner, attaching.

A shadow is an nxagent in shadow mode (``-S``, ``shadow=:N``) that is an X
client of the watched display and an NX session for the viewer.  It runs as
the *owner* of the watched display, so the viewer never learns that
display's cookie: he gets the shadow's own cookie only.  Display and cookie
come from the gateway's store, never from the client's ``--display`` (nxcl
always sends 0).  The shadow is not persistent: when the viewer goes, it
ends; when the watched session ends, it ends itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pwd
from dataclasses import dataclass
from typing import Any

from twisted.logger import Logger

from nxgate.backends import nxagent
from nxgate.config import Config
from nxgate.conversation import Client
from nxgate.nx import errors
from nxgate.nx.errors import NXError
from nxgate.nx.listing import HEADER, DASHES, ListedSession, session_options
from nxgate.nx.params import Params
from nxgate.nx.shell import Reply
from nxgate.session.manager import SessionManager
from nxgate.session.model import State
from nxgate.session.programs import login_environment
from nxgate.session.request import DisplaySettings, display_settings, session_id
from nxgate.shadow import console, policy, screen

log = Logger(namespace="nxgate.shadow")

CONSENT_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consent.py")
ASKING = "NX> 726 Asking user for authorization to attach to session"


@dataclass(frozen=True)
class Target:
    """A display that may be shadowed: a running session or the console."""

    id: str
    owner: str
    display: int
    cookie: str | None
    name: str
    type: str
    authority: str  # the X authority file the owner's programs use for it
    log: str  # where the consent dialog's output goes

    def row(self, geometry: str = "800x600", depth: int = 24) -> ListedSession:
        # OpenNX takes the last word of the name as the owner's name.
        return ListedSession(display=self.display, session_type=self.type, session_id=self.id,
                             options=session_options(fullscreen=False, render=True, virtual_desktop=True),
                             depth=depth, screen=geometry, status="Running", name=f"{self.name} {self.owner}")


class ShadowService:
    def __init__(self, manager: SessionManager, config: Config) -> None:
        self.manager = manager
        self.config = config
        self.settings = config.shadow

    # ------------------------------------------------------------ targets
    def _targets(self) -> list[Target]:
        targets = []
        for session in self.manager.sessions.values():
            if session.state is State.RUNNING and session.type != "shadow" and session.ever_attached:
                agent_files = self.manager.layout.agent_files(session.id)
                targets.append(Target(session.id, session.user, session.display, session.cookie, session.name,
                                      session.type, agent_files.authority, agent_files.app_log))
        local = console.find_console(self.settings.console_display)
        if local is not None:
            digest = hashlib.sha256(f"console:{self.config.server_name}:{local.display}".encode()).hexdigest()
            home = pwd.getpwnam(local.owner).pw_dir
            targets.append(Target(digest[:32].upper(), local.owner, local.display, local.cookie,
                                  f"Console :{local.display}", "console", os.path.join(home, ".Xauthority"),
                                  os.path.join(self.manager.layout.logs, f"console-{local.display}.log")))
        return targets

    def _visible(self, client: Client) -> list[tuple[Target, policy.Decision]]:
        groups = policy.groups_of(client.user)
        result = []
        for target in self._targets():
            decision = policy.decide(client.user, groups, target.owner, self.settings)
            if decision.allowed:
                result.append((target, decision))
        return result

    # ----------------------------------------------------------- commands
    def list(self, client: Client) -> Reply:
        """The shadowable sessions, ending at the prompt (no 147/148 line)."""
        rows = [target.row() for target, _ in self._visible(client)]
        lines = [f"NX> {errors.SESSION_LIST} Session list of user '{client.user}':", HEADER, DASHES]
        lines.extend(row.row() for row in rows)
        lines.append("")
        return Reply(tuple(lines))

    async def attach(self, client: Client, params: Params) -> Reply:
        wanted = session_id(params, "id", "sessionid")
        found = [(t, d) for t, d in self._visible(client) if t.id == wanted]
        if not found:
            log.warn("{user} from {address} may not shadow {id} (or it does not exist)", user=client.user,
                     address=client.address, id=wanted, audit="shadow_denied")
            raise NXError(errors.SESSION_FAILED, f"Error: Could not find shadowed session {wanted}. Session failed.",
                          last_operation_failed=True)
        target, _ = found[0]
        view_only = params.get("viewonly", "") == "1" or params.get("shadowmode", "") == "0"
        decision = policy.decide(client.user, policy.groups_of(client.user), target.owner, self.settings, view_only)
        mode = "interactive" if decision.interactive else "view-only"
        if decision.ask_owner:
            client.progress(ASKING)
            answer = await self._ask(client, target, mode)
            if answer is not True:
                why = "no answer" if answer is None else "refused"
                log.info("shadow of {id} ({owner}) for {user} from {address}: {why}", id=target.id,
                         owner=target.owner, user=client.user, address=client.address, why=why,
                         audit="shadow_refused")
                suffix = "" if answer is False else f" (no answer within {self.settings.consent_timeout:g} seconds)"
                raise NXError(errors.SESSION_FAILED, f"Error: Authorization refused by user: {target.owner}.{suffix}",
                              last_operation_failed=True)
        plan = nxagent.AgentPlan(
            mode="-S",
            extra_options=(("shadow", f":{target.display}"), ("shadowmode", "1" if decision.interactive else "0")),
            extra_cookies=((target.display, target.cookie),) if target.cookie else (),
            run_as=target.owner,
            persistent=False,
            pam=False,
        )
        settings = await self._shadow_settings(params, target)
        session = self.manager.new_session(client, "shadow", f"Shadow of {target.name}", settings, True,
                                           run_as=target.owner)
        session = session.evolve(options={"shadow": {"target": target.id, "owner": target.owner, "mode": mode}})
        log.info("shadow attach: {user} from {address} watches {target} of {owner} ({mode}) as session {id}",
                 user=client.user, address=client.address, target=target.id, owner=target.owner, mode=mode,
                 id=session.id, audit="shadow_attach")
        return await self.manager.launch(client, session, settings, plan)

    async def _shadow_settings(self, params: Params, target: Target) -> DisplaySettings:
        """The viewer's display settings with the shadow window's size: the
        watched screen at 1:1, or scaled to fit the viewer's window (see
        :mod:`nxgate.shadow.screen`).  Full screen only where the client's
        screen has the watched screen's size: otherwise nxagent would stretch
        the watched screen to the client's whole screen."""
        settings = display_settings(params)
        area_w, area_h = (int(n) for n in settings.geometry.split("x"))
        watched = await screen.watched_size(self.manager.reactor, target.display, target.cookie)
        if settings.fullscreen and watched == (area_w, area_h):
            return settings  # a full screen of the watched screen's size: 1:1, with no window frame
        width, height = screen.shadow_geometry(watched, (area_w, area_h))
        log.info("shadow of :{display} ({watched}) in a viewer area of {area}: window {width}x{height}",
                 display=target.display, watched="unknown size" if watched is None else "x".join(map(str, watched)),
                 area=settings.geometry, width=width, height=height)
        return dataclasses.replace(settings, geometry=f"{width}x{height}", fullscreen=False)

    async def _ask(self, client: Client, target: Target, mode: str) -> bool | None:
        """Show the consent dialog as the owner, on her display.

        True: allowed; False: refused; None: no answer in time."""
        owner = pwd.getpwnam(target.owner)
        request: dict[str, Any] = {
            "user": owner.pw_name,
            "argv": [self.settings.dialog_python, CONSENT_PROGRAM, client.user, client.address, mode, target.name],
            "env": login_environment(owner, self.config.sessions),
            "env_fixed": {"DISPLAY": f":{target.display}", "XAUTHORITY": target.authority},
            "cwd": owner.pw_dir,
            "log": target.log,
        }
        code = await self.manager.launcher.run(request, self.settings.consent_timeout)
        if code is None:
            return None
        return code == 0
