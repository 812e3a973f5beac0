"""Safe YAML with positions: every value can be traced back to ``FILE:LINE:COL``.

Rule files and price books are written by people, so an error must say where it is. The
loader builds plain data only, refuses duplicate keys, and refuses explicit tags and aliases
outright: these files never need them, tags are how YAML asks a loader to build
objects, and aliases are the vehicle of "billion laughs" expansion bombs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    NodeEvent,
)
from ruamel.yaml.reader import ReaderError

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
"""Rule files and price books nest five or six levels; ruamel's scanner slows down
quadratically with flow nesting, and its composer recurses, so deeper is refused early."""
# Line breaks as ruamel's marks count them (YAML 1.2: LF, CR LF and a lone CR).
_LINE_BREAK = re.compile("\r\n|[\n\r]")


@dataclass(frozen=True, slots=True)
class SourceError:
    """One problem in a file, printed as ``FILE:LINE:COL: message`` (1-based)."""

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class SourceInvalid(Exception):
    """A file that cannot be used; carries every problem found in it."""

    def __init__(self, errors: list[SourceError]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class Document:
    """Parsed YAML as plain Python data, plus the node tree that knows the positions."""

    file: str
    data: Any
    tree: Any

    def position(self, loc: tuple[int | str, ...]) -> tuple[int, int]:
        """1-based line and column of the node at ``loc`` (or of its nearest ancestor)."""
        node = self.tree
        line, col = 0, 0
        for step in loc:
            if isinstance(node, CommentedMap) and step in node:
                line, col = node.lc.key(step)
                node = node[step]
            elif isinstance(node, CommentedSeq) and isinstance(step, int) and step < len(node):
                line, col = node.lc.item(step)
                node = node[step]
            else:
                break
        return line + 1, col + 1

    def errors_from(self, exc: ValidationError, base: tuple[int | str, ...] = ()
                    ) -> list[SourceError]:
        """pydantic errors → positioned errors, each naming the field it is about."""
        found = []
        for error in exc.errors(include_url=False, include_context=False):
            loc = base + tuple(error["loc"])
            line, col = self.position(loc)
            field = ".".join(str(p) for p in loc) or "document"
            found.append(SourceError(self.file, line, col, f"{field}: {error['msg']}"))
        return found


def _plain(file: str, node: Any) -> Any:
    """The tree as dicts, lists and scalars; keys as text (``1`` and ``'1'`` are one key)."""
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key, value in node.items():
            text = str(key)
            if text in out:
                line, col = node.lc.key(key)
                raise SourceInvalid([SourceError(file, line + 1, col + 1,
                                                 f"duplicate key {text!r}")])
            out[text] = _plain(file, value)
        return out
    if isinstance(node, CommentedSeq):
        return [_plain(file, v) for v in node]
    return node


def load_document(path: Path | str, text: str | None = None) -> Document:
    """Read and parse one YAML file; raise ``SourceInvalid`` with a position on any problem."""
    name = str(path)
    if text is None:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise SourceInvalid([SourceError(name, 1, 1, f"cannot read: {exc.strerror}")]) from exc
        if len(raw) > MAX_BYTES:
            raise SourceInvalid([SourceError(name, 1, 1, f"larger than {MAX_BYTES} bytes")])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceInvalid([SourceError(name, 1, 1, "not UTF-8 text")]) from exc
    yaml = YAML(typ="rt", pure=True)
    yaml.allow_duplicate_keys = False
    try:
        depth = 0
        for event in yaml.parse(text):
            _refuse_constructs(name, event)
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    raise SourceInvalid([SourceError(
                        name, mark.line + 1, mark.column + 1,
                        f"nested deeper than {MAX_DEPTH} levels")])
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
        tree = yaml.load(text)
        data = _plain(name, tree)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise SourceInvalid([SourceError(name, line, col, problem.strip())]) from exc
    except ReaderError as exc:  # a character YAML does not allow: ruamel gives an offset
        line, col = _line_col(text, exc.position)
        char = exc.character
        code = ord(char) if isinstance(char, bytes) else char
        raise SourceInvalid([SourceError(name, line, col,
                                         f"character #x{code:04x} is not allowed in YAML")]
                            ) from exc
    except SourceInvalid:
        raise
    except Exception as exc:  # ruamel raises a few unmarked errors on odd input
        said = " ".join(str(exc).split())  # one line, whatever ruamel wrote
        raise SourceInvalid([SourceError(name, 1, 1, f"invalid YAML: {said}")]) from exc
    return Document(name, data, tree)


def _line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of the character at ``offset``, counted like ruamel's marks
    (a byte order mark takes no column)."""
    before = _LINE_BREAK.split(text[:offset])
    return len(before), len(before[-1].replace("\ufeff", "")) + 1


def _refuse_constructs(file: str, event: Any) -> None:
    """Aliases and explicit tags have no use in these files and are how YAML expands bombs
    or asks a loader to build objects: refuse them where they stand."""
    problem = None
    if isinstance(event, AliasEvent):
        problem = "YAML aliases are not allowed"
    elif isinstance(event, NodeEvent) and getattr(event, "tag", None):
        problem = f"YAML tags are not allowed ({getattr(event, 'tag', '')})"
    if problem:
        mark = event.start_mark
        raise SourceInvalid([SourceError(file, mark.line + 1, mark.column + 1, problem)])
