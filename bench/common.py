"""What the benchmarks share: progress lines, options, processes' CPU and memory, Redis
(a single server or a Redis Cluster, from the URL alone) and Kafka clean-up.

Every bench runs in namespaces of its own and deletes their topics, consumer groups and Redis
keys when it ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BOOTSTRAP = os.environ.get("COSTLINE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
DEFAULT_REDIS = os.environ.get("COSTLINE_REDIS_URL", "redis://127.0.0.1:6379/0")
# The worker's child processes, by role: the rules' evaluation and the pricing pool.
CHILD_ROLES = {"evaluator": "costline-rules", "pricer": "costline-pricer"}


def log(msg: str) -> None:
    """A progress line on stderr (figures go to stdout)."""
    name = Path(sys.argv[0]).stem or "bench"
    print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def service_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP,
                   help="Kafka (default $COSTLINE_KAFKA_BOOTSTRAP)")
    p.add_argument("--redis-url", default=DEFAULT_REDIS,
                   help="a Redis or a node of a Redis Cluster (default $COSTLINE_REDIS_URL)")


def data_set_options(p: argparse.ArgumentParser, events: int = 1_000_000,
                     kafka: bool = False) -> None:
    """The options of a bench on the generated usage events (``bench/datasets.py``)."""
    p.add_argument("--events", type=int, default=events)
    p.add_argument("--tagsets", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    if kafka:
        service_options(p)
    else:
        p.add_argument("--redis-url", default=DEFAULT_REDIS)


# ── processes ────────────────────────────────────────────────────────────────────────────


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
    """The child processes of ``pid`` whose command name is ``name``."""
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
    """CPU seconds and peak RSS (KiB) of a worker's child processes, summed per role
    (``CHILD_ROLES``): ``evaluator_cpu_s``, ``evaluator_VmHWM``, ``pricer_processes``, ..."""
    out: dict[str, float] = {}
    for role, name in CHILD_ROLES.items():
        children = child_processes(pid, name)
        if children:
            out[f"{role}_cpu_s"] = sum(cpu_seconds(child) for child in children)
            out[f"{role}_VmHWM"] = sum(vm_status(child).get("VmHWM", 0) for child in children)
            out[f"{role}_processes"] = len(children)
    return out


def cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds of a worker process (``worker``) and of its child processes by role."""
    out = {"worker": cpu_seconds(pid)}
    for role, name in CHILD_ROLES.items():
        out[role] = sum(cpu_seconds(child) for child in child_processes(pid, name))
    return out


def worker_cpu_seconds(pid: int) -> float:
    """CPU seconds of a worker process and of its child processes."""
    return sum(cpu_by_role(pid).values())


def machine_jiffies() -> list[int]:
    """The machine's CPU counters (the ``cpu`` line of /proc/stat)."""
    with open("/proc/stat") as fh:
        return [int(x) for x in fh.readline().split()[1:]]


def busy_share(before: list[int], after: list[int]) -> float:
    """Share of the machine's CPUs that were busy between two ``machine_jiffies``."""
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta[:8]) or 1  # user nice system idle iowait irq softirq steal
    return (total - delta[3] - delta[4]) / total


def worker_series(worker: Any) -> list[tuple[str, dict[str, str], float]]:
    """A running worker's /metrics (``COSTLINE_WEB_PORT`` of its environment) as (name,
    labels, value), histogram buckets left out; empty while its web server does not answer."""
    import re
    import urllib.request

    url = f"http://127.0.0.1:{worker.env['COSTLINE_WEB_PORT']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as page:
            text = page.read().decode()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#") or "_bucket" in line:
            continue
        name, _, value = line.rpartition(" ")
        name, _, labels = name.partition("{")
        out.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return out


def worker_metrics(worker: Any) -> dict[str, float]:
    """A running worker's /metrics, labels summed away."""
    out: dict[str, float] = {}
    for name, _, value in worker_series(worker):
        out[name] = out.get(name, 0.0) + value
    return out


# ── Redis ────────────────────────────────────────────────────────────────────────────────


def redis_client(url: str, timeout_s: float = 60.0) -> Any:
    """A client of the Redis at ``url``: a cluster client when it is a node of a Redis
    Cluster (costline's own client factory when it has one)."""
    try:
        from costline.connectors.redis_client import connect  # type: ignore[import-not-found]
    except ImportError:
        from redis import Redis
        from redis.cluster import RedisCluster

        plain = Redis.from_url(url, socket_timeout=timeout_s)
        if plain.info("cluster").get("cluster_enabled") != 1:
            return plain
        plain.close()
        return RedisCluster.from_url(url, socket_timeout=timeout_s)
    return connect(url, timeout_s=timeout_s)


def async_redis_client(url: str, timeout_s: float = 60.0) -> Any:
    """``redis_client``'s asyncio twin, as the worker's batch writer takes it."""
    try:
        from costline.connectors.redis_client import (  # type: ignore[import-not-found]
            connect_async,
        )
    except ImportError:
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster

        probe = redis_client(url, timeout_s)
        cluster = is_cluster(probe)
        probe.close()
        kind = RedisCluster if cluster else Redis
        return kind.from_url(url, socket_timeout=timeout_s)
    return connect_async(url, timeout_s=timeout_s)


def is_cluster(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def redis_cpu_s(client: Any) -> float:
    """CPU seconds the Redis server has used (every primary of a cluster)."""
    if is_cluster(client):
        answers = client.info("cpu", target_nodes=client.PRIMARIES).values()
    else:
        answers = [client.info("cpu")]
    return sum(a["used_cpu_user"] + a["used_cpu_sys"] for a in answers)


def namespace_keys(client: Any, ns: str) -> list[bytes]:
    """Every Redis key of a namespace: ``{NS:...}...`` and ``NS:...``."""
    keys: list[bytes] = []
    for pattern in (f"{{{ns}:*", f"{ns}:*"):
        keys.extend(client.scan_iter(match=pattern, count=5000))
    return keys


def unlink_namespaces(redis_url: str, namespaces: Iterable[str]) -> int:
    """Delete every Redis key of these namespaces; returns how many there were."""
    client = redis_client(redis_url)
    deleted = 0
    try:
        for ns in namespaces:
            keys = namespace_keys(client, ns)
            for i in range(0, len(keys), 1000):
                deleted += client.unlink(*keys[i:i + 1000])
    finally:
        client.close()
    return deleted


def key_kind(key: str) -> str:
    """What a key of the namespace holds, for memory figures (docs/STATE.md lists them)."""
    if ":dd:" in key:
        return "dedup"
    if ":b:" in key:
        return "buckets " + key.split(":b:", 1)[1].split(":", 1)[0]
    if key.endswith(":tagsets"):
        return "tag sets"
    if ":first" in key:
        return "first buckets"
    return "other"


def namespace_memory(redis_url: str, ns: str) -> dict[str, Any]:
    """``MEMORY USAGE`` (exact: ``SAMPLES 0``) of every key of a namespace by kind, the
    distinct tag sets Redis holds (each home partition keeps those of its own events, so a
    tag set is held once per partition it occurs in: ``tagset_entries``), and the events its
    dedup memory remembers."""
    client = redis_client(redis_url)
    try:
        keys = namespace_keys(client, ns)
        used: Counter[str] = Counter()
        count: Counter[str] = Counter()
        tagsets: set[bytes] = set()
        entries = remembered = 0
        for i in range(0, len(keys), 1000):
            chunk = keys[i:i + 1000]
            pipe = client.pipeline(transaction=False)
            for key in chunk:
                pipe.memory_usage(key, samples=0)
            sizes = pipe.execute()
            pipe = client.pipeline(transaction=False)
            counted = []
            for key in chunk:
                text = key.decode()
                if text.endswith(":tagsets"):
                    pipe.hkeys(key)
                    counted.append("tagsets")
                elif ":" in text.partition(":dd:")[2]:
                    pipe.scard(key)  # a dedup table's set (``S:dd:H:i``), not its size
                    counted.append("dedup")
            for what, found in zip(counted, pipe.execute(), strict=True):
                if what == "tagsets":
                    tagsets.update(found)
                    entries += len(found)
                else:
                    remembered += found
            for key, size in zip(chunk, sizes, strict=True):
                kind = key_kind(key.decode())
                used[kind] += size or 0
                count[kind] += 1
    finally:
        client.close()
    return {"keys": len(keys), "bytes": sum(used.values()), "by_kind": dict(used),
            "keys_by_kind": dict(count), "tagsets": len(tagsets), "tagset_entries": entries,
            "dedup_events": remembered}


def redis_total(redis_url: str, ns: str, start: float, end: float) -> int:
    """The namespace's spend over [start, end) as ``costline spend`` reads it, micro-units."""
    from costline.connectors.redis_state import RedisState

    client = redis_client(redis_url)
    try:
        totals = RedisState(client, ns, "UTC").totals("cost", {}, [], start, end)
    finally:
        client.close()
    return sum(totals.values())


def counted(settings: Any, redis: Any) -> bool:
    """Whether everything produced to the namespace's input topics is counted in Redis
    (``costline.streams.progress.behind``); False while Kafka cannot tell yet."""
    from costline.streams.progress import behind

    try:
        return behind(settings, redis).counted
    except Exception as exc:  # noqa: BLE001 - e.g. the group coordinator not ready yet
        log(f"progress: {type(exc).__name__}: {exc}")
        return False


def wait_counted(settings: Any, redis: Any, workers: Iterable[Any], timeout: float,
                 since: float | None = None) -> float:
    """Until everything produced to the namespace's input topics is counted (``counted``,
    asked twice a second); returns when the home partitions' watermarks last moved before
    that (``time.time()``, read every 50 ms): intake commits its offsets only every few
    seconds, the watermarks say when the last events were counted. Raises when one of
    ``workers`` exits or after ``timeout`` seconds."""
    from costline.connectors.redis_keys import slot_tag, wm_key
    from costline.streams.topics import LEDGER, partitions_of

    keys = [wm_key(slot_tag(settings.namespace, p))
            for p in range(partitions_of(settings, LEDGER))]
    started = time.time()
    moved, marks, asked = since or started, None, 0.0
    while True:
        now = time.time()
        pipe = redis.pipeline(transaction=False)  # a cluster client splits it by node
        for key in keys:
            pipe.get(key)
        found = pipe.execute()
        if found != marks:
            marks, moved = found, now
        elif now - asked >= 0.5:
            asked = now
            if counted(settings, redis):
                return moved
        for worker in workers:
            if not worker.alive():
                raise RuntimeError(f"a worker exited; see {worker.log}")
        if now - started > timeout:
            raise RuntimeError(f"{settings.namespace}: not counted after {timeout:.0f}s")
        time.sleep(0.05)


# ── Kafka ────────────────────────────────────────────────────────────────────────────────


def produce(bootstrap: str, topic: str, messages: list[tuple[int, bytes, bytes]],
            label: str) -> float:
    """Send ``(partition, key, value)`` messages with costline's producer settings; returns
    the seconds it took."""
    from costline.connectors.kafka import producer

    prod = producer(bootstrap, client_id="costline-bench")
    started = last = time.perf_counter()
    for sent, (partition, key, value) in enumerate(messages, 1):
        prod.send(topic, value=value, key=key, partition=partition)
        if time.perf_counter() - last > 5:
            last = time.perf_counter()
            log(f"producing {label}: {sent:,}/{len(messages):,} messages")
    prod.flush()
    prod.close()
    took = time.perf_counter() - started
    log(f"produced {label}: {len(messages):,} messages in {took:.1f}s")
    return took


def retried(what: str, step: Any, attempts: int = 15) -> Any:
    """``step()``, again every 2 s while it fails: a consumer group whose last member just
    left may still be closing, a topic just deleted may still be there."""
    for attempt in range(attempts):
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - GroupNotEmpty, a topic being deleted
            if attempt == attempts - 1:
                raise
            log(f"{what}: {type(exc).__name__}: {exc}; again")
            time.sleep(2)
    return None


def forget_kafka(bootstrap: str, ns: str, keep: Iterable[str] = ()) -> None:
    """Delete the consumer groups and topics of a namespace (but the topics in ``keep``),
    and wait until the topics are gone."""
    from costline.connectors.kafka import admin

    client = admin(bootstrap)
    try:
        mine = (f"{ns}.", f"{ns}-")
        groups = [g["group_id"] for g in client.list_groups()
                  if g["group_id"].startswith(mine)]
        if groups:
            retried(f"deleting consumer groups {groups}", lambda: client.delete_groups(groups))
        kept = set(keep)
        topics = [t for t in client.list_topics() if t.startswith(mine) and t not in kept]
        if topics:
            client.delete_topics(topics, raise_errors=False)
            deadline = time.time() + 60
            while set(topics) & set(client.list_topics()) and time.time() < deadline:
                time.sleep(0.2)
    finally:
        client.close()


def forget_namespace(bootstrap: str, redis_url: str, ns: str) -> None:
    """Delete everything of a namespace: topics, consumer groups and Redis keys."""
    try:
        forget_kafka(bootstrap, ns)
    except Exception as exc:  # noqa: BLE001 - clean-up must not hide the figures
        log(f"clean-up of {ns} in Kafka incomplete: {exc}")
    unlink_namespaces(redis_url, [ns])
