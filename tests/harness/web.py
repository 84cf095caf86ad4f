"""The gateway's web door in tests: its options and where it listens."""

from __future__ import annotations

import re

from tests.harness.gateway import Gateway
from tests.harness.process import wait_for

_SITE = re.compile(r"Site \(TLS\) starting on (\d+)")


def web_options(**more: str) -> dict[str, dict[str, str]]:
    """``Gateway(options=...)`` for a portal on a free loopback port over HTTPS."""
    return {"web": {"listen": "ssl:0:interface=127.0.0.1", **more}}


def web_base(gateway: Gateway) -> str:
    """``https://127.0.0.1:PORT`` of a started gateway's portal."""
    def port() -> int | None:
        found = _SITE.findall(gateway.log())
        return int(found[-1]) if found else None

    return f"https://127.0.0.1:{wait_for(port, 20, 'the web portal to listen')}"
