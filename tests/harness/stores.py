"""The SQLite session store for unit tests: the production store, run
inline (in the test's thread, every Deferred fired at once), and a
synchronous view of it for the tests' own reads and writes."""

from __future__ import annotations

import sqlite3
from typing import Any

from twisted.python.failure import Failure

from nxgate.store.factory import sqlite_store
from nxgate.store.sql import SQLStore


class Synchronous:
    """``store``'s calls answered at once (an inline store's Deferreds have
    fired); ``deferred`` is the store itself, for the code under test."""

    def __init__(self, store: SQLStore) -> None:
        self.deferred = store

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.deferred, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            results: list[Any] = []
            attribute(*args, **kwargs).addBoth(results.append)
            (result,) = results
            if isinstance(result, Failure):
                result.raiseException()
            return result
        return call

    def fill(self) -> None:
        """From now on every write fails as SQLite does on a full disk."""
        self._full_disk().full = True

    def free(self) -> None:
        self._full_disk().full = False

    def _full_disk(self) -> FullDisk:
        connections = self.deferred.connections
        connection, _ = connections._connection()
        if not isinstance(connection, FullDisk):
            connection = connections.local.connection = FullDisk(connection)
        return connection


def inline_store(path: str) -> Synchronous:
    """A fresh (or existing) SQLite store in ``path``, run inline."""
    return Synchronous(sqlite_store(path, reactor=None, inline=True))


class FullDisk:
    """A store connection whose writes fail with SQLITE_FULL while ``full``."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.full = False

    def cursor(self) -> Any:
        return _Cursor(self, self.connection.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


class _Cursor:
    def __init__(self, disk: FullDisk, cursor: Any) -> None:
        self.disk, self.cursor = disk, cursor

    def _check(self, query: str) -> None:
        if self.disk.full and not query.lstrip().upper().startswith(("SELECT", "PRAGMA")):
            error = sqlite3.OperationalError("database or disk is full")
            error.sqlite_errorcode = sqlite3.SQLITE_FULL
            raise error

    def execute(self, query: str, *args: Any) -> Any:
        self._check(query)
        return self.cursor.execute(query, *args)

    def executemany(self, query: str, *args: Any) -> Any:
        self._check(query)
        return self.cursor.executemany(query, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)
