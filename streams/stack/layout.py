"""The state folder of a local stack: where pid files, logs, data and cached jars live.

One folder holds everything a stack started, so ``down`` can find exactly its own processes
and two stacks in two folders (say, a developer's and a test's) never touch each other.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """Paths inside one state folder."""

    root: Path
    kafka_libs: Path

    @classmethod
    def of(cls, state_dir: Path, kafka_libs: Path | None = None) -> Layout:
        root = state_dir.expanduser().absolute()
        libs = kafka_libs.expanduser().absolute() if kafka_libs else root / "kafka-libs"
        return cls(root=root, kafka_libs=libs)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def data_dir(self, service: str) -> Path:
        return self.root / "data" / service

    def spec_file(self, service: str) -> Path:
        """What was started and how (kept while the service is stopped, for ``start``)."""
        return self.run_dir / f"{service}.json"

    def pid_file(self, service: str) -> Path:
        """The running process (removed when it is stopped)."""
        return self.run_dir / f"{service}.pid"

    def log_file(self, service: str) -> Path:
        return self.log_dir / f"{service}.log"

    def create(self) -> None:
        for folder in (self.run_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Serialize ``up``/``down``/``start``/``stop`` on this folder across processes."""
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / ".lock"):
            yield


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock held for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
