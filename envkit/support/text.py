"""Text read from disk, made safe for a terminal: control characters shown, never obeyed.

A dist-info's METADATA, a run.json or an edited file may hold escape sequences; printed raw, they
recolour, move the cursor or erase lines (an added line could erase itself from doctor's diff).
Human output passes every such string through `printable`; JSON output escapes them already.
"""

from __future__ import annotations

import unicodedata

# Categories that make a terminal act instead of print: C0/C1 controls and format characters (bidi overrides).
_ACTING = ("Cc", "Cf")


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control and format character written as an escape (\\x1b, \\u202e)."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for char in text:
        if (keep_newlines and char in "\n\t") or unicodedata.category(char) not in _ACTING:
            out.append(char)
        else:
            out.append(char.encode("unicode_escape").decode("ascii"))
    return "".join(out)
