"""The one glob of rule files, ``--where`` and scraper filters: ``*`` stands for any run of
characters (none included), and every other character stands for itself.

Tag values may hold any character, ``?`` and ``[`` among them (``job: sweep[lr=1]``), so
shell-style classes would read such a value as a pattern and match other values. A ``*`` that
is part of the value is written ``\\*``, a backslash before it ``\\\\``.
"""

from __future__ import annotations

import re
from functools import lru_cache

_PIECE = re.compile(r"\\[*\\]|\*|[^*\\]+|\\")


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    parts = []
    for piece in _PIECE.findall(pattern):
        if piece == "*":
            parts.append(".*")
        elif piece.startswith("\\") and len(piece) == 2:
            parts.append(re.escape(piece[1]))
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts), re.DOTALL)


def glob_match(value: str, pattern: str) -> bool:
    """Whether ``value`` is matched by ``pattern``, case-sensitive and whole."""
    if "*" not in pattern and "\\" not in pattern:
        return value == pattern
    return _compiled(pattern).fullmatch(value) is not None


def literal(value: str) -> str:
    """The glob that matches exactly ``value``."""
    return value.replace("\\", "\\\\").replace("*", "\\*")
