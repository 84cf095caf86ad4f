"""Where the session store lives: ``[store] url`` parsed, its password
found, and the URL made safe to print (pure but for reading the file).

The password may sit in the URL (convenient, but then the config file is
a secret) or, better, in ``password_file``; either way it is handed to the
driver as a keyword, never put in argv or the environment, and every text
meant for people uses :func:`redact`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from nxgate.safetext import redact_url as redact
from nxgate.store.errors import StoreError

#: URL scheme -> back end.
KINDS = {"sqlite": "sqlite", "postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql",
         "mariadb": "mysql"}
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


@dataclass(frozen=True)
class Location:
    kind: str  # "sqlite", "postgresql" or "mysql"
    url: str = field(repr=False)  # as configured, perhaps with a password: never print it
    user: str = ""
    password: str = field(default="", repr=False)
    host: str = ""
    port: int = 0
    database: str = ""
    path: str = ""  # sqlite: the file (empty: the state directory's default)

    @property
    def safe_url(self) -> str:
        return redact(self.url)


def parse(url: str, password_file: str = "") -> Location:
    """The store's location; the password from ``password_file`` (first
    line) wins over one in the URL.  Raises StoreError with words for the admin."""
    scheme = url.split(":", 1)[0].lower()
    kind = KINDS.get(scheme)
    if kind is None:
        raise StoreError(f"[store] url {redact(url)!r}: unknown kind of database (sqlite:, postgresql://, mysql://)")
    if kind == "sqlite":
        rest = url.split(":", 1)[1]
        return Location(kind, url, path=rest[2:] if rest.startswith("//") else rest)
    try:
        parts = urlsplit(url)
        port = parts.port or DEFAULT_PORTS[kind]
    except ValueError as error:
        raise StoreError(f"[store] url {redact(url)!r}: {error}") from None
    database = unquote(parts.path.lstrip("/"))
    if not parts.hostname or not database or not parts.username:
        raise StoreError(f"[store] url {redact(url)!r}: expected {scheme}://USER@HOST[:PORT]/DATABASE")
    password = unquote(parts.password or "")
    if password_file:
        password = read_password(password_file)
    return Location(kind, url, user=unquote(parts.username), password=password, host=parts.hostname, port=port,
                    database=database)


def read_password(filename: str) -> str:
    """The first line of ``filename``; a file others may read is refused,
    like ssh does with a key."""
    try:
        with open(filename, encoding="utf-8") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if mode & 0o007:
                raise StoreError(f"[store] password_file {filename} can be read by every user; "
                                 f"chmod o-rwx {filename}")
            line = handle.readline()
    except (OSError, UnicodeDecodeError) as error:
        raise StoreError(f"[store] password_file {filename}: cannot read it: {error}") from None
    return line.rstrip("\r\n")
