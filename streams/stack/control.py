"""Bring a local stack up, report on it, stop and restart its services, take it down.

Every operation works on one state folder and only on what that folder's pid files describe,
so it never stops a process it did not start. ``up`` is all or nothing: when one service
fails to answer, the ones this call started are stopped again and the error names the log.
A service whose process ends while starting is started once more (``START_ATTEMPTS``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from costline.streams.stack.errors import ExitedWhileStarting, StackError
from costline.streams.stack.layout import Layout
from costline.streams.stack.process import (
    ProcessRecord,
    free_port,
    is_running,
    log_tail,
    port_taken,
    read_record,
    spawn_detached,
    terminate,
    wait_until,
    write_json,
)
from costline.streams.stack.services import NONE, SERVICES, Service, service_for

Report = Callable[[str], None]
LOOPBACK = "127.0.0.1"
# A process that ends before it answers is started once more. A port picked as free can be
# taken before the service binds it (outgoing connections draw from the same ephemeral range),
# and a start that dies at once is not worth failing a whole ``up`` for; a service that fails
# twice is reported with both attempts in its log.
START_ATTEMPTS = 2


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class ServiceSpec:
    """How a service was started, kept while it is stopped so ``start`` can bring it back."""

    name: str
    role: str
    flavor: str
    host: str
    port: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    endpoint: str
    exports: dict[str, str]
    log: str

    @classmethod
    def of(cls, service: Service) -> ServiceSpec:
        return cls(
            name=service.name, role=service.role, flavor=service.flavor, host=service.host,
            port=service.port, argv=tuple(service.argv()), env=service.env(),
            cwd=str(service.data_dir), endpoint=service.endpoint(), exports=service.exports(),
            log=str(service.log_file),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ServiceSpec:
        data = json.loads(text)
        data["argv"] = tuple(data["argv"])
        return cls(**data)

    def service(self, layout: Layout) -> Service:
        return SERVICES[self.name](layout, self.host, self.port)


@dataclass(frozen=True)
class ServiceState:
    """What ``status`` reports for one service."""

    name: str
    role: str
    flavor: str
    endpoint: str
    pid: int | None
    state: str  # "running", "not answering" or "stopped"
    log: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class StackInfo:
    """The services of a stack and the environment that reaches them."""

    services: list[ServiceState]
    exports: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"services": [s.as_dict() for s in self.services], "exports": self.exports}


# -- the state folder ----------------------------------------------------------------------


def _specs(layout: Layout) -> Iterator[ServiceSpec]:
    if not layout.run_dir.is_dir():
        return
    for path in sorted(layout.run_dir.glob("*.json")):
        try:
            yield ServiceSpec.from_json(path.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            continue


def _record(layout: Layout, name: str) -> ProcessRecord | None:
    """The live process of ``name``; a pid file whose process is gone is removed."""
    path = layout.pid_file(name)
    record = read_record(path)
    if record is not None and is_running(record):
        return record
    path.unlink(missing_ok=True)
    return None


def _state(layout: Layout, spec: ServiceSpec) -> ServiceState:
    record = _record(layout, spec.name)
    if record is None:
        state = "stopped"
    else:
        state = "running" if spec.service(layout).answers() else "not answering"
    return ServiceState(spec.name, spec.role, spec.flavor, spec.endpoint,
                        record.pid if record else None, state, spec.log)


def _exports(layout: Layout, specs: list[ServiceSpec]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for spec in specs:
        merged.update(spec.exports)
    merged["COSTLINE_STATE_DIR"] = str(layout.root)
    return merged


def _find(layout: Layout, which: str) -> ServiceSpec:
    """A service of this stack by name (``valkey``) or by role (``redis``)."""
    for spec in _specs(layout):
        if which in (spec.name, spec.role):
            return spec
    raise StackError(f"no service {which!r} in the stack at {layout.root}")


# -- starting ------------------------------------------------------------------------------


def _check_ports(service: Service) -> None:
    for port in service.ports():
        if port_taken(service.host, port):
            raise StackError(
                f"port {port} on {service.host} is already in use by a process this stack did "
                f"not start; stop it or choose another port for {service.role} "
                f"(--{service.role}-port)"
            )


def _launch(layout: Layout, spec: ServiceSpec) -> ProcessRecord:
    record = spawn_detached(list(spec.argv), cwd=Path(spec.cwd), log=Path(spec.log), env=spec.env)
    write_json(layout.spec_file(spec.name), spec.to_json())
    write_json(layout.pid_file(spec.name), record.to_json())
    return record


def _await(service: Service, record: ProcessRecord, report: Report) -> None:
    """Wait for a real protocol answer; fail fast when the process dies meanwhile."""
    began = time.monotonic()
    wait_until(lambda: service.answers() or not is_running(record), service.start_timeout_s, 0.2)
    log = service.log_file
    if not is_running(record):
        raise ExitedWhileStarting(service.name, str(log), log_tail(log))
    if not service.answers():
        raise StackError(
            f"{service.name} did not answer on {service.endpoint()} within "
            f"{service.start_timeout_s:.0f}s; see {log}:\n{log_tail(log)}"
        )
    report(f"{service.name}: ready on {service.endpoint()} in {time.monotonic() - began:.1f}s")


@dataclass
class _Plan:
    service: Service
    running: ProcessRecord | None


def _plan(layout: Layout, cls: type[Service], port: int, host: str) -> _Plan:
    """Reuse what already runs for this role, or decide the port of a fresh start."""
    for spec in _specs(layout):
        if spec.role != cls.role:
            continue
        record = _record(layout, spec.name)
        if record is None:
            if spec.name != cls.name:  # a stopped service of another flavor: forget it
                layout.spec_file(spec.name).unlink(missing_ok=True)
            continue
        if spec.name != cls.name:
            raise StackError(
                f"{cls.role} already runs here as {spec.name} ({spec.flavor}) on {spec.endpoint}; "
                f"run `costline stack down` first to switch to {cls.flavor}"
            )
        if port not in (0, spec.port):
            raise StackError(
                f"{spec.name} already runs on port {spec.port}; run `costline stack down` "
                f"first to move it to {port}"
            )
        return _Plan(cls(layout, spec.host, spec.port), record)
    if port == 0:
        port = free_port(host, span=len(cls(layout, host, 0).ports()))
    return _Plan(cls(layout, host, port), None)


def up(
    state_dir: Path,
    *,
    kafka: str = "embedded",
    redis: str = "embedded",
    kafka_port: int = 9092,
    redis_port: int = 6379,
    kafka_libs: Path | None = None,
    host: str = LOOPBACK,
    report: Report = _quiet,
) -> StackInfo:
    """Start Kafka and Redis (or reuse them if they already run here) and wait for answers.

    A port of 0 picks a free one; a flavor of ``none`` leaves that role out (say, a local
    Redis Cluster beside a Kafka of one's own). Raises ``StackError`` with the reason and the
    log to read.
    """
    layout = Layout.of(state_dir, kafka_libs)
    wanted = [(service_for(role, flavor), port)
              for role, flavor, port in (("kafka", kafka, kafka_port), ("redis", redis, redis_port))
              if flavor != NONE]
    with layout.locked():
        layout.create()
        for attempt in range(1, START_ATTEMPTS + 1):
            plans = [_plan(layout, cls, port, host) for cls, port in wanted]
            for plan in plans:
                if plan.running is None:
                    _check_ports(plan.service)
            try:
                _start_all(layout, plans, report)
                break
            except ExitedWhileStarting as error:
                if attempt == START_ATTEMPTS:
                    raise
                report(f"{error.service} exited while starting (see {error.log}); "
                       "starting once more")
        specs = [_spec_of(layout, plan.service.name) for plan in plans]
        return StackInfo([_state(layout, spec) for spec in specs], _exports(layout, specs))


def _spec_of(layout: Layout, name: str) -> ServiceSpec:
    return ServiceSpec.from_json(layout.spec_file(name).read_text())


def _start_all(layout: Layout, plans: list[_Plan], report: Report) -> None:
    """Spawn every missing service, then wait for all; undo this call's starts on failure."""
    started: list[tuple[ServiceSpec, ProcessRecord]] = []
    try:
        waiting: list[tuple[Service, ProcessRecord]] = []
        for plan in plans:
            service = plan.service
            if plan.running is not None:
                report(f"{service.name}: already running (pid {plan.running.pid}) "
                       f"on {service.endpoint()}")
                continue
            report(f"{service.name}: starting on {service.endpoint()} (log {service.log_file})")
            service.prepare()
            spec = ServiceSpec.of(service)
            record = _launch(layout, spec)
            started.append((spec, record))
            waiting.append((service, record))
        for service, record in waiting:
            _await(service, record, report)
    except BaseException:
        _undo(layout, started)
        raise


def _undo(layout: Layout, started: list[tuple[ServiceSpec, ProcessRecord]]) -> None:
    terminate([record for _, record in started], grace_s=10.0)
    for spec, _ in started:
        layout.pid_file(spec.name).unlink(missing_ok=True)
        layout.spec_file(spec.name).unlink(missing_ok=True)


# -- the other verbs -----------------------------------------------------------------------


def status(state_dir: Path) -> StackInfo:
    """Every service this folder knows, whether it runs and answers, and the exports."""
    layout = Layout.of(state_dir)
    specs = list(_specs(layout))
    states = [_state(layout, spec) for spec in specs]
    running = [spec for spec, st in zip(specs, states, strict=True) if st.pid is not None]
    return StackInfo(states, _exports(layout, running) if running else {})


def down(state_dir: Path, report: Report = _quiet) -> list[ServiceState]:
    """Stop every service this folder started (SIGTERM, then SIGKILL) and forget it.

    Data, logs and cached jars stay, so the next ``up`` of the Apache broker keeps its topics.
    """
    layout = Layout.of(state_dir)
    with layout.locked():
        specs = list(_specs(layout))
        records = {spec.name: _record(layout, spec.name) for spec in specs}
        terminate([r for r in records.values() if r is not None])
        stopped = []
        for spec in specs:
            record = records[spec.name]
            layout.pid_file(spec.name).unlink(missing_ok=True)
            layout.spec_file(spec.name).unlink(missing_ok=True)
            if record is not None:
                report(f"{spec.name}: stopped (pid {record.pid})")
            stopped.append(ServiceState(spec.name, spec.role, spec.flavor, spec.endpoint,
                                        record.pid if record else None, "stopped", spec.log))
        return stopped


def stop(state_dir: Path, which: str) -> ServiceState:
    """Stop one service (by name or role) but remember it, so ``start`` can bring it back."""
    layout = Layout.of(state_dir)
    with layout.locked():
        spec = _find(layout, which)
        record = _record(layout, spec.name)
        if record is not None:
            terminate([record])
        layout.pid_file(spec.name).unlink(missing_ok=True)
        return _state(layout, spec)


def start(state_dir: Path, which: str, report: Report = _quiet) -> ServiceState:
    """Start a stopped service again with its recorded command line, port and data."""
    layout = Layout.of(state_dir)
    with layout.locked():
        spec = _find(layout, which)
        if _record(layout, spec.name) is None:
            service = spec.service(layout)
            _check_ports(service)
            record = _launch(layout, spec)
            try:
                _await(service, record, report)
            except BaseException:
                _undo(layout, [(spec, record)])
                write_json(layout.spec_file(spec.name), spec.to_json())
                raise
        return _state(layout, spec)


def restart(state_dir: Path, which: str, report: Report = _quiet) -> ServiceState:
    """Stop and start one service, e.g. to test that consumers survive a broker restart."""
    stop(state_dir, which)
    return start(state_dir, which, report)
