"""The process behind ``costline stack up --redis cluster``: it runs the cluster's nodes.

``costline stack`` keeps one process per service and signals its process group to stop it;
this process is that one for a Redis Cluster. It starts every node (``redis-server`` with its
own config file) as its child, makes them one cluster the first time (``redis-cli --cluster
create``, three masters, no replicas) and then watches them:

* a node that exits while the cluster runs is started again from its append-only file after
  a short pause (longer each time it dies soon after a start), as a service manager would;
* SIGTERM (``costline stack down``/``stop``) stops every node, waits for them, and exits;
* the nodes get SIGTERM from the kernel if this process dies without doing so, so they never
  outlive it holding their ports.

Everything is logged to stdout, which the stack appends to the service's log file.

    python -m costline.streams.stack.cluster_supervisor --redis-server PATH --redis-cli PATH \\
        --host 127.0.0.1 NODE-1/redis.conf NODE-2/redis.conf NODE-3/redis.conf
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from costline.streams.stack.cluster import SLOTS, cluster_info

SETUP_TIMEOUT_S = 60.0
POLL_S = 0.2
STOP_GRACE_S = 15.0
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 10.0
# A node that lived this long before it died is started again after the first pause.
STABLE_S = 10.0
_PR_SET_PDEATHSIG = 1


class Stopping(Exception):
    """SIGTERM or SIGINT arrived: stop the nodes and exit."""


@dataclass
class Node:
    """One ``redis-server`` of the cluster and what its restarts have been."""

    config: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    pause_s: float = FIRST_PAUSE_S  # before the next start, should it die soon again
    due_at: float | None = None  # when a dead node is started again

    def url(self, host: str) -> str:
        return f"redis://{host}:{self.port}/0"


class Supervisor:
    """Starts, makes one cluster of, watches and stops the nodes; a signal only sets
    ``stopping``, which the loops look at between their steps."""

    def __init__(self, redis_server: str, redis_cli: str, host: str, nodes: list[Node]) -> None:
        self.redis_server, self.redis_cli, self.host = redis_server, redis_cli, host
        self.nodes = nodes
        self.stopping: str | None = None  # the signal's name

    # -- signals ---------------------------------------------------------------------------

    def on_signal(self, signum: int, _: FrameType | None) -> None:
        self.stopping = signal.Signals(signum).name

    def check(self) -> None:
        if self.stopping:
            say(f"{self.stopping}: stopping the nodes")
            raise Stopping

    # -- nodes -----------------------------------------------------------------------------

    def start(self, node: Node) -> None:
        node.process = subprocess.Popen(
            [self.redis_server, str(node.config)], cwd=node.config.parent,
            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        node.started_at, node.due_at = time.monotonic(), None
        say(f"node on port {node.port}: started (pid {node.process.pid})")

    def wait_until(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready()`` until it is true; a node exiting or the time running out fails."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while not ready():
            self.check()
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise RuntimeError(f"node on port {node.port} exited "
                                       f"({node.process.returncode}) while {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {SETUP_TIMEOUT_S:.0f}s {what}")
            time.sleep(POLL_S)

    def infos(self) -> list[dict[str, str] | None]:
        return [cluster_info(node.url(self.host)) for node in self.nodes]

    # -- the cluster -----------------------------------------------------------------------

    def make_cluster(self) -> None:
        """``redis-cli --cluster create`` on nodes that are each alone and hold no slot; a
        cluster made before (every slot assigned, as ``nodes.conf`` remembers) is kept."""
        infos = [info or {} for info in self.infos()]
        assigned = [int(info.get("cluster_slots_assigned", "0")) for info in infos]
        if all(count == SLOTS for count in assigned):
            say("cluster: made before, every slot assigned")
            return
        alone = all(info.get("cluster_known_nodes") == "1" and count == 0
                    for info, count in zip(infos, assigned, strict=True))
        if not alone:
            folders = ", ".join(str(node.config.parent) for node in self.nodes)
            raise RuntimeError(
                f"the nodes hold part of a cluster ({min(assigned)}-{max(assigned)} of "
                f"{SLOTS} slots assigned): remove {folders} to make a new one")
        addresses = [f"{self.host}:{node.port}" for node in self.nodes]
        say(f"cluster: creating it on {' '.join(addresses)}")
        done = subprocess.run(
            [self.redis_cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"], stdin=subprocess.DEVNULL, timeout=SETUP_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed (exit {done.returncode})")

    def setup(self) -> None:
        for node in self.nodes:
            self.start(node)
        self.wait_until("loading its data",
                        lambda: all(info is not None for info in self.infos()))
        self.make_cluster()
        self.wait_until("waiting for cluster_state:ok",
                        lambda: all((info or {}).get("cluster_state") == "ok"
                                    for info in self.infos()))
        say("cluster: ok")

    def watch(self) -> None:
        """Start again each node that exits, after its pause, until told to stop."""
        while True:
            self.check()
            now = time.monotonic()
            for node in self.nodes:
                process = node.process
                if process is not None and process.poll() is not None:
                    self.node_exited(node, process.returncode, now)
                if node.due_at is not None and now >= node.due_at:
                    self.start(node)
            time.sleep(POLL_S)

    def node_exited(self, node: Node, code: int, now: float) -> None:
        node.process = None
        lived = now - node.started_at
        pause = FIRST_PAUSE_S if lived >= STABLE_S else node.pause_s
        node.pause_s = min(pause * 2, LONGEST_PAUSE_S)
        node.due_at = now + pause
        say(f"node on port {node.port}: exited ({code}) after {lived:.1f}s; starting it "
            f"again from its append-only file in {pause:.1f}s")

    def stop(self) -> None:
        """SIGTERM every node still running (the stack signals the whole group, so they may
        have it already), wait, then SIGKILL what is left."""
        running = [n.process for n in self.nodes if n.process and n.process.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"node pid {process.pid}: did not stop in time, killing it")
                process.kill()
                process.wait()


def _die_with_parent() -> None:
    """In the node's process before exec: SIGTERM when the supervisor dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def say(message: str) -> None:
    print(f"[costline cluster supervisor] {message}", flush=True)


def _port(config: Path) -> int:
    for line in config.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "port":
            return int(value)
    raise ValueError(f"{config} names no port")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-server", required=True)
    parser.add_argument("--redis-cli", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("configs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    nodes = [Node(config, _port(config)) for config in args.configs]
    supervisor = Supervisor(args.redis_server, args.redis_cli, args.host, nodes)
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    signal.signal(signal.SIGINT, supervisor.on_signal)
    status = 0
    try:
        supervisor.setup()
        supervisor.watch()
    except Stopping:
        pass
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        say(f"error: {exc}")
        status = 1
    finally:
        supervisor.stop()
    say("stopped")
    return status


if __name__ == "__main__":
    sys.exit(main())
