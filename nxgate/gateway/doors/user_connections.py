"""How many authenticated connections each user holds, over every door (pure).

Once a connection has authenticated it no longer counts at the door
(:mod:`nxgate.gateway.doors.preauth` is about strangers), so one user with a
password could open connection after connection, each a descriptor and
more of the gateway's, until the doors' file reserve refused everyone
else.  This table caps them per user: an SSH login as oneself (NX, X2Go,
any client), an NX login inside the nx account's connection, a local
user on the OpenSSH mode's shell socket, a browser viewer's WebSocket.
Each connection counts once per user it carries (an nx-key connection may
carry the NX logins of several users, one per channel), from the login to
its end; ``[server] max_connections_per_user`` (0: no cap).
"""

from __future__ import annotations

from collections.abc import Hashable


def too_many(user: str, limit: int) -> str:
    """The words of a refusal, for the user and the log."""
    return (f"user {user} has {limit} connections to this server open already, the most one user may have at"
            " once; close one and try again")


class UserConnections:
    """Connections by user; ``limit`` per user (0: none)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.by_user: dict[str, set[Hashable]] = {}
        self.by_connection: dict[Hashable, set[str]] = {}
        self.refused = 0

    def take(self, user: str, connection: Hashable) -> str | None:
        """``connection`` carries ``user``'s login from now on: None, or the
        words of the refusal when the user holds ``limit`` already (a
        connection that counts for the user already is no new one)."""
        held = self.by_user.get(user, set())
        if connection in held:
            return None
        if self.limit and len(held) >= self.limit:
            self.refused += 1
            return too_many(user, self.limit)
        self.by_user.setdefault(user, set()).add(connection)
        self.by_connection.setdefault(connection, set()).add(user)
        return None

    def release(self, connection: Hashable) -> None:
        """``connection`` ended: it no longer counts for any user."""
        for user in self.by_connection.pop(connection, ()):
            held = self.by_user.get(user)
            if held is not None:
                held.discard(connection)
                if not held:
                    del self.by_user[user]

    def count(self, user: str) -> int:
        return len(self.by_user.get(user, ()))

    def status(self) -> dict[str, int]:
        """For ``nxgate-admin status``: users and their connections now, the most one user holds, refusals."""
        return {"users_connected": len(self.by_user), "user_connections": len(self.by_connection),
                "most_connections_of_one_user": max((len(held) for held in self.by_user.values()), default=0),
                "refused_user_connections": self.refused}
