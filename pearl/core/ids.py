"""Identifiers that name things the runtime builds from them (worker ids, server folders, log lines).

One rule for every id that enters from outside (GPU, node, instance, notice, event ids; the admin
API's schemas and the event door both apply it): 1 to ``IDENT_MAX`` characters from
``[A-Za-z0-9._:@+-]``, dots only between other characters. So no id holds a path separator, ``..``
or a leading dot, and none can break a log line.
"""

from __future__ import annotations

import re

IDENT_PATTERN = r"^[A-Za-z0-9_:@+\-]+(\.[A-Za-z0-9_:@+\-]+)*$"
IDENT_MAX = 128
_IDENT = re.compile(IDENT_PATTERN)


def is_ident(text: str) -> bool:
    """``text`` follows the rule (module docstring)."""
    return 0 < len(text) <= IDENT_MAX and _IDENT.match(text) is not None


def ident_problem(what: str, text: str) -> str | None:
    """None for a valid id; else a sentence naming ``what``, the value and the rule."""
    if is_ident(text):
        return None
    return (f"{what} {text[:IDENT_MAX + 8]!r} is not a valid id: use 1-{IDENT_MAX} characters from "
            "[A-Za-z0-9._:@+-], dots only between other characters (no path separator, no '..')")
