"""The one error the local stack raises: its message tells the user what to do next."""

from __future__ import annotations


class StackError(RuntimeError):
    """A local service could not be prepared, started, found or stopped."""


class ExitedWhileStarting(StackError):
    """A service's process ended before it answered (its log may say why, or be empty)."""

    def __init__(self, service: str, log: str, tail: str) -> None:
        super().__init__(f"{service} exited while starting; see {log}:\n{tail}")
        self.service, self.log = service, log
