"""What the benchmarks share: the generated data's resource types and options, free ports,
process memory."""

from __future__ import annotations

import argparse
import os
import socket

DEFAULT_REDIS = "redis://127.0.0.1:16379/0"

# resource type -> unit of the usage events the benchmarks generate (checked against the
# price book where they are priced).
RESOURCES = {
    "gpu.h100": "gpu_hour",
    "storage.ssd": "gb_hour",
    "network.egress": "gb",
    "logs.ingest": "gb",
}


def data_set_options(p: argparse.ArgumentParser, events: int = 1_000_000) -> None:
    """The options of a bench on the throughput bench's data set, written to Redis."""
    p.add_argument("--events", type=int, default=events)
    p.add_argument("--tagsets", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--redis-url", default=DEFAULT_REDIS)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vm_status(pid: int | str = "self") -> dict[str, int]:
    """VmHWM / VmRSS of a process in KiB (empty if it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of a process, all its threads (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_processes(pid: int, name: str) -> list[int]:
    """The worker's child processes of that command name (``costline-rules`` evaluates the
    rules, ``costline-folder`` folds the aggregation's takes; there may be several)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                children = [int(c) for c in fh.read().split()]
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/comm") as fh:
                    if fh.read().strip() == name:
                        found.append(child)
            except OSError:
                continue
    return found


def child_figures(pid: int) -> dict[str, float]:
    """CPU seconds and peak RSS (KiB) of a worker's evaluation and folding processes, for
    those it has started, summed over the processes of each role: ``evaluator_cpu_s``,
    ``evaluator_VmHWM``, ``folder_cpu_s``, ``folder_VmHWM``, ``folder_processes``, ..."""
    out: dict[str, float] = {}
    for role, name in (("evaluator", "costline-rules"), ("folder", "costline-folder")):
        children = child_processes(pid, name)
        if children:
            out[f"{role}_cpu_s"] = sum(cpu_seconds(child) for child in children)
            out[f"{role}_VmHWM"] = sum(vm_status(child).get("VmHWM", 0) for child in children)
            out[f"{role}_processes"] = len(children)
    return out
