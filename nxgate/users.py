"""Who a logged-in user is, for the session service: looked up once per
login, in a thread (NSS may be LDAP or sssd, and ``grp.getgrall()`` walks
the whole group database), never per command on the reactor thread."""

from __future__ import annotations

import grp
import os
import pwd

from nxgate.sessions.caller import Caller


def group_names(user: str, gid: int) -> frozenset[str]:
    """The names of ``user``'s primary and supplementary groups
    (``getgrouplist``: the groups the user gets at login)."""
    names = set()
    for number in os.getgrouplist(user, gid):
        try:
            names.add(grp.getgrgid(number).gr_name)
        except KeyError:
            continue  # a gid without a name still counts for nothing here
    return frozenset(names)


def resolve_caller(user: str, address: str, local_address: str = "127.0.0.1", door: str = "nx") -> Caller:
    """The :class:`Caller` for ``user`` (blocking: run it in a thread).
    Raises KeyError when the account does not exist (any more)."""
    entry = pwd.getpwnam(user)
    return Caller(user=user, uid=entry.pw_uid, gid=entry.pw_gid, groups=group_names(user, entry.pw_gid),
                  address=address, local_address=local_address, door=door)
