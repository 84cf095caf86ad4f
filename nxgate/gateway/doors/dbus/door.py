"""The D-Bus door: ``org.nxgate.Gateway1`` at ``/org/nxgate/Gateway1`` on the system bus.

Who calls is asked of the bus daemon (GetConnectionUnixUser of the sender's
unique name), never taken from arguments; ``resolve`` turns the uid into a
:class:`Caller` (admin when in ``[dbus] admin_groups``, or root).  The session
service then decides as for every door: users act on their own sessions only.

State-change signals are unicast, one copy to each subscribed connection
allowed to see that session (its owner's, an admin's): a broadcast signal
would tell every local user who works when.  A connection subscribes with
``Subscribe()`` (as systemd-logind's clients do) and is forgotten when it
leaves the bus.

Without a bus (none running, or the policy refuses the name) the gateway
carries on: one warning, no retry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger
from txdbus import message, objects
from txdbus.interface import DBusInterface, Method, Signal

from nxgate.gateway.auth.pam import AuthResult
from nxgate.gateway.doors.dbus import connection, wire
from nxgate.vocabulary.api import SessionAPI
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.results import SessionEvent

log = Logger()

#: uid -> the Caller acting for it (blocking work is the resolver's business).
Resolver = Callable[[int], Awaitable[Caller]]
#: (user, remote host) -> the account check every door runs (Authenticator.account).
AccountCheck = Callable[[str, str | None], Awaitable[AuthResult]]


class BusError(Exception):
    """A refusal as a D-Bus error: txdbus sends ``dbusErrorName`` and the message."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.dbusErrorName = name


INTERFACE = DBusInterface(
    wire.INTERFACE,
    Method("ListSessions", returns="aa{sv}"),
    Method("GetSession", arguments="s", returns="a{sv}"),
    Method("StartSession", arguments="ss", returns="a{sv}"),
    Method("Suspend", arguments="s", returns="s"),
    Method("Terminate", arguments="s", returns="s"),
    Method("Rename", arguments="ss", returns="a{sv}"),
    Method("Subscribe"),
    Method("Unsubscribe"),
    *(Signal(name, signature) for name, signature in wire.SIGNALS.items()),
)


class GatewayObject(objects.DBusObject):
    """The exported object; every method resolves the caller from the bus first."""

    dbusInterfaces = [INTERFACE]

    def __init__(self, door: DBusDoor) -> None:
        super().__init__(wire.OBJECT_PATH)
        self.door = door

    def _call(self, sender: str, work: Callable[[Caller], Awaitable[Any]], *strings: str,
              starts_session: bool = False) -> defer.Deferred[Any]:
        """``strings`` are the method's arguments, refused when too long
        before anything else looks at them (issue 22)."""
        return defer.ensureDeferred(self.door.call(sender, work, strings, starts_session))

    def dbus_ListSessions(self, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        async def work(caller: Caller) -> list[dict[str, Any]]:
            return [wire.describe(view) for view in (await self.door.sessions.list(caller)).sessions]
        return self._call(dbusCaller or "", work)

    def dbus_GetSession(self, session_id: str, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        async def work(caller: Caller) -> dict[str, Any]:
            return wire.describe(await self.door.sessions.show(caller, _id(session_id)))
        return self._call(dbusCaller or "", work, session_id)

    def dbus_StartSession(self, session_type: str, name: str, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        """A session of an allowed type that waits, listed as Suspended, for
        an NX client to resume it (the type's own name when ``name`` is empty)."""
        async def work(caller: Caller) -> dict[str, Any]:
            view = await self.door.sessions.start_for_later(caller, str(session_type), str(name))
            log.info("{user} starts session {id} ({type}) over D-Bus", user=caller.user, id=view.id,
                     type=view.type, audit="dbus_action")
            return wire.describe(view)
        return self._call(dbusCaller or "", work, session_type, name, starts_session=True)

    def dbus_Suspend(self, session_id: str, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        async def work(caller: Caller) -> str:
            view = await self.door.sessions.suspend(caller, _id(session_id))
            log.info("{user} suspends session {id} over D-Bus", user=caller.user, id=view.id, audit="dbus_action")
            return view.state.value
        return self._call(dbusCaller or "", work, session_id)

    def dbus_Terminate(self, session_id: str, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        async def work(caller: Caller) -> str:
            view = await self.door.sessions.terminate(caller, _id(session_id), f"terminated over D-Bus by {caller.user}")
            return view.state.value
        return self._call(dbusCaller or "", work, session_id)

    def dbus_Rename(self, session_id: str, name: str, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        async def work(caller: Caller) -> dict[str, Any]:
            return wire.describe(await self.door.sessions.rename(caller, _id(session_id), name))
        return self._call(dbusCaller or "", work, session_id, name)

    def dbus_Subscribe(self, dbusCaller: str | None = None) -> defer.Deferred[Any]:
        async def work(caller: Caller) -> None:
            self.door.subscribers[dbusCaller or ""] = caller
        return self._call(dbusCaller or "", work)

    def dbus_Unsubscribe(self, dbusCaller: str | None = None) -> None:
        self.door.subscribers.pop(dbusCaller or "", None)


def _id(session_id: str) -> str:
    """The bare id of an id or a full ``host-display-ID`` (as the admin socket takes them)."""
    return str(session_id)[-32:].upper()


#: The longest string argument any method takes: a full session id
#: (a host name of up to 253 characters, the display, 32 hex digits) or a
#: session type or name (64 characters; a name may carry blanks to strip).
MAX_ARGUMENT = 320
#: (Bigger messages never reach a method: see nxgate.gateway.doors.dbus.connection.)


def too_long(strings: tuple[str, ...]) -> bool:
    """Whether an argument is longer than :data:`MAX_ARGUMENT` (``len`` only)."""
    return any(len(value) > MAX_ARGUMENT for value in strings)


class DBusDoor(service.Service):
    """Connects to the bus, owns the name, exports the object, relays the
    session service's state changes to subscribers as unicast signals."""

    name = "dbus"

    def __init__(self, reactor: Any, sessions: SessionAPI, resolve: Resolver, address: str = "system",
                 account: AccountCheck | None = None) -> None:
        self.reactor = reactor
        self.sessions = sessions
        self.resolve = resolve
        self.account = account
        self.address = address or "system"
        self.connection: Any = None
        self.object = GatewayObject(self)
        self.subscribers: dict[str, Caller] = {}  # unique bus name -> who it is
        self.callers: dict[str, Caller] = {}      # unique names are never reused while the bus runs
        self.ready: defer.Deferred[bool] = defer.Deferred()

    def startService(self) -> None:
        super().startService()
        d = defer.ensureDeferred(self._connect())
        d.addErrback(self._no_bus)
        d.chainDeferred(self.ready)

    async def _connect(self) -> bool:
        self.connection = await connection.connect(self.reactor, self.address)
        self.connection.exportObject(self.object)
        await self.connection.requestBusName(wire.BUS_NAME, doNotQueue=True)
        await self.connection.addMatch(self._name_owner_changed, interface="org.freedesktop.DBus",
                                       member="NameOwnerChanged", path="/org/freedesktop/DBus")
        log.info("D-Bus: {name} on {address}", name=wire.BUS_NAME, address=self.address)
        return True

    def _no_bus(self, failure: Any) -> bool:
        log.warn("D-Bus session control is off: cannot offer {name} on the {address} bus: {error}",
                 name=wire.BUS_NAME, address=self.address, error=failure.getErrorMessage())
        if self.connection is not None:
            self.connection.disconnect()
            self.connection = None
        return False

    def stopService(self) -> None:
        super().stopService()
        if self.connection is not None:
            self.connection.disconnect()
            self.connection = None

    def _name_owner_changed(self, msg: Any) -> None:
        name, _old, new = msg.body
        if not new:
            self.subscribers.pop(name, None)
            self.callers.pop(name, None)

    async def caller(self, sender: str) -> Caller:
        """Who ``sender`` is, from the bus daemon's own record of its uid."""
        known = self.callers.get(sender)
        if known is None:
            uid = await self.connection.getConnectionUnixUser(sender)
            known = self.callers[sender] = await self.resolve(int(uid))
        return known

    async def call(self, sender: str, work: Callable[[Caller], Awaitable[Any]], strings: tuple[str, ...] = (),
                   starts_session: bool = False) -> Any:
        """Run ``work`` for the sender; refusals become org.nxgate.Error.* errors.

        Arguments longer than any id, type or name are refused before any
        other work; then the caller's account must pass the account check
        every door runs (deny_users, shell, lock, pam_acct_mgmt), on every
        call: an account locked or expired since the last call is refused
        at once.  Root acts as the administrator without that check, but
        starts no session of its own (it is in deny_users by default)."""
        if too_long(strings):
            log.warn("D-Bus: refused a call from {sender}: an argument of {size} characters (at most {limit})",
                     sender=sender, size=max(len(value) for value in strings), limit=MAX_ARGUMENT)
            raise BusError(wire.error_name(Kind.INVALID_REQUEST),
                           f"An argument is longer than {MAX_ARGUMENT} characters.")
        try:
            caller = await self.caller(sender)
        except Exception as error:
            log.warn("D-Bus: could not tell who {sender} is: {error}", sender=sender, error=str(error))
            raise BusError(wire.error_name(Kind.NOT_ALLOWED), "Could not tell who you are.") from None
        if self.account is not None and (caller.uid != 0 or starts_session):
            result = await self.account(caller.user, None)
            if not result.granted:
                log.warn("D-Bus: refused {user} (uid {uid}): {reason}", user=caller.user, uid=caller.uid,
                         reason=result.reason, address=f"D-Bus (uid {caller.uid})", audit="login_failed")
                raise BusError(wire.error_name(Kind.NOT_ALLOWED),
                               (result.client_note or "This account may not use sessions on this server") + ".")
        try:
            return await work(caller)
        except SessionError as error:
            raise BusError(wire.error_name(error.kind), wire.error_message(error)) from None
        except Exception:
            log.failure("D-Bus request of {user} failed", user=caller.user)
            raise BusError(wire.error_name(Kind.INTERNAL), "Internal error (see the server log).") from None

    def session_changed(self, event: SessionEvent) -> None:
        """An observer of the session service: unicast signals to the
        subscribers allowed to see the session."""
        if self.connection is None or not self.subscribers:
            return
        signals = wire.signals_for(event)
        for name, caller in list(self.subscribers.items()):
            if not caller.owns(event.view.user):
                continue
            for member, body in signals:
                self.connection.sendMessage(message.SignalMessage(
                    wire.OBJECT_PATH, member, wire.INTERFACE, destination=name,
                    signature=wire.SIGNALS[member], body=body))
