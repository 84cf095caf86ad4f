"""The NX shell protocol as a pure, sans-IO state machine.

Bytes from the client go into :meth:`ServerDialogue.data_received`; what the server
must do comes back as a list of *effects*: bytes to send, a password to check,
a session command to run, a relay to switch to, a connection to close.  The
results of slow work (PAM, session manager) come back through
:meth:`ServerDialogue.authentication_finished` and :meth:`ServerDialogue.command_finished`.
Nothing here touches a socket, a thread or a clock, so every line of the
dialogue is tested without a reactor (reference §2 and §7 are the contract).

Lines typed ahead while a slow operation runs stay buffered and are handled
in order afterwards: nxcl sends its next command early and must not lose it.

``login`` without a ``hello`` first is accepted, as FreeNX and Neatx accept
it (Neatx then runs at its own protocol version; so does this server, which
answers nothing that depends on the client's version).  Every real client
says ``hello`` first; refusing the others would protect nothing, since the
password check is the same either way.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from nxgate.protocols.nx import errors
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import Params, mask_secrets, parse_params

ENCODING = "utf-8"
# surrogateescape keeps arbitrary bytes (user names, passwords) byte-exact.
ERRORS = "surrogateescape"


# --------------------------------------------------------------------- effects
@dataclass(frozen=True)
class Send:
    """Write these bytes to the client."""

    data: bytes


@dataclass(frozen=True)
class Authenticate:
    """Check this user name and password (PAM); answer with
    :meth:`ServerDialogue.authentication_finished`."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class LoggedIn:
    """The user is authenticated; ``method`` is ``"password"`` or ``"ssh"``."""

    username: str
    method: str


@dataclass(frozen=True)
class Execute:
    """Run a session command for the logged-in user; answer with
    :meth:`ServerDialogue.command_finished`."""

    command: str
    params: Params


@dataclass(frozen=True)
class SwitchToRelay:
    """From now on the channel carries the raw NX proxy stream.

    ``target`` is what the session command returned in :attr:`Reply.relay`;
    ``leftover`` holds bytes the client sent after ``bye``, which belong to
    the stream.
    """

    target: object
    leftover: bytes


@dataclass(frozen=True)
class Close:
    """End the conversation; ``reason`` is a short word for the log."""

    reason: str


Effect = Send | Authenticate | LoggedIn | Execute | SwitchToRelay | Close


@dataclass(frozen=True)
class Reply:
    """The result of a session command.

    ``lines`` are sent as they are, then a fresh prompt.  A non-None ``relay``
    means the command prepared a session that the client will reach by
    sending ``bye`` (encrypted mode).
    """

    lines: tuple[str, ...] = ()
    relay: object | None = None


@dataclass(frozen=True)
class DialogueSettings:
    server_name: str
    protocol_version: str = "3.5.0"
    max_line_length: int = 16384
    max_login_attempts: int = 3
    login_timeout: float = 60.0
    idle_timeout: float = 600.0


class DialogueState(enum.Enum):
    COMMAND = "command"
    USER = "user"
    PASSWORD = "password"
    PARAMETERS = "parameters"
    BUSY = "busy"
    SWITCHED = "switched"
    CLOSED = "closed"


# Commands that take a parameter list and need a logged-in user.
SESSION_COMMANDS = frozenset(
    {"listsession", "startsession", "restoresession", "attachsession", "terminate", "suspend", "addmount"}
)
_PRELOGIN_ONLY = frozenset({"hello", "login"})
_VERSION = re.compile(r"nxclient\s*-\s*version\s+(\d+)\.(\d+)(?:\.(\d+))?", re.IGNORECASE)
_SET_VALUES = {"shell_mode": {"shell"}, "auth_mode": {"password"}}


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = _VERSION.search(text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def format_version(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


class ServerDialogue:
    """One NX conversation on one SSH channel.

    ``preauthenticated_user`` is set when the user logged in to the SSH
    server as himself ("legacy-free" login): ``login`` then answers
    ``NX> 103`` without asking for a user name and password.
    """

    def __init__(self, settings: DialogueSettings, preauthenticated_user: str | None = None):
        self.settings = settings
        self.preauthenticated_user = preauthenticated_user
        self.user: str | None = None
        self.state = DialogueState.COMMAND
        self.failed_logins = 0
        self._server_version = parse_version(f"NXCLIENT - Version {settings.protocol_version}")
        if self._server_version is None or self._server_version[0] != 3:
            raise ValueError(f"protocol_version must be 3.x.y: {settings.protocol_version!r}")
        self._buffer = bytearray()
        self._skip_newline = False
        self._pending_user = ""
        self._pending_command = ""
        self._relay: object | None = None
        self._out: list[str] = []
        self._effects: list[Effect] = []
        self._at_line_start = True

    # ------------------------------------------------------------ public API
    @property
    def logged_in(self) -> bool:
        return self.user is not None

    def connection_made(self) -> list[Effect]:
        self._line(f"HELLO NXSERVER - Version {self.settings.protocol_version} - GPL")
        self._prompt()
        return self._flush()

    def data_received(self, data: bytes) -> list[Effect]:
        if self.state in (DialogueState.SWITCHED, DialogueState.CLOSED):
            raise RuntimeError(f"no input expected in state {self.state.value}")
        self._buffer += data
        self._process_buffer()
        return self._flush()

    def authentication_finished(self, username: str | None, *, error: bool = False, note: str = "") -> list[Effect]:
        """PAM's verdict: the canonical user name, or None for a failure.

        ``error`` marks a failure of the authentication machinery itself
        (not a wrong password): the client gets ``NX> 503``, with ``note``
        as its text when there is one (the server is out of open files: try
        again), and may log in again.  ``note`` is a safe explanation of a
        failure (e.g. root is refused by policy), added in parentheses to
        the ``NX> 404`` line: clients key on the code, and those that show
        the text (OpenNX) show the note too.
        """
        if self.state is DialogueState.CLOSED:
            return []
        self._expect(DialogueState.BUSY)
        if username is not None:
            self._welcome(username, "password")
        elif error:
            self._line(f"NX> 503 ERROR: {note[:1].upper() + note[1:]}." if note else "NX> 503 ERROR: Internal error.")
            self._prompt()
            self.state = DialogueState.COMMAND
        else:
            self.failed_logins += 1
            self._line("NX> 404 ERROR: wrong password or login" + (f" ({note})" if note else ""))
            if self.failed_logins >= self.settings.max_login_attempts:
                self._bye("too-many-login-failures")
            else:
                self.state = DialogueState.COMMAND
                self._prompt()
        self._pending_user = ""
        self._process_buffer()
        return self._flush()

    def progress(self, line: str) -> list[Effect]:
        """A status line while a command runs (e.g. ``NX> 726`` while the
        owner of a session is asked for consent)."""
        if self.state is not DialogueState.BUSY:
            return []
        self._line(line)
        return self._flush()

    def command_finished(self, result: Reply | NXError) -> list[Effect]:
        """The result of an :class:`Execute` effect."""
        if self.state is DialogueState.CLOSED:
            return []
        self._expect(DialogueState.BUSY)
        self.state = DialogueState.COMMAND
        if isinstance(result, NXError):
            self._error(result)
        else:
            for line in result.lines:
                self._line(line)
            if result.relay is not None:
                self._relay = result.relay
            self._prompt()
        self._process_buffer()
        return self._flush()

    def end_of_input(self) -> list[Effect]:
        """The client sent EOF and every complete line has been answered."""
        if self.state in (DialogueState.SWITCHED, DialogueState.CLOSED):
            return []
        self.state = DialogueState.CLOSED
        self._effect(Close("client-eof"))
        return self._flush()

    def connection_lost(self) -> None:
        """The client went away; late results of slow work are dropped."""
        self.state = DialogueState.CLOSED

    def timed_out(self, which: str) -> list[Effect]:
        """The wrapper's login or idle timer fired."""
        if self.state in (DialogueState.SWITCHED, DialogueState.CLOSED):
            return []
        if which == "login":
            text = f"Login timeout: not logged in within {self.settings.login_timeout:g} seconds"
        else:
            text = f"Idle timeout: no command for {self.settings.idle_timeout:g} seconds"
        self._line(f"NX> 500 ERROR: {text}.")
        self._bye(f"{which}-timeout")
        return self._flush()

    # -------------------------------------------------------------- framing
    def _next_line(self) -> bytes | None:
        buf = self._buffer
        if self._skip_newline and buf[:1] == b"\n":
            del buf[:1]
        if buf:
            self._skip_newline = False
        for index, byte in enumerate(buf):
            if byte in (0x0A, 0x0D):
                if index > self.settings.max_line_length:
                    break
                line = bytes(buf[:index])
                self._skip_newline = byte == 0x0D
                del buf[: index + 1]
                return line
        if len(buf) > self.settings.max_line_length:
            self._line(
                f"NX> 500 ERROR: Line too long (the limit is {self.settings.max_line_length}"
                " bytes)."
            )
            self._bye("line-too-long")
        return None

    def _process_buffer(self) -> None:
        while self.state not in (DialogueState.BUSY, DialogueState.SWITCHED, DialogueState.CLOSED):
            raw = self._next_line()
            if raw is None:
                return
            self._handle_line(raw.decode(ENCODING, ERRORS))
            if self.state is DialogueState.SWITCHED:
                self._effect(SwitchToRelay(self._relay, bytes(self._buffer)))
                self._buffer.clear()

    # ------------------------------------------------------------ dialogue
    def _handle_line(self, line: str) -> None:
        if self.state is DialogueState.USER:
            self._got_user(line)
        elif self.state is DialogueState.PASSWORD:
            self._got_password(line)
        elif self.state is DialogueState.PARAMETERS:
            self._echo(mask_secrets(line))
            self._execute(self._pending_command, line)
        else:
            self._got_command(line)

    def _got_command(self, line: str) -> None:
        text = line.strip()
        if not text:
            # A blank line re-prompts, as commercial NX does (FreeNX quits).
            self._echo("")
            self._prompt()
            return
        self._echo(mask_secrets(text))
        word, _, args = text.partition(" ")
        command = word.lower()
        args = args.strip()
        if command == "quit" or (command == "bye" and self._relay is None):
            self._bye(command)
        elif command == "bye":
            self._line("NX> 999 Bye.")
            self.state = DialogueState.SWITCHED
        elif command == "set":
            self._set(args)
        elif command in _PRELOGIN_ONLY and self.logged_in:
            self._error(NXError(errors.WRONG_STATE, f"Error: the command '{command}' cannot be called after login"))
        elif command in SESSION_COMMANDS and not self.logged_in:
            self._error(NXError(errors.WRONG_STATE, f"Error: the command '{command}' cannot be called before to login"))
        elif command == "hello":
            self._hello(args)
        elif command == "login":
            self._login()
        elif command in SESSION_COMMANDS:
            if args:
                self._execute(command, args)
            else:
                self._pending_command = command
                self.state = DialogueState.PARAMETERS
                self._prompt(errors.PARAMETERS_PROMPT, "Parameters:")
        else:
            self._error(NXError(errors.UNDEFINED_COMMAND, f"Error: undefined command: '{word}'"))

    def _hello(self, args: str) -> None:
        client = parse_version(args)
        if client is None or client[0] != 3:
            self._line(
                "NX> 500 Protocol you requested is not supported, please upgrade your client"
                " to latest version"
            )
            self._bye("unsupported-protocol")
            return
        assert self._server_version is not None
        accepted = min(client, self._server_version)
        self._line(f"NX> {errors.HELLO_ACCEPTED} Accepted protocol: {format_version(accepted)}")
        self._prompt()

    def _set(self, args: str) -> None:
        variable, _, value = args.partition(" ")
        allowed = _SET_VALUES.get(variable.lower())
        if allowed is None:
            self._error(NXError(errors.GENERIC_ERROR, f"ERROR: unknown variable '{variable}'"))
        elif value.strip().lower() not in allowed:
            self._error(NXError(errors.GENERIC_ERROR, f"ERROR: unknown {variable.lower()} '{value.strip()}'"))
        else:
            self._prompt()

    def _login(self) -> None:
        if self.logged_in:
            self._error(NXError(errors.WRONG_STATE, "Error: the command 'login' cannot be called after login"))
        elif self.preauthenticated_user is not None:
            self._welcome(self.preauthenticated_user, "ssh")
        else:
            self.state = DialogueState.USER
            self._prompt(errors.USER_PROMPT, "User:")

    def _got_user(self, line: str) -> None:
        # Byte-exact: no stripping beyond the line terminator.
        self._pending_user = line
        self._echo("" if line.startswith("NX>") else line)
        self.state = DialogueState.PASSWORD
        self._prompt(errors.PASSWORD_PROMPT, "Password:")

    def _got_password(self, password: str) -> None:
        self._echo("*" * 10)
        self.state = DialogueState.BUSY
        self._effect(Authenticate(self._pending_user, password))

    def _welcome(self, username: str, method: str) -> None:
        self.user = username
        self.state = DialogueState.COMMAND
        self._effect(LoggedIn(username, method))
        self._line(f"NX> {errors.WELCOME} Welcome to: {self.settings.server_name} user: {username}")
        self._prompt()

    def _execute(self, command: str, args: str) -> None:
        try:
            params = parse_params(args)
        except NXError as error:
            self.state = DialogueState.COMMAND
            self._error(error)
            return
        self.state = DialogueState.BUSY
        self._effect(Execute(command, params))

    # ---------------------------------------------------------------- output
    def _error(self, error: NXError) -> None:
        for line in error.lines():
            self._line(line)
        if error.fatal:
            self._bye("fatal-error")
        else:
            self.state = DialogueState.COMMAND
            self._prompt()

    def _bye(self, reason: str) -> None:
        self._line("NX> 999 Bye.")
        self.state = DialogueState.CLOSED
        self._effect(Close(reason))

    def _echo(self, text: str) -> None:
        self._out.append(text + "\n")
        self._at_line_start = True

    def _line(self, text: str) -> None:
        if not self._at_line_start:
            # A message after an unanswered prompt starts on its own line.
            self._out.append("\n")
        self._out.append(text + "\n")
        self._at_line_start = True

    def _prompt(self, code: int = errors.PROMPT, text: str = "") -> None:
        self._out.append(f"NX> {code} {text} " if text else f"NX> {code} ")
        self._at_line_start = False

    def _effect(self, effect: Effect) -> None:
        self._send_pending()
        self._effects.append(effect)

    def _send_pending(self) -> None:
        if self._out:
            self._effects.append(Send("".join(self._out).encode(ENCODING, ERRORS)))
            self._out.clear()

    def _flush(self) -> list[Effect]:
        self._send_pending()
        effects, self._effects = self._effects, []
        return effects

    def _expect(self, state: DialogueState) -> None:
        if self.state is not state:
            raise RuntimeError(f"expected state {state.value}, in {self.state.value}")
