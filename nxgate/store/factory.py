"""The session store the configuration asks for (``[store] url``).

``sqlite:`` (the default) is the file in the state directory -- a single
box needs no database server; ``postgresql://`` and ``mysql://`` are a
server shared by the members of a cluster.  All three are the one
:class:`nxgate.store.sql.SQLStore`, with their dialect, its schema
migrated first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twisted.logger import Logger

from nxgate.store.dialects import dialect
from nxgate.store.errors import StoreError
from nxgate.store.location import Location, parse
from nxgate.store.sql import SQLStore

log = Logger()


def sqlite_store(path: str, reactor: Any, inline: bool = False) -> SQLStore:
    """The SQLite store in ``path`` (``inline``: in the calling thread, for tests)."""
    return SQLStore(dialect("sqlite"), Location("sqlite", f"sqlite:{path}", path=path), reactor, inline=inline)


def open_store(config: Any, layout: Any, reactor: Any = None) -> SQLStore:
    """Open (and migrate) the configured store; raises StoreError (or
    StoreUnavailable, StoreCorrupt) with words for the admin.  ``layout``:
    the state directory (nxgate.node.files.StateLayout), whose ``database``
    is the SQLite file by default."""
    section = getattr(config, "store", None)
    url = getattr(section, "url", "sqlite:") or "sqlite:"
    location = parse(url, getattr(section, "password_file", ""))
    if reactor is None:
        from twisted.internet import reactor
    if location.kind == "sqlite":
        location = dataclasses.replace(location, path=location.path or layout.database)
    try:
        chosen = dialect(location.kind)
    except ImportError as error:
        package = {"postgresql": "psycopg2 (python3-psycopg2)", "mysql": "PyMySQL (python3-pymysql)"}[location.kind]
        raise StoreError(f"[store] url {location.safe_url} needs {package}: {error}") from None
    store = SQLStore(chosen, location, reactor)
    log.info("sessions are stored in {url} ({kind})", url=store.path, kind=chosen.name)
    return store
