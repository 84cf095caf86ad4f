"""The shadow notice: ``shadow_notice.py VIEWER ADDRESS MODE PID STARTED``.

While someone watches (or uses) a session, its owner must be able to see it
and to stop it, as NoMachine shows a notice: this small always-on-top
window on the watched screen says who watches from where, and its "End"
button ends the shadow.  Like the consent dialog (:mod:`consent`) it runs
as the owner, on her display, never as root, with nothing but the
standard library (the gateway runs it by path with ``[shadow]
dialog_python``).

It stays while the shadow's agent lives (``PID`` with its start time
``STARTED``, field 22 of ``/proc/PID/stat``, so a reused pid is not taken
for it) and exits with :data:`GONE` when that agent has ended.  Exit
status :data:`END`: the owner pressed "End" (or closed the window); the
gateway then ends the shadow.  It does not take the keyboard focus: the
owner keeps typing where she was.

The viewer of an interactive shadow can act as the owner's uid, so he can
end or hide this program too: the gateway ends the shadow whenever the
notice ends while the shadow runs, however it ended, and a notice that
was minimised or unmapped shows itself again at its next check.
"""

from __future__ import annotations

import sys

END = 0
GONE = 3
BACKGROUND = "#ffcc00"  # amber: seen at a glance on any desktop (and by the e2e test in the framebuffer)
BUTTON = "#b00000"
CHECK_EVERY_MS = 500


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (clock ticks after boot), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def words(viewer: str, address: str, mode: str) -> str:
    """Short: the notice stays on the screen, over the owner's work, as long as the shadow lasts."""
    what = "watches and can use" if mode == "interactive" else "watches"
    return f"{viewer} ({address}) {what} your screen"


def main(argv: list[str]) -> int:
    if len(argv) != 5 or not argv[3].isdigit() or not argv[4].isdigit():
        print("usage: shadow_notice.py VIEWER ADDRESS MODE PID STARTED", file=sys.stderr)
        return 2
    viewer, address, mode = argv[:3]
    pid, started = int(argv[3]), int(argv[4])
    if start_time(pid) != started:
        return GONE
    import tkinter

    result = {"code": GONE}
    root = tkinter.Tk(className="nxgate-shadow-notice")
    root.title("nxgate: your screen is shared")

    def finish(code: int) -> None:
        result["code"] = code
        root.destroy()

    frame = tkinter.Frame(root, background=BACKGROUND, padx=6, pady=3)
    frame.pack(fill="both", expand=True)
    tkinter.Label(frame, text=words(viewer, address, mode), background=BACKGROUND, justify="left").pack(
        side="left", padx=(0, 6))
    tkinter.Button(frame, text="End", command=lambda: finish(END), background=BUTTON, foreground="white",
                   activebackground=BUTTON, activeforeground="white", takefocus=False, padx=6, pady=0,
                   borderwidth=1).pack(side="left")
    root.protocol("WM_DELETE_WINDOW", lambda: finish(END))

    def check() -> None:
        if start_time(pid) != started:
            finish(GONE)
            return
        if root.state() != "normal" or not root.winfo_ismapped():  # hidden (xdotool as the owner can): shown again
            root.deiconify()
            root.attributes("-topmost", True)
        root.after(CHECK_EVERY_MS, check)

    root.update_idletasks()
    x = max(0, root.winfo_screenwidth() - root.winfo_reqwidth() - 8)
    root.geometry(f"+{x}+8")
    root.attributes("-topmost", True)
    root.after(CHECK_EVERY_MS, check)
    root.mainloop()
    return result["code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
