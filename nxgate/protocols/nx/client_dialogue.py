"""The client side of the NX shell dialogue as a pure, sans-IO state machine.

Server bytes go into :meth:`ClientDialogue.data_received`; what the client
must do comes back as *events*: lines to send, parsed results, errors.
Nothing here touches a socket, a process or a clock, so every step of the
dialogue is tested line by line (reference §2 and §7 are the contract).

Framing follows what the real clients do (reference §2.1): server messages
are ``NX> <code> <text>`` lines, but prompts (``NX> 105 ``, ``NX> 101 User: ``,
``NX> 102 Password: ``, ``NX> 106 Parameters: ``) come without a newline and
the server echoes our command on the same line after them.  A prompt is
recognised at the start of a line as soon as its bytes are there, however
the reads split it; the rest of that line is the echo, unless it is itself
an ``NX>`` message (FreeNX's relayed node output can land right after a
prompt).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from nxgate.protocols.nx import client_commands as commands
from nxgate.protocols.nx.listing import ParsedRow, parse_row
from nxgate.protocols.nx.params import escape

# Server text is for reading and parsing; undecodable bytes must not kill us.
_DECODE_ERRORS = "replace"
# What we send (user names, passwords from the environment) goes out byte-exact.
_ENCODE_ERRORS = "surrogateescape"

PROMPTS: dict[bytes, int] = {
    b"NX> 105 ": 105,
    b"NX> 101 User: ": 101,
    b"NX> 102 Password: ": 102,
    b"NX> 106 Parameters: ": 106,
}
# The same prompts as complete lines, for servers that end them with a newline.
_PROMPT_LINES = {prompt.decode().rstrip(): code for prompt, code in PROMPTS.items()}
_MESSAGE = re.compile(r"NX> (\d+)(?: (.*))?$")
_BANNER = re.compile(r"HELLO NXSERVER - Version (\S+)", re.IGNORECASE)
_FIELD = re.compile(r"[^:]*:\s*(.*)$")
MASK = "********"

# Codes that carry session secrets; their values are masked in traces.
_SECRET_CODES = frozenset({701, 706})


def is_error(code: int) -> bool:
    """4xx and 5xx are errors (reference §3); so is FreeNX's node error 1004."""
    return 400 <= code < 600 or code == 1004


# ---------------------------------------------------------------- requests
@dataclass(frozen=True)
class ListSessions:
    pass


@dataclass(frozen=True)
class StartSession:
    params: commands.SessionParameters


@dataclass(frozen=True)
class RestoreSession:
    session_id: str
    params: commands.SessionParameters


@dataclass(frozen=True)
class TerminateSession:
    session_id: str


@dataclass(frozen=True)
class SuspendSession:
    session_id: str


@dataclass(frozen=True)
class ShadowSession:
    """List what may be shadowed (``listsession --type="shadow"``), then
    attach to ``session_id``, or to the session the user picks from the list
    (:class:`ShadowChoices`, answered with :meth:`ClientDialogue.choose`)."""

    session_id: str | None
    params: commands.SessionParameters
    view_only: bool = False


Request = ListSessions | StartSession | RestoreSession | TerminateSession | SuspendSession | ShadowSession
# Requests that end attached to a session, drawn by nxproxy.
ATTACHING = (StartSession, RestoreSession, ShadowSession)


def command_line(request: Request) -> str:
    """The first command of ``request`` (a shadow starts with its listing)."""
    if isinstance(request, ListSessions):
        return commands.list_command()
    if isinstance(request, ShadowSession):
        return commands.list_shadow_command()
    if isinstance(request, StartSession):
        return commands.start_command(request.params)
    if isinstance(request, RestoreSession):
        return commands.restore_command(request.session_id, request.params)
    if isinstance(request, SuspendSession):
        return commands.suspend_command(request.session_id)
    return commands.terminate_command(request.session_id)


# ------------------------------------------------------------------ results
@dataclass(frozen=True)
class SessionInfo:
    """What the server said after ``startsession``/``restoresession``."""

    full_id: str  # NX> 700, for nxproxy's id=
    session_id: str  # the bare 32-hex id
    display: int
    cookie: str = field(repr=False)
    session_type: str = ""
    proxy_ip: str = ""
    status: str = ""
    # NX> 709: the server offers folder sharing (the port is FreeNX's hint, 445).
    file_sharing_port: int | None = None


# ------------------------------------------------------------------- events
@dataclass(frozen=True)
class Send:
    """Write these bytes to the server (``repr`` hides them: a password)."""

    data: bytes = field(repr=False)


@dataclass(frozen=True)
class Trace:
    """One line of the dialogue for ``--verbose``; secrets already masked.

    ``source`` is ``"server"``, ``"client"`` or ``"stderr"`` (the server's
    extended data, where FreeNX writes some messages)."""

    source: str
    text: str


@dataclass(frozen=True)
class Listed:
    sessions: tuple[ParsedRow, ...]
    capacity_reached: bool


@dataclass(frozen=True)
class Terminated:
    session_id: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Suspended:
    session_id: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class ShadowChoices:
    """Several sessions may be shadowed and none was named: ask the user,
    then call :meth:`ClientDialogue.choose` (or :meth:`ClientDialogue.quit`)."""

    sessions: tuple[ParsedRow, ...]


@dataclass(frozen=True)
class Notice:
    """Something the user should know while waiting, such as the server
    asking the owner of a session for permission to shadow it (``NX> 726``)."""

    text: str


@dataclass(frozen=True)
class SessionReady:
    """The session waits for our proxy; call :meth:`ClientDialogue.proxy_connected`
    once nxproxy is connected to the local end."""

    info: SessionInfo


@dataclass(frozen=True)
class Switched:
    """``NX> 999 Bye``: from now on the channel carries the raw NX stream.
    ``leftover`` holds stream bytes that came in the same read."""

    leftover: bytes = field(repr=False)


@dataclass(frozen=True)
class Failed:
    """The operation failed.  Lines starting with ``NX>`` are the server's
    own error lines, to be shown as they are; others are ours."""

    lines: tuple[str, ...]


Event = Send | Trace | Listed | Terminated | Suspended | ShadowChoices | Notice | SessionReady | Switched | Failed


#: ``--shadow`` found nothing to watch: what governs it (nxgate's [shadow]
#: policy; FreeNX and Neatx list one's own sessions only).
NOTHING_TO_SHADOW = ("the server lists no session that you may shadow: only running sessions can be watched, your "
                     "own other ones when the server's shadow policy allows it ([shadow] allow_own), other users' "
                     "only when it names you ([shadow] allow_others: admins or everyone); ask its administrator")


class Phase(enum.Enum):
    GREETING = "greeting"
    HELLO = "hello"
    SET_SHELL = "set shell mode"
    SET_AUTH = "set auth mode"
    LOGIN = "login"
    COMMAND = "command"
    CHOOSING = "choosing a session to shadow"
    READY = "waiting for the proxy"
    BYE = "bye"
    SWITCHED = "switched"
    QUITTING = "quitting"
    DONE = "done"
    FAILED = "failed"


_FINISHED = frozenset({Phase.SWITCHED, Phase.QUITTING, Phase.DONE, Phase.FAILED})


@dataclass(frozen=True)
class _Prompt:
    code: int
    text: str


@dataclass(frozen=True)
class _Line:
    text: str
    after_prompt: bool


class ClientDialogue:
    """One NX conversation from the client's side, for one request.

    ``password`` may be a callable so that it is asked for only if the server
    actually prompts (legacy-free logins never see ``NX> 102``).
    """

    def __init__(self, user: str, password: str | Callable[[], str], request: Request) -> None:
        self.user = user
        self._password = password
        self.request = request
        self.phase = Phase.GREETING
        self.server_version: str | None = None
        self.accepted_version: str | None = None
        self.logged_in = False
        self._buffer = bytearray()
        self._stderr = bytearray()
        self._at_line_start = True
        self._last_prompt: int | None = None
        self._errors: list[str] = []
        self._events: list[Event] = []
        # Reply of the current command.
        self._fields: dict[int, str] = {}
        self._lines: list[str] = []
        self._prompted = False
        self._table_started = False
        self._rows: list[ParsedRow] = []
        self._capacity_reached = False
        self._attaching = False  # a ShadowSession past its listing
        self.shadowed: str | None = None  # the session a ShadowSession watches, once asked for
        self._mounts_pending = 0  # addmount commands not answered yet
        # Secret values (as sent and as typed) that no trace may show: a
        # server may echo the command line verbatim (FreeNX).
        self._secrets = _secrets(request)

    # ------------------------------------------------------------ public API
    @property
    def error_pending(self) -> bool:
        """An error line came and we wait for the prompt that ends it; the
        wrapper gives up after a short while if none comes."""
        return bool(self._errors) and self.phase not in _FINISHED

    def data_received(self, data: bytes) -> list[Event]:
        if self.phase is Phase.SWITCHED:
            raise RuntimeError("the dialogue is over: data belongs to the NX stream")
        self._buffer += data
        self._process()
        return self._flush()

    def stderr_received(self, data: bytes) -> list[Event]:
        """The server's extended data: traced; FreeNX writes ``NX> 999 Bye``
        there after ``bye`` (reference §2.7)."""
        self._stderr += data
        while (index := self._stderr.find(b"\n")) >= 0:
            text = self._decode(bytes(self._stderr[:index]))
            del self._stderr[: index + 1]
            self._trace("stderr", text)
            if self.phase is Phase.BYE and text.startswith("NX> 999"):
                self._switch()
        return self._flush()

    def proxy_connected(self) -> list[Event]:
        """nxproxy is connected to our local end: ask for the stream."""
        if self.phase is not Phase.READY:
            raise RuntimeError(f"no session is waiting (phase: {self.phase.value})")
        self.phase = Phase.BYE
        self._send("bye")
        return self._flush()

    def add_mounts(self, lines: list[str], secrets: tuple[str, ...]) -> list[Event]:
        """Send ``addmount`` commands while the session waits for our proxy
        (as OpenNX does, before ``bye``); ``secrets`` never show in a trace.
        The server's answers come as notices: a folder that cannot be shared
        never costs the session."""
        if self.phase is not Phase.READY:
            raise RuntimeError(f"no session is waiting (phase: {self.phase.value})")
        self._secrets = tuple(sorted({*self._secrets, *secrets, *(escape(s) for s in secrets)}, key=len,
                                     reverse=True))
        for line in lines:
            self._send(line)
        self._mounts_pending += len(lines)
        return self._flush()

    def choose(self, session_id: str) -> list[Event]:
        """The user picked the session to shadow (an id from :class:`ShadowChoices`)."""
        if self.phase is not Phase.CHOOSING:
            raise RuntimeError(f"no choice is pending (phase: {self.phase.value})")
        self.phase = Phase.COMMAND
        self._attach(session_id)
        return self._flush()

    def quit(self) -> list[Event]:
        """End the conversation politely (the user chose nothing)."""
        if self.phase is not Phase.CHOOSING:
            raise RuntimeError(f"nothing to quit (phase: {self.phase.value})")
        self.phase = Phase.QUITTING
        self._send("quit")
        return self._flush()

    def connection_lost(self) -> list[Event]:
        """The server closed the channel."""
        if self.phase not in _FINISHED:
            self._fail_unless_told(f"the server closed the connection during {self.phase.value}")
        elif self.phase is Phase.QUITTING:
            self.phase = Phase.DONE
        return self._flush()

    def timed_out(self) -> list[Event]:
        """The wrapper's timer: no answer came in time."""
        if self.phase not in _FINISHED:
            self._fail_unless_told(f"no answer from the server during {self.phase.value}")
        return self._flush()

    # -------------------------------------------------------------- framing
    def _next_token(self) -> _Prompt | _Line | None:
        buf = self._buffer
        if self._at_line_start:
            for prompt, code in PROMPTS.items():
                if buf.startswith(prompt):
                    del buf[: len(prompt)]
                    self._at_line_start = False
                    return _Prompt(code, prompt.decode())
                if prompt.startswith(buf):
                    return None  # the start of a prompt: wait for the rest
        index = buf.find(b"\n")
        if index < 0:
            return None
        raw = bytes(buf[:index])
        del buf[: index + 1]
        after_prompt = not self._at_line_start
        self._at_line_start = True
        text = self._decode(raw.rstrip(b"\r"))
        if not after_prompt and text.rstrip() in _PROMPT_LINES:
            return _Prompt(_PROMPT_LINES[text.rstrip()], text)
        return _Line(text, after_prompt)

    def _process(self) -> None:
        while self.phase is not Phase.SWITCHED:
            token = self._next_token()
            if token is None:
                return
            if isinstance(token, _Prompt):
                self._trace("server", token.text)
                self._last_prompt = token.code
                self._prompt(token.code)
            else:
                self._line(token)

    def _line(self, token: _Line) -> None:
        text = token.text
        match = _MESSAGE.match(text)
        if token.after_prompt and match is None:
            # The echo of what we answered; a password is never shown.
            self._trace("server", MASK if self._last_prompt == 102 and text else text)
            return
        if match is None:
            self._trace("server", text)
            self._plain_line(text)
            return
        code = int(match.group(1))
        rest = match.group(2) or ""
        self._trace("server", self._masked(code, text))
        if self.phase in (Phase.DONE, Phase.FAILED):
            return
        if code == 999:
            self._bye_line(text)
        elif self.phase is Phase.READY and self._mounts_pending and (is_error(code) or code == 719):
            self._events.append(Notice(self._hidden(text)))  # an addmount's answer
        elif is_error(code):
            self._errors.append(self._hidden(text))
        else:
            self._message(code, rest, text)

    # ------------------------------------------------------------- dialogue
    def _prompt(self, code: int) -> None:
        if self.phase in _FINISHED:
            return
        if self._errors:
            self._fail()
            return
        phase = self.phase
        if phase in (Phase.READY, Phase.BYE):
            if self._mounts_pending:
                self._mounts_pending -= 1  # an addmount answered
            return
        if code == 101 and phase is Phase.LOGIN:
            self._send(self.user)
        elif code == 102 and phase is Phase.LOGIN:
            self._send(self._get_password(), shown=MASK)
        elif code != 105:
            self._fail(f"unexpected prompt from the server: NX> {code} (during {phase.value})")
        elif phase is Phase.GREETING:
            self.phase = Phase.HELLO
            self._send(commands.hello(self.server_version))
        elif phase is Phase.HELLO:
            if self.accepted_version is None:
                self._fail(f"the server did not accept '{commands.hello(self.server_version)}' (no NX> 134)")
                return
            self.phase = Phase.SET_SHELL
            self._send("SET SHELL_MODE SHELL")
        elif phase is Phase.SET_SHELL:
            self.phase = Phase.SET_AUTH
            self._send("SET AUTH_MODE PASSWORD")
        elif phase is Phase.SET_AUTH:
            self.phase = Phase.LOGIN
            self._send("login")
        elif phase is Phase.LOGIN:
            if not self.logged_in:
                self._fail("the server did not confirm the login (no NX> 103)")
                return
            self.phase = Phase.COMMAND
            self._send(command_line(self.request))
        elif phase is Phase.COMMAND:
            self._prompted = True
            self._command_done()

    def _message(self, code: int, rest: str, text: str) -> None:
        phase = self.phase
        if phase is Phase.HELLO and code == 134:
            self.accepted_version = rest.rpartition(" ")[2] or rest
        elif phase is Phase.LOGIN and code == 103:
            self.logged_in = True
        elif phase is Phase.COMMAND:
            self._lines.append(text)
            self._fields.setdefault(code, _field_value(rest))
            if code == 726:
                self._events.append(Notice(rest))
            if self._listing:
                if code == 147:
                    self._capacity_reached = True
            elif code == 710 and self._prompted:
                # The prompt overtook the status (FreeNX relays node output).
                self._command_done()

    def _plain_line(self, text: str) -> None:
        if self.phase is Phase.GREETING:
            match = _BANNER.match(text)
            if match:
                self.server_version = match.group(1)
        elif self.phase is Phase.COMMAND and self._listing:
            if text.startswith("---"):
                self._table_started = True  # rows follow the dashes under the header
            elif self._table_started and text.strip():
                row = parse_row(text)
                if row is not None:
                    self._rows.append(row)

    def _bye_line(self, text: str) -> None:
        if self.phase is Phase.BYE:
            self._switch()
        elif self.phase is Phase.QUITTING:
            self.phase = Phase.DONE
        else:
            self._fail_unless_told(f"the server ended the conversation: {text}")

    @property
    def _listing(self) -> bool:
        """The current command is a ``listsession``."""
        return isinstance(self.request, ListSessions) or (isinstance(self.request, ShadowSession)
                                                          and not self._attaching)

    def _command_done(self) -> None:
        request = self.request
        if isinstance(request, ListSessions):
            self._finish(Listed(tuple(self._rows), self._capacity_reached))
        elif isinstance(request, ShadowSession) and not self._attaching:
            self._shadow_listed(request)
        elif isinstance(request, TerminateSession):
            self._finish(Terminated(request.session_id, tuple(self._lines)))
        elif isinstance(request, SuspendSession):
            self._finish(Suspended(request.session_id, tuple(self._lines)))
        elif 700 not in self._fields:
            self._fail("the server answered without starting a session (no NX> 700)")
        elif 710 in self._fields:
            try:
                info = session_info(self._fields)
            except ValueError as problem:
                self._fail(str(problem))
                return
            self.phase = Phase.READY
            self._events.append(SessionReady(info))
        # else: 700 but no 710 yet; the status is on its way.

    def _shadow_listed(self, request: ShadowSession) -> None:
        rows = tuple(self._rows)
        if request.session_id is not None:
            self._attach(request.session_id)
        elif not rows:
            self._fail(NOTHING_TO_SHADOW)
        elif len(rows) == 1:
            row = rows[0]
            self._events.append(Notice(f"shadowing {row.session_id} ({row.name}), the only session you may shadow"))
            self._attach(row.session_id)
        else:
            self.phase = Phase.CHOOSING
            self._events.append(ShadowChoices(rows))

    def _attach(self, session_id: str) -> None:
        """``attachsession`` with the display the listing gave (nxcl's 0 if it
        listed no such session: the server decides)."""
        request = self.request
        assert isinstance(request, ShadowSession)
        display = next((row.display for row in self._rows if row.session_id == session_id), "0")
        self._attaching = True
        self.shadowed = session_id
        self._fields, self._lines, self._prompted = {}, [], False
        self._send(commands.attach_command(session_id, display, request.params, request.view_only))

    def _finish(self, result: Event) -> None:
        self._events.append(result)
        self.phase = Phase.QUITTING
        self._send("quit")

    def _switch(self) -> None:
        self.phase = Phase.SWITCHED
        self._events.append(Switched(bytes(self._buffer)))
        self._buffer.clear()

    def _fail_unless_told(self, reason: str) -> None:
        """Fail with the server's error lines if it sent any, else with ``reason``."""
        self._fail(*([] if self._errors else [reason]))

    def _fail(self, *lines: str) -> None:
        self.phase = Phase.FAILED
        self._events.append(Failed(tuple(self._errors) + lines))
        self._errors = []

    # --------------------------------------------------------------- output
    def _send(self, line: str, shown: str | None = None) -> None:
        self._trace("client", line if shown is None else shown)
        self._events.append(Send(line.encode("utf-8", _ENCODE_ERRORS) + b"\n"))

    def _trace(self, source: str, text: str) -> None:
        self._events.append(Trace(source, self._hidden(text)))

    def _hidden(self, text: str) -> str:
        """``text`` without the secrets of the request, for showing."""
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text

    def _get_password(self) -> str:
        if callable(self._password):
            self._password = self._password()
        return self._password

    def _flush(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    @staticmethod
    def _decode(raw: bytes) -> str:
        return raw.decode("utf-8", _DECODE_ERRORS)

    @staticmethod
    def _masked(code: int, text: str) -> str:
        if code in _SECRET_CODES:
            return text.partition(":")[0] + ": " + MASK
        return text


def _secrets(request: Request) -> tuple[str, ...]:
    """The remote desktop password as typed and as escaped on the wire."""
    params = getattr(request, "params", None)
    remote = params.remote if params is not None else None
    if remote is None or not remote.password:
        return ()
    return tuple(sorted({escape(remote.password), remote.password}, key=len, reverse=True))


def _field_value(rest: str) -> str:
    """``Session display: 1001`` -> ``1001``."""
    match = _FIELD.match(rest)
    return match.group(1).strip() if match else rest.strip()


def session_info(fields: dict[int, str]) -> SessionInfo:
    """Check and collect the reply block of a start or restore (reference §2.6).

    Raises ValueError with the reason when the block is not usable.
    """
    full_id = fields[700]
    session_id = commands.normalize_session_id(full_id) or full_id.rpartition("-")[2]
    try:
        display = int(fields.get(705, ""))
    except ValueError:
        raise ValueError(f"the server sent no usable display number (NX> 705 {fields.get(705, '')!r})") from None
    proxy_cookie, agent_cookie = fields.get(701), fields.get(706)
    if proxy_cookie and agent_cookie and proxy_cookie != agent_cookie:
        raise ValueError("the server's proxy cookie (NX> 701) and agent cookie (NX> 706) differ")
    cookie = proxy_cookie or agent_cookie
    if not cookie:
        raise ValueError("the server sent no session cookie (NX> 701/706)")
    if fields.get(707, "1") != "1":
        raise ValueError(
            f"the server offers an unencrypted session (NX> 707 SSL tunneling: {fields[707]});"
            " only encrypted sessions are supported"
        )
    return SessionInfo(
        full_id=full_id,
        session_id=session_id,
        display=display,
        cookie=cookie,
        session_type=fields.get(703, ""),
        proxy_ip=fields.get(702, ""),
        status=fields.get(710, ""),
        file_sharing_port=int(fields[709]) if fields.get(709, "").isdigit() else None,
    )


def pick(sessions: tuple[ParsedRow, ...], answer: str) -> ParsedRow | None:
    """The session a user's answer names: its number in the list as shown
    (from 1), or its id (bare or in the ``host-display-ID`` form)."""
    answer = answer.strip()
    if answer.isdigit():
        index = int(answer) - 1
        return sessions[index] if 0 <= index < len(sessions) else None
    session_id = commands.normalize_session_id(answer)
    return next((row for row in sessions if row.session_id == session_id), None)
