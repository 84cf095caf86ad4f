"""The session cupsd's backend for X2Go's printer (``nxgate-x2go-print``): a
job goes to the X2Go client as x2goserver delivers it.

The X2Go client shares its print spool directory; the session mounts it
(:mod:`nxgate.node.services.x2go_folders`) and the session's own cupsd has a
queue whose device is ``x2go:<that mount point>``
(:mod:`nxgate.node.services.printing`).  CUPS converts what is printed to PDF
(the queue's PPD asks for PDF) and runs this backend, as the session's user,
with the PDF.  The client polls its spool for ``*.ready`` files: each names
a PDF beside it and the job's title, and the client then prints it, shows
it or saves it (python-x2go's print actions, x2goclient's dialog).  So the
PDF is written first, under its final name, and then the ``.ready`` file,
written as ``.notready`` and renamed (one rename on the client's side, so the
client never reads half a line).

A job larger than the cap (``NXGATE_X2GO_MAX_JOB`` bytes, from the queue's
environment) is refused whole: nothing reaches the client, the job is
cancelled with words CUPS shows (``lpstat``, print dialogs), and the line
goes to the session's job log, which the gateway's log repeats.  Exit codes
are CUPS's: 0 done, 4 stop the queue (no spool: the client is gone), 5
cancel the job.
"""

from __future__ import annotations

import os
import secrets
import sys
import time

CUPS_BACKEND_OK = 0
CUPS_BACKEND_FAILED = 1
CUPS_BACKEND_STOP = 4
CUPS_BACKEND_CANCEL = 5
CHUNK = 1024 * 1024
DEFAULT_MAX_JOB = 100 * 1024 * 1024
#: The job log beside cupsd's configuration (its directory is the ServerRoot).
JOB_LOG = "x2go-jobs.log"


def ready_text(pdf_name: str, title: str) -> bytes:
    """The ``.ready`` file: the PDF's name and the job's title, one line each (as x2goprint writes it)."""
    clean = "".join(char if char.isprintable() else " " for char in title)[:200] or "X2Go print job"
    return f"{pdf_name}\n{clean}".encode("utf-8", "replace")


def pdf_name(job: str, user: str, token: str) -> str:
    """The PDF's name in the spool: x2goserver's shape (``<job>-<user>-cupsjob…``), nothing from the title."""
    safe_job = "".join(char for char in job if char.isalnum())[:12] or "0"
    safe_user = "".join(char for char in user if char.isalnum())[:32] or "user"
    return f"{safe_job}-{safe_user}-cupsjob{token}.pdf"


def spool_of(uri: str) -> str | None:
    """The spool directory a device URI names (``x2go:/path``), or None."""
    if not uri.startswith("x2go:/"):
        return None
    path = uri[len("x2go:"):]
    while path.startswith("//"):
        path = path[1:]
    return path if ".." not in path.split("/") else None


def _note(line: str) -> None:
    """One line to the session's job log (the gateway repeats it); nothing if it cannot be written."""
    directory = os.environ.get("CUPS_SERVERROOT", "")
    if not directory:
        return
    try:
        fd = os.open(os.path.join(directory, JOB_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        os.write(fd, (line.replace("\n", " ")[:400] + "\n").encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _say(level: str, text: str) -> None:
    sys.stderr.write(f"{level}: {text}\n")
    sys.stderr.flush()


def deliver(spool: str, job: str, user: str, title: str, source: int, cap: int) -> tuple[int, str]:
    """Copy the PDF read from ``source`` into ``spool`` and mark it ready; (exit code, what happened)."""
    if not os.path.isdir(spool):
        return CUPS_BACKEND_STOP, f"the X2Go client's spool {spool} is not there (the client went or shares none)"
    name = pdf_name(job, user, secrets.token_hex(8))
    target = os.path.join(spool, name)
    size = 0
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        return CUPS_BACKEND_FAILED, f"cannot write into the X2Go client's spool: {error.strerror}"
    try:
        while True:
            chunk = os.read(source, CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise OverflowError
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
    except OverflowError:
        os.close(fd)
        os.unlink(target)
        return CUPS_BACKEND_CANCEL, (f"job {job} ({title[:80]!r}) refused: larger than {cap // (1024 * 1024)} MB, the"
                                     " most a job may send to the X2Go client; nothing was sent")
    except OSError as error:
        os.close(fd)
        os.unlink(target)
        return CUPS_BACKEND_FAILED, f"job {job}: writing into the X2Go client's spool failed: {error.strerror}"
    os.close(fd)
    notready = os.path.join(spool, name + ".notready")
    with open(notready, "wb") as handle:
        handle.write(ready_text(name, title))
    os.rename(notready, os.path.join(spool, name + ".ready"))
    return CUPS_BACKEND_OK, f"job {job} ({title[:80]!r}, {size} bytes of PDF) is in the X2Go client's spool as {name}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv if argv is None else argv
    if len(args) == 1:  # CUPS asks which devices this backend finds: none of its own
        return CUPS_BACKEND_OK
    if len(args) not in (6, 7):
        _say("ERROR", "usage: x2go job-id user title copies options [file]")
        return CUPS_BACKEND_FAILED
    job, user, title = args[1], args[2], args[3]
    spool = spool_of(os.environ.get("DEVICE_URI", ""))
    try:
        cap = int(os.environ.get("NXGATE_X2GO_MAX_JOB", DEFAULT_MAX_JOB))
    except ValueError:
        cap = DEFAULT_MAX_JOB
    if spool is None:
        _say("ERROR", "not an x2go: device")
        return CUPS_BACKEND_STOP
    source = os.open(args[6], os.O_RDONLY) if len(args) == 7 else 0
    started = time.monotonic()
    code, what = deliver(spool, job, user, title, source, cap)
    _say("INFO" if code == CUPS_BACKEND_OK else "ERROR", what)
    if code == CUPS_BACKEND_OK:
        what += f" in {time.monotonic() - started:.2f} s"
    _note(("delivered: " if code == CUPS_BACKEND_OK else "refused: ") + what)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
