"""Who a logged-in user is, for the session service: looked up once per
login, in a thread (NSS may be LDAP or sssd, and ``grp.getgrall()`` walks
the whole group database), never per command on the reactor thread."""

from __future__ import annotations

import dataclasses
import errno
import grp
import os
import pwd
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from nxgate.descriptors import NSS_HEADROOM, count_open_files, short_of_files
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.threads import Blocking

log = Logger()


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


class AccountsUnavailable(OSError):
    """The user database could not answer (no descriptor left to read
    /etc/passwd, an NSS service down): the account may well exist."""


def account(name: str) -> pwd.struct_passwd:
    """``pwd.getpwnam(name)`` (blocking: NSS), but a KeyError only when the
    user database said there is no such account; a database that could not
    be read raises :class:`AccountsUnavailable`, so that a gateway out of
    descriptors never calls a real user unknown (and counts it as a failed
    login)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        # glibc's NSS says "not found" when /etc/passwd could not be opened
        # (its "files" service unavailable, the next one not knowing the
        # name): only the count of free descriptors tells.
        if short_of_files(NSS_HEADROOM):
            raise AccountsUnavailable(errno.EMFILE, "the user database could not be read: the gateway is out of"
                                                    " open files") from None
        raise


def resolve_caller(user: str, address: str, local_address: str = "127.0.0.1", door: str = "nx") -> Caller:
    """The :class:`Caller` for ``user`` (blocking: run it in a thread).
    Raises KeyError when the account does not exist (any more),
    :class:`AccountsUnavailable` when that cannot be told now."""
    entry = account(user)
    return Caller(user=user, uid=entry.pw_uid, gid=entry.pw_gid, groups=group_names(user, entry.pw_gid),
                  address=address, local_address=local_address, door=door)


class UserDirectory:
    """Account look-ups for the gateway, off the reactor thread, briefly cached.

    ``pwd`` goes through NSS, which may ask LDAP or sssd over the network:
    every look-up runs through ``blocking`` (a thread in production).  An
    answer is kept for ``ttl`` seconds (60 by default), so a busy shadow
    list or a burst of shell-socket connections asks NSS once a minute per
    account, while an account changed or removed is seen within a minute.
    A failed look-up is logged and not cached: the next call asks again.
    """

    def __init__(self, blocking: Blocking, ttl: float = 60.0, now: Callable[[], float] = time.monotonic) -> None:
        self.blocking = blocking
        self.ttl = ttl
        self.now = now
        self._cache: dict[tuple[str, object], tuple[float, Any]] = {}

    def lookup(self, name: str) -> Deferred[pwd.struct_passwd]:
        """The passwd entry of ``name``; fails with KeyError for an unknown
        account, :class:`AccountsUnavailable` when the database cannot tell."""
        return self._get(("name", name), account, name)

    def by_uid(self, uid: int) -> Deferred[pwd.struct_passwd]:
        """The passwd entry of ``uid``; fails with KeyError for an unknown uid."""
        return self._get(("uid", uid), pwd.getpwuid, uid)

    def groups(self, name: str, gid: int) -> Deferred[frozenset[str]]:
        """:func:`group_names` of ``name``, cached like the accounts."""
        return self._get(("groups", (name, gid)), lambda key: group_names(*key), (name, gid))

    async def here(self, caller: Caller, machine: str) -> Caller:
        """``caller`` as this machine knows the account: its uid, gid and
        groups looked up here by name.  A node never trusts the numbers a
        gateway resolved: on a member whose uid numbering differs they would
        make the session's files another local user's.  An account this
        machine does not have is refused with words for the user."""
        if caller.admin:
            return caller
        try:
            entry = await self.lookup(caller.user)
        except KeyError:
            raise SessionError(Kind.NOT_ALLOWED, f"The account {caller.user} does not exist on the machine "
                                                 f"{machine}; ask your administrator.") from None
        except AccountsUnavailable:
            raise SessionError(Kind.LIMIT_REACHED, f"The machine {machine} is out of open files; please try again"
                                                   " in a minute.") from None
        groups = await self.groups(caller.user, entry.pw_gid)
        return dataclasses.replace(caller, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups)

    def forget(self) -> None:
        """Drop every cached answer (after a configuration reload, say)."""
        self._cache.clear()

    def _get(self, key: tuple[str, object], function: Callable[[Any], Any], argument: Any) -> Deferred[Any]:
        cached = self._cache.get(key)
        if cached is not None and cached[0] > self.now():
            return defer.succeed(cached[1])
        self._cache.pop(key, None)

        def found(entry: Any) -> Any:
            self._cache[key] = (self.now() + self.ttl, entry)
            return entry

        def failed(failure: Failure) -> Failure:
            if failure.check(KeyError):
                log.info("no account {kind} {value!r} (looked up by {function})", kind=key[0], value=argument,
                         function=function.__name__)
            elif failure.check(AccountsUnavailable):
                log.error("the look-up of account {kind} {value!r} failed: {error}", kind=key[0], value=argument,
                          error=str(failure.value), open_files=count_open_files())
            else:
                log.failure("the look-up of account {kind} {value!r} failed", failure, kind=key[0], value=argument)
            return failure

        return self.blocking(function, argument).addCallbacks(found, failed)
