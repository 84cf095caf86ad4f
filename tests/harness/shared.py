"""Fixtures shared by the tests of one class.

Trial does not run ``setUpClass``; starting a gateway and creating a user
for every single test would be slow.  :func:`class_fixture` builds a
class's fixture on first use and tears down the previous class's fixture
when another class asks for one (trial runs a class's tests together), and
the last one at exit.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

_active: dict[str, Any] = {"owner": None, "teardown": None, "value": None}


def class_fixture(owner: type, setup: Callable[[], tuple[Any, Callable[[], None]]]) -> Any:
    if _active["owner"] is owner:
        return _active["value"]
    release()
    value, teardown = setup()
    _active.update(owner=owner, teardown=teardown, value=value)
    return value


def release() -> None:
    teardown = _active["teardown"]
    _active.update(owner=None, teardown=None, value=None)
    if teardown is not None:
        teardown()


atexit.register(release)
