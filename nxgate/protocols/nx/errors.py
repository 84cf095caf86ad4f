"""NX reply codes and the exception that carries one.

Every failure the NX client should see is raised as an :class:`NXError`
holding its reply code; one place (the shell core) turns it into
``NX> <code> <text>`` lines.  This keeps handlers free of formatting and
makes the wire text testable in one spot (Neatx's ``lib/protocol.py`` idea).
"""

from __future__ import annotations


class NXError(Exception):
    """A failure with the NX reply code the client must see.

    ``fatal`` errors end the conversation with ``NX> 999 Bye.`` after the
    message; others are followed by a fresh prompt.  ``last_operation_failed``
    adds FreeNX's ``NX> 500 ERROR: Last operation failed.`` line, which makes
    every client notice the failure (Remmina ignores 500 but stops on 5xx
    codes such as 599; OpenNX shows either).
    """

    def __init__(
        self,
        code: int,
        text: str,
        *,
        fatal: bool = False,
        last_operation_failed: bool = False,
    ) -> None:
        super().__init__(f"NX> {code} {text}")
        self.code = code
        self.text = text
        self.fatal = fatal
        self.last_operation_failed = last_operation_failed

    def lines(self) -> list[str]:
        out = [f"NX> {self.code} {self.text}"]
        if self.last_operation_failed:
            out.append("NX> 500 ERROR: Last operation failed.")
        return out


# Codes used by the server (reference §3).  Names say what the client shows.
HELLO_ACCEPTED = 134
USER_PROMPT = 101
PASSWORD_PROMPT = 102
WELCOME = 103
PROMPT = 105
PARAMETERS_PROMPT = 106
SESSION_LIST = 127
CAPACITY_REACHED = 147
CAPACITY_NOT_REACHED = 148
WRONG_LOGIN = 404
GENERIC_ERROR = 500
UNDEFINED_COMMAND = 503
#: The same code, for a failure that says nothing about the request: try again (the server is out of files).
TEMPORARY_FAILURE = 503
WRONG_STATE = 554
SESSION_FAILED = 596
BAD_PARAMETERS = 597
LIMIT_REACHED = 599
BYE = 999


def bad_parameters(params: str) -> NXError:
    return NXError(
        BAD_PARAMETERS, f'Error: Parsing parameters: string "{params}" has invalid format'
    )
