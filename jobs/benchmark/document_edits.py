"""A document's edits, as a user edits a corpus between nights: the edit kinds series-edits (and the
lab's edits) apply to a prompt's document."""

from __future__ import annotations

import argparse
import re

EDITS = ("line", "field", "paragraph")


def edit_kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in EDITS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown edit {unknown or text!r}: choose from {', '.join(EDITS)}")
    return kinds


def edit(prompt: str, kind: str = "line") -> str:
    """The prompt's document edited (its instruction, before the first blank line, kept):
    - line: " (updated)" appended to the line a third of the way in, the line two thirds in deleted;
    - field: one value changed: the first number a third of the way in or later incremented (a
      word appended to that line where there is none);
    - paragraph: five lines from a third of the way in replaced by one new line."""
    lines = prompt.splitlines(keepends=True)
    start = next((i + 1 for i, line in enumerate(lines) if not line.strip()), 0)  # after the instruction
    body = lines[start:]
    if len(body) >= 6:
        third = len(body) // 3
        if kind == "line":
            body[third] = body[third].rstrip("\n") + " (updated)\n"
            del body[2 * third]
        elif kind == "field":
            body = changed_field(body, third)
        else:
            body[third : third + 5] = ["(This part was rewritten.)\n"]
    return "".join(lines[:start] + body)


def changed_field(body: list[str], first: int) -> list[str]:
    """The first number at or after line `first` incremented; without one, " (v2)" on that line."""
    for i in range(first, len(body)):
        match = re.search(r"\d+", body[i])
        if match:
            body[i] = body[i][: match.start()] + str(int(match.group()) + 1) + body[i][match.end() :]
            return body
    body[first] = body[first].rstrip("\n") + " (v2)\n"
    return body
