"""The session store the configuration asks for (``[store] url``).

``sqlite:`` (the default) is the file in the state directory, answering
synchronously through :class:`SyncStoreAdapter` -- a single box needs no
database server.  ``postgresql://`` and ``mysql://`` open the shared
:class:`nxgate.sessions.store.sql.SQLStore`, migrating its schema first.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from nxgate.node.files import StateLayout
from nxgate.node.threads import Blocking
from nxgate.sessions.store.adapter import SyncStoreAdapter
from nxgate.sessions.store.errors import StoreError
from nxgate.sessions.store.interface import SessionStore
from nxgate.sessions.store.location import parse
from nxgate.sessions.store.sqlite import SessionStore as SQLiteDatabase

log = Logger(namespace="nxgate.store")


def open_store(config: Any, layout: StateLayout, blocking: Blocking, reactor: Any = None) -> SessionStore:
    """Open (and migrate) the configured store; raises StoreError (or
    StoreUnavailable, StoreCorrupt) with words for the admin."""
    section = getattr(config, "store", None)
    url = getattr(section, "url", "sqlite:") or "sqlite:"
    location = parse(url, getattr(section, "password_file", ""))
    if location.kind == "sqlite":
        return SyncStoreAdapter(SQLiteDatabase(location.path or layout.database), blocking)
    if reactor is None:
        from twisted.internet import reactor
    from nxgate.sessions.store.dialects import dialect
    from nxgate.sessions.store.sql import SQLStore

    try:
        chosen = dialect(location.kind)
    except ImportError as error:
        package = {"postgresql": "psycopg2 (python3-psycopg2)", "mysql": "PyMySQL (python3-pymysql)"}[location.kind]
        raise StoreError(f"[store] url {location.safe_url} needs {package}: {error}") from None
    store = SQLStore(chosen, location, reactor)
    log.info("sessions are stored in {url} ({kind})", url=location.safe_url, kind=chosen.name)
    return store
