"""Session services: what travels beside the screen (sound,
printing, folder sharing).

Each granted service has a :class:`Service` on the session's side.  The life
cycle (:mod:`nxgate.node.lifecycle`) calls ``start`` once the agent
listens (at a start and at every resume), ``stop`` when the session is
suspended, ends or fails, and at gateway start-up for what a killed gateway
left behind; ``environment`` goes into the session program's environment.

A service never takes a session down: :class:`Services` logs what one raises
and the session goes on without that service.  Services live in modules of
this package named in :data:`MODULES`, each with ``make(context) -> Service``;
a module that is missing (a branch without it) is skipped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.logger import Logger

from nxgate.protocols import service_channels
from nxgate.node.services.ports import openable

log = Logger()

#: service -> the module with its Service.
MODULES = {
    "sound": "nxgate.node.services.sound",
    "printing": "nxgate.node.services.printing",
    "sharing": "nxgate.node.services.sharing",
    "x2go-folders": "nxgate.node.services.x2go_folders",
}


class Service(Protocol):
    name: str

    def environment(self, session: Any) -> dict[str, str]: ...

    async def start(self, session: Any) -> None: ...

    async def stop(self, session: Any) -> None: ...


@dataclass(frozen=True)
class Context:
    """What services may use: the reactor, the current config, where session
    directories are (a :class:`nxgate.host.files.StateLayout`), the launcher
    that runs programs as the user, a way to run blocking work, and the
    node's reverse listeners (:class:`nxgate.node.reverse.ReverseListeners`:
    where a service's programs reach the client over the client's own SSH
    connection, when its door opened a route)."""

    reactor: Any
    config: Callable[[], Any]
    layout: Any
    launcher: Any = None
    blocking: Any = None
    reverse: Any = None

    def session_dir(self, session: Any) -> str:
        return str(self.layout.agent_files(session.id).directory)


def grant(wanted: Iterable[str], services: Any) -> list[str]:
    """The services a session gets: those the client asked for that the admin
    left on (``[services]``), sorted.  A switched-off one is simply left out."""
    return sorted(name for name in set(wanted) if name in service_channels.SERVICES and getattr(services, name, False))


def grant_for(wanted: Iterable[str], services: Any, display: int, session_id: str, user: str) -> list[str]:
    """:func:`grant`, less the services whose channel port on ``display`` is
    taken (logged): the agent would abort the whole session on it."""
    kept, dropped = openable(grant(wanted, services), display)
    if dropped:
        log.warn("session {id} of {user}: no {services}: the channel port is taken by another process",
                 id=session_id, user=user, services=", ".join(dropped))
    return kept


def granted(session: Any) -> list[str]:
    return [name for name in session.options.get("services", ()) if name in service_channels.SERVICES]


class Services:
    """The services known to this gateway, and the calls the life cycle makes."""

    def __init__(self, services: Iterable[Service] = ()) -> None:
        self.by_name: dict[str, Service] = {service.name: service for service in services}

    @classmethod
    def load(cls, context: Context, modules: dict[str, str] | None = None) -> Services:
        found = []
        for name, module_name in (MODULES if modules is None else modules).items():
            try:
                found.append(importlib.import_module(module_name).make(context))
            except Exception:
                log.failure("the {service} service could not be set up; sessions go without it", service=name)
        return cls(found)

    def of(self, session: Any, services: Iterable[str] | None = None) -> list[Service]:
        names = granted(session) if services is None else list(services)
        return [self.by_name[name] for name in names if name in self.by_name]

    def environment(self, session: Any) -> dict[str, str]:
        """What the session's programs need: each granted service's environment,
        and for the others, how to reach their service over a reverse stream
        (``reverse_environment``, where an service has one: a client may take the
        service back over its own SSH connection later)."""
        env: dict[str, str] = {}
        granted = {service.name for service in self.of(session)}
        for service in self.by_name.values():
            reverse_environment = getattr(service, "reverse_environment", None)
            if service.name in granted or reverse_environment is None:
                continue
            try:
                env.update(reverse_environment(session))
            except Exception:
                log.failure("session {id}: the {service} service gave no environment", id=session.id,
                            service=service.name)
        for service in self.of(session):
            try:
                env.update(service.environment(session))
            except Exception:
                log.failure("session {id}: the {service} service gave no environment", id=session.id,
                            service=service.name)
        return env

    async def start(self, session: Any) -> None:
        for service in self.of(session):
            try:
                await service.start(session)
                log.info("session {id} of {user}: {service} on", id=session.id, user=session.user,
                         service=service.name)
            except Exception:
                log.failure("session {id}: starting {service} failed; the session goes on without it",
                            id=session.id, service=service.name)

    async def stop(self, session: Any, services: Iterable[str] | None = None) -> None:
        """Stop the services of the services the session was granted (or of
        ``services``), and those that say ``always`` (what a client sets up in
        any session: X2Go's folders); each one's ``stop`` must be harmless
        when nothing runs."""
        chosen = self.of(session, services)
        if services is None:
            chosen += [service for service in self.by_name.values()
                       if getattr(service, "always", False) and service not in chosen]
        for service in chosen:
            try:
                await service.stop(session)
            except Exception:
                log.failure("session {id}: stopping {service} failed", id=session.id, service=service.name)
