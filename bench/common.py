"""What the benchmarks share: the generated data's resource types, free ports, process memory."""

from __future__ import annotations

import socket

# resource type -> unit of the usage events the benchmarks generate (checked against the
# price book where they are priced).
RESOURCES = {
    "gpu.h100": "gpu_hour",
    "storage.ssd": "gb_hour",
    "network.egress": "gb",
    "logs.ingest": "gb",
}


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
