"""One stand-in for each interface of :mod:`nxgate.vocabulary.api`, for the
unit tests of what sits above it (the NX dispatcher, the portal, the X2Go
door, the router, a node's listener).

Each method is written out with the interface's own signature, and
tests/test_api_conformance.py checks the fakes beside the real
implementations: a method added to the API or an argument renamed fails
there, not silently in one test's private copy.

A test says what each call answers, by method name::

    api = FakeSessionAPI(list=Listing((), False), start=SessionError(...))
    api = FakeSessionAPI(default=None)          # every method answers None
    api = FakeSessionAPI.over(model)            # the model's methods answer

An answer is a value (returned), an exception (raised), or a function of
the call's arguments, whose result is returned (awaited when it is
awaitable).  A call the test gave no answer for fails it, naming the
method.  Every call is kept in :attr:`received` as ``(method, *arguments)``.

A subclass answers a method by defining ``on_<method>``, and may add what
one caller needs beyond the interface (the router's ``session``, a node
listener's ``stream_target``), but never redefines an API method: the
checked signatures are this module's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from nxgate.vocabulary.api import NodeAPI, SessionAPI
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.requests import FolderShares, RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import (DesktopEntry, FolderMount, Listing, ProgressCallback, Ready, ServiceStatus,
                                     SessionEvent, SessionView, ShadowTarget)
from nxgate.vocabulary.streams import Stream, StreamKind

UNSET: Any = object()


class UnexpectedCall(AssertionError):
    """The code under test called a method the test gave no answer for."""


class FakeSessionAPI:
    """:class:`nxgate.vocabulary.api.SessionAPI` answering what the test says."""

    INTERFACE: type = SessionAPI

    def __init__(self, default: Any = UNSET, **answers: Any) -> None:
        unknown = set(answers) - type(self).methods()
        if unknown:
            raise TypeError(f"{type(self).__name__} has no method {', '.join(sorted(unknown))}")
        own = {name: getattr(self, f"on_{name}") for name in type(self).methods() if hasattr(self, f"on_{name}")}
        self.answers: dict[str, Any] = {**own, **answers}
        self.default = default
        self.received: list[tuple[Any, ...]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:
            return
        redefined = {name for name in vars(cls) if not name.startswith("_")
                     and any(name in vars(base) for base in cls.__mro__[1:] if base.__module__ == __name__)}
        if redefined:
            raise TypeError(f"{cls.__name__} redefines {', '.join(sorted(redefined))}: pass answers instead")

    @classmethod
    def methods(cls) -> frozenset[str]:
        """The methods a test may answer: the fake's coroutine methods."""
        return frozenset(name for name in dir(cls) if not name.startswith("_")
                         and inspect.iscoroutinefunction(getattr(cls, name)))

    @classmethod
    def over(cls, model: object, default: Any = UNSET, **answers: Any) -> Any:
        """A fake whose calls the same-named methods of ``model`` answer
        (a test's small model of sessions, with its own bookkeeping)."""
        found = {name: getattr(model, name) for name in cls.methods() if hasattr(model, name)}
        return cls(default, **{**found, **answers})

    def called(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``method``, in order."""
        return [call[1:] for call in self.received if call[0] == method]

    async def _answer(self, method: str, *arguments: Any) -> Any:
        self.received.append((method, *arguments))
        answer = self.answers.get(method, self.default)
        if answer is UNSET:
            raise UnexpectedCall(f"{type(self).__name__}.{method}{arguments!r}: the test gave no answer for it")
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            result = answer(*arguments)
            return await result if inspect.isawaitable(result) else result
        return answer

    # ------------------------------------------------------------ SessionAPI
    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        return await self._answer("start", caller, request)

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        return await self._answer("start_for_later", caller, session_type, name)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        return await self._answer("restore", caller, request)

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        return await self._answer("attach_shadow", caller, request, progress)

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        return await self._answer("suspend", caller, session_id)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        return await self._answer("terminate", caller, session_id, reason)

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView:
        return await self._answer("rename", caller, session_id, name)

    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool:
        return await self._answer("add_mount", caller, session_id, mount)

    async def mount_folders(self, caller: Caller, session_id: str, shares: FolderShares) -> tuple[FolderMount, ...]:
        return await self._answer("mount_folders", caller, session_id, shares)

    async def unmount_folders(self, caller: Caller, session_id: str, path: str = "") -> tuple[FolderMount, ...]:
        return await self._answer("unmount_folders", caller, session_id, path)

    async def folders(self, caller: Caller, session_id: str) -> tuple[FolderMount, ...]:
        return await self._answer("folders", caller, session_id)

    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]:
        return await self._answer("applications", caller, session_id)

    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool:
        return await self._answer("run_application", caller, session_id, argv)

    async def list(self, caller: Caller) -> Listing:
        return await self._answer("list", caller)

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return await self._answer("show", caller, session_id)

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        return await self._answer("shadow_targets", caller)

    async def status(self, caller: Caller) -> ServiceStatus:
        return await self._answer("status", caller)

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        return await self._answer("set_draining", caller, on)


class FakeNodeAPI(FakeSessionAPI):
    """:class:`nxgate.vocabulary.api.NodeAPI`: the session API's fake, plus
    thumbnails, streams and session events.  :meth:`subscribe` keeps the
    observers in :attr:`observers`; :meth:`publish` plays an event to them."""

    INTERFACE = NodeAPI

    def __init__(self, default: Any = UNSET, **answers: Any) -> None:
        super().__init__(default, **answers)
        self.observers: list[Callable[[SessionEvent], None]] = []

    async def thumbnail(self, caller: Caller, session_id: str) -> bytes:
        return await self._answer("thumbnail", caller, session_id)

    async def open_stream(self, caller: Caller, session_id: str, kind: StreamKind) -> Stream:
        return await self._answer("open_stream", caller, session_id, kind)

    def subscribe(self, observer: Callable[[SessionEvent], None]) -> Callable[[], None]:
        self.received.append(("subscribe", observer))
        self.observers.append(observer)
        return lambda: self.observers.remove(observer) if observer in self.observers else None

    def publish(self, event: SessionEvent) -> None:
        for observer in list(self.observers):
            observer(event)


# The fakes of :mod:`tests.test_api_conformance`, beside the real implementations.
FAKES = (FakeSessionAPI, FakeNodeAPI)
