"""One user with a password opening SSH logins and keeping them, with paramiko.

Run by Debian's python3 (python3-paramiko; the venv has no paramiko):
``python3 tests/harness/login_flood.py PORT USER COUNT`` with the password
in ``NXGATE_TEST_PASSWORD`` (never in argv).  It logs in COUNT times, four
at a time, keeps every connection that got in, prints one JSON line
(``held``, ``refused`` and the distinct ``errors``, the server's banners and
disconnect words among them) and holds the connections until its stdin
closes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import paramiko

PARALLEL = 4  # [ssh] kex_per_source: more at once would be refused as a key-exchange flood


class Banners:
    """The banners the server sent during the logins (paramiko keeps the last one per transport)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def note(self, transport: paramiko.Transport | None) -> None:
        banner = transport.get_banner() if transport is not None else None
        if banner:
            with self.lock:
                self.seen.add(banner.decode(errors="replace").strip()[:300])


def login(port: int, user: str, banners: Banners) -> tuple[paramiko.SSHClient | None, str]:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect("127.0.0.1", port=port, username=user, password=os.environ["NXGATE_TEST_PASSWORD"],
                       allow_agent=False, look_for_keys=False, timeout=30, banner_timeout=30, auth_timeout=30)
    except Exception as error:  # refused: what the server said is the point
        banners.note(client.get_transport())
        client.close()
        return None, f"{type(error).__name__}: {error}"[:300]
    return client, ""


def main() -> None:
    port, user, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    banners = Banners()
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda _: login(port, user, banners), range(count)))
    held = [client for client, _ in results if client is not None]
    errors = sorted({error for _, error in results if error})
    print(json.dumps({"held": len(held), "refused": count - len(held), "errors": errors[:20],
                      "banners": sorted(banners.seen)}), flush=True)
    sys.stdin.read()
    for client in held:
        client.close()


if __name__ == "__main__":
    main()
