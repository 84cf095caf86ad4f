"""``addmount``: a client shares one of its folders with its session (pure).

What the clients send (reference §6; FreeNX's nxserver/nxnode and OpenNX's
MySession::startSharing): after the session is started, before ``bye``,
one ``addmount`` per share::

    addmount --port="<display+3000>" --username="U" --password="P"
             --share="S" --computername="HOST" --session_id="<32 hex>"
             --dir="$(SHARES)/S"

FreeNX ran ``smbmount //computername/share ~/<dir>`` through the agent's smb
channel port, with ``$(SHARES)`` replaced by ``MyShares``, and answered
``NX> 719 SMB filesystem: running`` at once.  OpenNX URL-escapes the values
(``%XX``; :mod:`nxgate.protocols.nx.params` undoes that); ``--port`` is ignored here,
as FreeNX ended up ignoring it: the server knows its own channel port.

Every value that reaches a path or the FUSE client's configuration is
checked: a share or folder name is one path element of printable
characters, a user name or password holds no quote, backslash or control
character (the configuration's quoting could not carry them).
"""

from __future__ import annotations

import re

from nxgate.protocols.nx import errors
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import Params
from nxgate.protocols.nx.requests import invalid, session_id
from nxgate.safetext import printable
from nxgate.vocabulary.requests import ShareMount

#: Where FreeNX's clients put their shares: ``--dir="$(SHARES)/name"``.
SHARES_PLACEHOLDER = "$(SHARES)"
MAX_NAME = 80
MAX_SECRET = 256
# One path element: no slash, no NUL or control character, not "." or "..".
_NAME = re.compile(r"[^/\x00-\x1f\x7f]{1,%d}" % MAX_NAME)
# Words for the FUSE client's configuration file (double-quoted there).
_CREDENTIAL = re.compile(r'[^"\\\x00-\x1f\x7f]{0,%d}' % MAX_SECRET)


def _name(key: str, value: str) -> str:
    if not _NAME.fullmatch(value) or value in (".", "..") or value != value.strip():
        raise invalid(key, value, f"a share name is 1 to {MAX_NAME} printable characters, no '/'")
    return value


def mount_name(dir_value: str, share: str) -> str:
    """The folder under ``~/MyShares`` a share appears as: the last element
    of ``--dir`` (``$(SHARES)/Documents`` -> ``Documents``), else the share's
    own name."""
    value = dir_value.strip().replace(SHARES_PLACEHOLDER, "").strip("/")
    last = value.rpartition("/")[2]
    return _name("dir", last) if last else share


def parse_addmount(params: Params) -> tuple[str, ShareMount]:
    """(session id, mount) of an ``addmount``; NXError for bad input."""
    sid = session_id(params, "session_id", "sessionid")
    share = _name("share", params.get("share", "").strip())
    name = mount_name(params.get("dir", ""), share)
    username, password = params.get("username", ""), params.get("password", "")
    if not _CREDENTIAL.fullmatch(username):
        raise invalid("username", username, "no quotes, backslashes or control characters")
    if not _CREDENTIAL.fullmatch(password):
        # The password itself is never shown.
        raise NXError(errors.BAD_PARAMETERS, "Error: Invalid value for parameter 'password': no quotes, "
                      f"backslashes or control characters, at most {MAX_SECRET}.")
    computer = printable(params.get("computername", "").strip()[:MAX_NAME])
    return sid, ShareMount(share=share, name=name, username=username, password=password, computer=computer)
