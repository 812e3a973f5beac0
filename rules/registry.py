"""A registry: one family of plug-ins, each a class registered under the name rule files use.

Borrowed from Cloud Custodian: a plug-in (a rule kind, a reclaim connector) is one decorated
class in one file, and everything that lists the family — the loader, the JSON Schema, Slack
rendering, the reference docs, the tests — walks its registry instead of keeping a list of
its own. ``discover`` imports every module of the family's package, so a new file is all it
takes: there is no list of imports to edit, and a registry is complete as soon as the
package that owns it is imported, whatever else was or was not imported.

Every registered class documents itself: its docstring's first paragraph says what it is
for, and a fenced YAML block holds a complete rule file using it, which the tests load.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C", bound=type[Any])

_EXAMPLE = re.compile(r"```yaml\n(.*?)```", re.DOTALL)


class Registry(Mapping[str, type[T]], Generic[T]):
    """Names → classes of one family (``family`` names it in messages), each a ``base``
    (``T``; passed again because an abstract base cannot be a ``type[T]`` argument)."""

    def __init__(self, family: str, base: type[Any]) -> None:
        self.family = family
        self.base = base
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: register the class under ``name``, once."""

        def add(cls: C) -> C:
            plugin: type[Any] = cls
            if name in self._classes:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            if not issubclass(plugin, self.base):
                raise TypeError(f"{plugin.__name__} is not a {self.base.__name__}")
            if example_of(plugin) is None:
                raise TypeError(f"{plugin.__name__} needs a docstring with a ```yaml example")
            self._classes[name] = plugin
            return cls

        return add

    def discover(self, package: str, path: Iterable[str]) -> None:
        """Import every module of ``package`` (found on ``path``) whose name does not start
        with ``_``: each registers its plug-ins as it is imported."""
        for module in pkgutil.iter_modules(list(path)):
            if not module.name.startswith("_"):
                importlib.import_module(f"{package}.{module.name}")

    def unknown(self, name: object) -> str:
        """The message for a name nothing is registered under."""
        known = ", ".join(self) or "none"
        return f"unknown {self.family} {name!r} (known: {known})"

    def __getitem__(self, name: str) -> type[T]:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}: {', '.join(self)})"


def example_of(cls: type[Any]) -> str | None:
    """The YAML example in a plug-in's docstring: a complete rule file."""
    found = _EXAMPLE.search(inspect.cleandoc(cls.__doc__ or ""))
    return textwrap.dedent(found.group(1)) if found else None


def summary_of(cls: type[Any]) -> str:
    """The first paragraph of a plug-in's docstring, on one line."""
    first = inspect.cleandoc(cls.__doc__ or "").split("\n\n", 1)[0]
    return " ".join(first.split())
