"""What ``nxgate-admin`` prints for people (pure: JSON answers in, text out).

The admin socket answers in JSON, whose values are booleans, lists and
nulls; printed as they are they read as Python (``False``, ``[]``,
``None``).  Here every value becomes words (``yes``/``no``, ``none``, a
comma-separated list), labels lose their underscores, and the values of a
record line up in one column.  ``--json`` prints the answer itself, for
scripts.
"""

from __future__ import annotations

from typing import Any

#: Shown for a value that is absent: null, an empty string or an empty list.
NONE = "none"


def words(value: Any) -> str:
    """One value as words: yes/no, none, or a comma-separated list."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or value == "" or value == [] or value == {}:
        return NONE
    if isinstance(value, (list, tuple)):
        return ", ".join(words(item) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{label(key)} {words(item)}" for key, item in value.items())
    return str(value)


def label(key: str) -> str:
    return key.replace("_", " ")


def record(fields: dict[str, Any], details: dict[str, list[str]] | None = None) -> str:
    """``label:  value`` lines, the values in one column.  ``details`` maps
    a key to lines shown indented under it instead of its value (when there
    are any; without them the value reads ``none``)."""
    details = {key: lines for key, lines in (details or {}).items() if lines}
    width = max((len(label(key)) for key in fields if key not in details), default=0) + 1
    lines = []
    for key, value in fields.items():
        below = details.get(key)
        if below is not None:
            lines.append(f"{label(key)}:")
            lines.extend(f"  {line}" for line in below)
        else:
            lines.append(f"{(label(key) + ':').ljust(width)}  {words(value)}".rstrip())
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """Rows under their column titles, each column as wide as its widest cell
    (an empty cell shows ``-``: a lone "none" in a column reads as a value)."""
    cells = [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(title), *(len(line[index]) for line in cells)) for index, (_, title) in enumerate(columns)]
    lines = ["  ".join(title.ljust(width) for (_, title), width in zip(columns, widths))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return ",".join(value) or "-"  # one word, so that a column stays one column
    text = words(value)
    return "-" if text == NONE else text


def status(result: dict[str, Any]) -> str:
    """``nxgate-admin status``: the gateway's record, with the agents the
    store did not know and the displays others hold listed under it."""
    unknown = [f"{entry['id']} of {entry['user']} on :{entry['display']} (agent pid {entry['pid']})"
               for entry in result.get("unknown_sessions") or ()]
    held = [f":{entry['display']} held by {', '.join(entry['users'])}: {'; '.join(entry['holds'])}"
            for entry in result.get("held_displays") or ()]
    return record(result, {"unknown_sessions": unknown, "held_displays": held})
