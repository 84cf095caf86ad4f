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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.node.agents import nxagent
from nxgate.config import Config
from nxgate.vocabulary.model import State
from nxgate.node.environment import login_environment
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.requests import DisplaySettings, ShadowRequest
from nxgate.vocabulary.results import Progress, ProgressCallback, Ready, ShadowTarget
from nxgate.node import console, processes
from nxgate.node import shadow_policy as policy
from nxgate.node.agents import shadow_screen as screen
from nxgate.threads import Blocking, in_thread
from nxgate.users import UserDirectory

if TYPE_CHECKING:
    from nxgate.node.service import SessionService

log = Logger()

#: Why a jailed session is not offered for shadowing (said when it is asked for by id).
JAILED = "it runs in a jail, where its display exists only for its own programs (its owner was not asked)"

CONSENT_PROGRAM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node", "consent.py")
NOTICE_PROGRAM = os.path.join(os.path.dirname(CONSENT_PROGRAM), "shadow_notice.py")
#: consent.py's exit codes: allowed, refused (any other: the dialog never reached the owner).
CONSENT_ALLOW, CONSENT_REFUSE = 0, 3
#: shadow_notice.py's exit codes: the owner pressed "End", the shadow ended by itself.
NOTICE_END, NOTICE_GONE = 0, 3
#: How long a notice may stay up: as long as a shadow may last (it goes with the shadow's agent).
NOTICE_LIFETIME = 30 * 24 * 3600.0


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
    geometry: str = ""  # the watched screen's size, where the session says it
    #: Why it cannot be shadowed although it runs (a jail); empty: it can.  Never listed then, and
    #: asked for by id, the answer says this (to a caller the policy would let watch it).
    unavailable: str = ""

    def view(self, asks_owner: bool = False) -> ShadowTarget:
        """What the viewer may know of it (no cookie, no authority path)."""
        return ShadowTarget(self.id, self.owner, self.display, self.name, self.type, self.geometry, asks_owner)


class ShadowService:
    """Lists, asks and attaches.  Nothing here blocks the reactor: finding
    the console (``/proc``, utmp, NSS, the owner's ``~/.Xauthority``) runs
    through ``blocking``, and the owner's account comes from ``users``."""

    def __init__(self, manager: SessionService, config: Config, blocking: Blocking | None = None,
                 users: UserDirectory | None = None) -> None:
        self.manager = manager
        self.config = config
        self.settings = config.shadow
        self.blocking = blocking if blocking is not None else in_thread(manager.reactor)
        self.users = users if users is not None else UserDirectory(self.blocking)

    # ------------------------------------------------------------ targets
    async def _targets(self) -> list[Target]:
        # The console first (in a thread): the sessions are then read in the
        # same reactor turn as the caller uses them, not from before a wait.
        local = await console.find_console_with(self.blocking, self.settings.console_display)
        targets = []
        for session in self.manager.sessions.values():
            if session.state is State.RUNNING and session.type != "shadow" and session.ever_attached:
                unavailable = ""
                if session.agent_pid and not processes.same_pid_namespace(session.agent_pid):
                    # Jailed: its display exists only in its jail.  A shadow
                    # agent, the size probe and the consent dialog on the host
                    # would reach whoever holds /tmp/.X11-unix/XN there, with
                    # the owner's cookie.  (Two readlinks: cheap enough here,
                    # and the sessions stay read in one reactor turn.)
                    unavailable = JAILED
                agent_files = self.manager.layout.agent_files(session.id)
                targets.append(Target(session.id, session.user, session.display, session.cookie, session.name,
                                      session.type, agent_files.authority, agent_files.app_log, session.geometry,
                                      unavailable))
        if local is not None:
            digest = hashlib.sha256(f"console:{self.config.server_name}:{local.display}".encode()).hexdigest()
            targets.append(Target(digest[:32].upper(), local.owner, local.display, local.cookie,
                                  f"Console :{local.display}", "console", os.path.join(local.home, ".Xauthority"),
                                  os.path.join(self.manager.layout.logs, f"console-{local.display}.log")))
        return targets

    async def _visible(self, caller: Caller, unavailable: bool = False) -> list[tuple[Target, policy.Decision]]:
        """The targets the policy lets ``caller`` watch (``unavailable``: jailed ones too)."""
        result = []
        for target in await self._targets():
            decision = policy.decide(caller.user, caller.groups, target.owner, self.settings)
            if decision.allowed and (unavailable or not target.unavailable):
                result.append((target, decision))
        return result

    # ----------------------------------------------------------- commands
    async def targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        """The displays ``caller`` may shadow."""
        return tuple(target.view(decision.ask_owner) for target, decision in await self._visible(caller))

    async def attach(self, caller: Caller, request: ShadowRequest,
                     progress: ProgressCallback = lambda progress: None) -> Ready:
        wanted = request.target_id
        found = [(t, d) for t, d in await self._visible(caller, unavailable=True) if t.id == wanted]
        if found and found[0][0].unavailable:
            target = found[0][0]
            log.warn("{user} from {address} may not shadow {id} of {owner}: {why}", user=caller.user,
                     address=caller.address, id=wanted, owner=target.owner, why=target.unavailable,
                     audit="shadow_denied")
            raise SessionError(Kind.NOT_ALLOWED, f"Session {wanted} of {target.owner} cannot be shadowed: "
                               f"{target.unavailable}.", session_id=wanted)
        if not found:
            log.warn("{user} from {address} may not shadow {id} (or it does not exist)", user=caller.user,
                     address=caller.address, id=wanted, audit="shadow_denied")
            raise SessionError(Kind.NOT_FOUND, f"Could not find shadowed session {wanted}. Session failed.",
                               session_id=wanted)
        target, _ = found[0]
        decision = policy.decide(caller.user, caller.groups, target.owner, self.settings, request.view_only)
        mode = "interactive" if decision.interactive else "view-only"
        if decision.ask_owner:
            progress(Progress.ASKING_OWNER)
            answer = await self._ask(caller, target, mode)
            if answer is not True:
                why = "no answer" if answer is None else "refused"
                log.info("shadow of {id} ({owner}) for {user} from {address}: {why}", id=target.id,
                         owner=target.owner, user=caller.user, address=caller.address, why=why,
                         audit="shadow_refused")
                suffix = "" if answer is False else f" (no answer within {self.settings.consent_timeout:g} seconds)"
                raise SessionError(Kind.REFUSED_BY_OWNER, f"Authorization refused by user: {target.owner}.{suffix}",
                                   session_id=wanted)
        plan = nxagent.AgentPlan(
            mode="-S",
            extra_options=(("shadow", f":{target.display}"), ("shadowmode", "1" if decision.interactive else "0")),
            extra_cookies=((target.display, target.cookie),) if target.cookie else (),
            run_as=target.owner,
            persistent=False,
            pam=False,
        )
        settings = await self._shadow_settings(request.display, target)
        owner = await self.users.lookup(target.owner)  # NSS: off the reactor
        session = await self.manager.new_session(caller, "shadow", f"Shadow of {target.name}", settings, True,
                                                 run_as=(owner.pw_uid, owner.pw_gid))
        session = session.evolve(options={"shadow": {"target": target.id, "owner": target.owner, "mode": mode}})
        log.info("shadow attach: {user} from {address} watches {target} of {owner} ({mode}) as session {id}",
                 user=caller.user, address=caller.address, target=target.id, owner=target.owner, mode=mode,
                 id=session.id, audit="shadow_attach")
        ready = await self.manager.launch(caller, session, settings, plan)
        if target.owner != caller.user:  # one's own session: nobody to tell
            self._notice_in_background(caller, target, mode, session.id)
        return ready

    async def _shadow_settings(self, settings: DisplaySettings, target: Target) -> DisplaySettings:
        """The viewer's display settings with the shadow window's size: the
        watched screen at 1:1, or scaled to fit the viewer's window (see
        :mod:`nxgate.node.agents.shadow_screen`).  Full screen only where the client's
        screen has the watched screen's size: otherwise nxagent would stretch
        the watched screen to the client's whole screen."""
        area_w, area_h = (int(n) for n in settings.geometry.split("x"))
        watched = await screen.watched_size(self.manager.reactor, target.display, target.cookie)
        if settings.fullscreen and watched == (area_w, area_h):
            return settings  # a full screen of the watched screen's size: 1:1, with no window frame
        width, height = screen.shadow_geometry(watched, (area_w, area_h))
        log.info("shadow of :{display} ({watched}) in a viewer area of {area}: window {width}x{height}",
                 display=target.display, watched="unknown size" if watched is None else "x".join(map(str, watched)),
                 area=settings.geometry, width=width, height=height)
        return dataclasses.replace(settings, geometry=f"{width}x{height}", fullscreen=False)

    async def _ask(self, caller: Caller, target: Target, mode: str) -> bool | None:
        """Show the consent dialog as the owner, on her display.

        True: allowed; False: refused; None: no answer in time."""
        owner = await self.users.lookup(target.owner)
        request: dict[str, Any] = {
            "user": owner.pw_name,
            "argv": [self.settings.dialog_python, CONSENT_PROGRAM, caller.user, caller.address, mode, target.name],
            "env": login_environment(owner, self.config.sessions),
            "env_fixed": {"DISPLAY": f":{target.display}", "XAUTHORITY": target.authority},
            "cwd": owner.pw_dir,
            "log": target.log,
        }
        code = await self.manager.launcher.run(request, self.settings.consent_timeout)
        if code is None:
            return None
        if code not in (CONSENT_ALLOW, CONSENT_REFUSE):
            log.warn("shadow of {id} ({owner}) for {user}: the consent dialog did not open on :{display} (exit "
                     "code {code}; its output is in {log})", id=target.id, owner=target.owner, user=caller.user,
                     display=target.display, code=code, log=target.log, audit="shadow_refused")
            raise SessionError(Kind.UNAVAILABLE, f"{target.owner} could not be asked: the consent dialog did not "
                               "open on the session's screen (see the server log).", session_id=target.id)
        return code == CONSENT_ALLOW

    # ------------------------------------------------------------- notice
    def _notice_request(self, owner: Any, viewer: Caller, target: Target, mode: str,
                        agent: processes.ProcessId) -> dict[str, Any]:
        return {
            "user": owner.pw_name,
            "argv": [self.settings.dialog_python, NOTICE_PROGRAM, viewer.user, viewer.address, mode,
                     str(agent.pid), str(agent.started)],
            "env": login_environment(owner, self.config.sessions),
            "env_fixed": {"DISPLAY": f":{target.display}", "XAUTHORITY": target.authority},
            "cwd": owner.pw_dir,
            "log": target.log,
        }

    async def _show_notice(self, viewer: Caller, target: Target, mode: str, shadow_id: str) -> None:
        """While ``shadow_id`` watches ``target``, a notice on the watched screen says who watches
        (as NoMachine does), with a button that ends the shadow.  It runs as the owner, like the
        consent dialog, and goes by itself when the shadow's agent does.

        The notice is the owner's only sight of the shadow, and it runs as her uid, which an
        interactive shadow lets the viewer use (a ``pkill`` typed in her terminal): so however
        the notice ends while the shadow still runs (End, a signal, a crash, a failed start),
        the shadow ends with it (:func:`notice_ended`)."""
        session = self.manager.sessions.get(shadow_id)
        if session is None or not session.agent_pid:
            return
        agent = processes.ProcessId(session.agent_pid, session.agent_started)
        problem = ""
        try:
            owner = await self.users.lookup(target.owner)
            code = await self.manager.launcher.run(self._notice_request(owner, viewer, target, mode, agent),
                                                   NOTICE_LIFETIME)
        except Exception as error:  # the notice could not even start: the shadow must not run unseen
            code, problem = None, str(error) or type(error).__name__
        current = self.manager.sessions.get(shadow_id)
        running = current is not None and current.state.live and agent.alive()
        words = notice_ended(code, running, target, problem)
        if words is None:
            return
        if code == NOTICE_END:
            log.info("shadow session {id}: {words}", id=shadow_id, words=words, audit="shadow_ended_by_owner")
        else:
            log.warn("shadow session {id} of {viewer} watching {owner}'s :{display}: {words}", id=shadow_id,
                     viewer=viewer.user, owner=target.owner, display=target.display, words=words,
                     audit="shadow_notice_gone")
        await self.manager.lifecycle.terminate_session(
            shadow_id, f"ended by {target.owner}, the watched session's owner" if code == NOTICE_END
            else "its notice on the watched screen went away")

    def _notice_in_background(self, viewer: Caller, target: Target, mode: str, shadow_id: str) -> None:
        def failed(failure: Any) -> None:
            log.failure("shadow session {id}: the notice on :{display} failed", failure, id=shadow_id,
                        display=target.display)

        defer.ensureDeferred(self._show_notice(viewer, target, mode, shadow_id)).addErrback(failed)


def notice_ended(code: int | None, shadow_running: bool, target: Target, problem: str = "") -> str | None:
    """What the end of the owner's notice on ``target`` means (pure): None
    when the shadow ended first (the notice then goes by itself, as it
    should), else the words for the log; the shadow is then ended.
    ``code`` is the notice's exit status (None: killed by a signal, or it
    never started, as ``problem`` then says)."""
    if code == NOTICE_END:
        return f"{target.owner} ended it from the notice on :{target.display}"
    if not shadow_running:
        return None
    if problem:
        why = f"the notice could not be shown ({problem})"
    elif code is None:
        why = ("the notice was closed by a signal, not by its End button (anyone with the owner's uid can send "
               "one, the viewer of an interactive shadow too)")
    elif code == NOTICE_GONE:
        why = "the notice went away saying the shadow had ended, which it had not"
    else:
        why = f"the notice ended with code {code} (its output is in {target.log})"
    return f"{why}; the shadow is ended with it: {target.owner} must always see who watches her screen"
