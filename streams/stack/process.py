"""Detached service processes, the pid files that remember them, and loopback port checks.

A service must outlive the ``costline stack up`` that started it, so it is spawned by a
throw-away launcher in a new session: it is never our child, so nothing of ours has to reap
it, and a terminal's Ctrl-C does not reach it. A pid file records the pid, the exact command line
and the kernel's start time of the process; a process is only ever signalled when all three
still match, so a recycled pid that now belongs to something else is never hit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from costline.streams.stack.errors import StackError

_LAUNCHER = """\
import subprocess, sys
log, cwd, *argv = sys.argv[1:]
with open(log, "ab", buffering=0) as out:
    child = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
    print(child.pid, flush=True)
"""


@dataclass(frozen=True)
class ProcessRecord:
    """Enough to recognise one process again: pid, command line and kernel start time."""

    pid: int
    argv: tuple[str, ...]
    start_ticks: int

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "argv": self.argv, "start_ticks": self.start_ticks})

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        data = json.loads(text)
        return cls(int(data["pid"]), tuple(data["argv"]), int(data["start_ticks"]))


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (which may contain spaces)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0")[:-1])


def _reap(pid: int) -> None:
    """Collect an exited child of ours, if it is one, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_running(record: ProcessRecord) -> bool:
    """True while the very process the record describes is alive (zombies count as dead)."""
    fields = _stat_fields(record.pid)
    if fields is None:
        return False
    state, start_ticks = fields[0], int(fields[19])
    if state in ("Z", "X"):
        _reap(record.pid)
        return False
    return start_ticks == record.start_ticks and _cmdline(record.pid) == record.argv


def spawn_detached(
    argv: list[str], *, cwd: Path, log: Path, env: Mapping[str, str] | None = None
) -> ProcessRecord:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log``.

    ``env`` adds to (does not replace) this process's environment.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    launched = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, str(log), str(cwd), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    if launched.returncode != 0:
        raise StackError(f"could not start {argv[0]}: {launched.stderr.strip()[-500:]}")
    pid = int(launched.stdout.strip())
    fields = _stat_fields(pid)
    return ProcessRecord(pid=pid, argv=tuple(argv), start_ticks=int(fields[19]) if fields else 0)


def _signal(record: ProcessRecord, sig: signal.Signals) -> None:
    """Signal the process group the service leads (it may have helpers), never anything else."""
    if not is_running(record):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)


def terminate(records: Iterable[ProcessRecord], grace_s: float = 20.0) -> None:
    """SIGTERM every process, wait up to ``grace_s`` for a clean exit, then SIGKILL the rest."""
    pending = [record for record in records if is_running(record)]
    for record in pending:
        _signal(record, signal.SIGTERM)
    wait_until(lambda: not any(is_running(r) for r in pending), grace_s)
    stubborn = [record for record in pending if is_running(record)]
    for record in stubborn:
        _signal(record, signal.SIGKILL)
    if not wait_until(lambda: not any(is_running(r) for r in stubborn), 10.0):
        pids = ", ".join(str(r.pid) for r in stubborn if is_running(r))
        raise StackError(f"process(es) {pids} survived SIGKILL")


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``check`` until it is true or ``timeout_s`` has passed; return its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def read_record(path: Path) -> ProcessRecord | None:
    try:
        return ProcessRecord.from_json(path.read_text())
    except (OSError, ValueError, KeyError):
        return None


def write_json(path: Path, text: str) -> None:
    """Write atomically so a crash never leaves half a pid file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


def port_taken(host: str, port: int) -> bool:
    """True when something already listens on (or holds) ``host:port``.

    A bind test rather than a connect: it also catches a socket bound without listening,
    and ``SO_REUSEADDR`` (which the services use too) ignores leftover TIME_WAIT connections.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str, span: int = 1) -> int:
    """A port such that ``port .. port+span-1`` are all free on ``host`` right now."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port + span <= 65536 and not any(port_taken(host, port + i) for i in range(1, span)):
            return port
    raise StackError(f"found no {span} consecutive free ports on {host}")


def log_tail(path: Path, lines: int = 15) -> str:
    """The end of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log yet)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(log is empty)"
