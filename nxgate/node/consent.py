"""The consent dialog: ``python -m nxgate.node.consent VIEWER ADDRESS MODE NAME``.

It runs as the owner of the session, on her display (never as root), and
asks whether VIEWER may watch.  Exit status 0 means "allow", 3 "refuse";
anything else (1: Python's own, when the dialog could not open) means the
owner was never asked, which the gateway must not report as her refusal.
The gateway kills it when the owner does not answer in time.
Keyboard: ``a`` allows, ``r`` or Escape refuses, Tab moves between the
buttons and Return presses the focused one (Refuse has the focus first).
"""

from __future__ import annotations

import sys

ALLOW = 0
REFUSE = 3  # not 1: an exception (no display) exits with 1, and that is no answer of the owner's


def main(argv: list[str]) -> int:
    viewer, address, mode, name = (argv + ["?"] * 4)[:4]
    import tkinter

    result = {"code": REFUSE}
    root = tkinter.Tk(className="nxgate-consent")
    root.title("nxgate: shadowing request")

    def answer(code: int) -> None:
        result["code"] = code
        root.destroy()

    what = "watch and use" if mode == "interactive" else "watch"
    text = (f"{viewer} (from {address}) asks to {what} your session\n\"{name}\".\n\n"
            "Allow this?")
    tkinter.Label(root, text=text, justify="left", padx=20, pady=16).pack()
    buttons = tkinter.Frame(root, pady=10)
    buttons.pack()
    allow = tkinter.Button(buttons, text="Allow (a)", width=12, command=lambda: answer(ALLOW))
    refuse = tkinter.Button(buttons, text="Refuse (r)", width=12, command=lambda: answer(REFUSE))
    allow.pack(side="left", padx=8)
    refuse.pack(side="left", padx=8)
    for key in ("a", "A"):
        root.bind(key, lambda _e: answer(ALLOW))
    for key in ("r", "R", "<Escape>"):
        root.bind(key, lambda _e: answer(REFUSE))
    root.bind("<Return>", lambda _e: root.focus_get().invoke() if hasattr(root.focus_get(), "invoke") else None)
    root.protocol("WM_DELETE_WINDOW", lambda: answer(REFUSE))
    root.update_idletasks()
    width, height = root.winfo_reqwidth(), root.winfo_reqheight()
    x = (root.winfo_screenwidth() - width) // 2
    y = (root.winfo_screenheight() - height) // 3
    root.geometry(f"+{x}+{y}")
    root.attributes("-topmost", True)
    refuse.focus_set()
    root.after(100, root.focus_force)
    root.mainloop()
    return result["code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
