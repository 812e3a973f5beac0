"""``costline worker``: run the stream processors in the foreground."""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import typer

from costline.streams.cli import command_group

if TYPE_CHECKING:
    from costline.connectors.kafka_security import KafkaSecurity
    from costline.streams.settings import Settings

STARTUP_S = 120.0


def _until_kafka_answers(bootstrap: str, step: Callable[[], object]) -> None:
    """Run ``step`` once Kafka answers; a worker started while the broker is away (a restart,
    an upgrade) waits for it rather than exiting. Once running, Faust reconnects by itself."""
    from kafka.errors import KafkaError

    from costline.connectors.kafka import KafkaUnavailable, TopicError

    _until_answers(f"Kafka at {bootstrap}", step,
                   (KafkaUnavailable, TopicError, KafkaError, OSError))


def _until_answers(what: str, step: Callable[[], object],
                   away: tuple[type[BaseException], ...],
                   final: tuple[type[BaseException], ...] = ()) -> None:
    """Run ``step``, waiting with backoff while it fails with one of ``away``; one of ``final``
    (which may subclass them, as a refused login does) is raised at once."""
    delay = 0.5
    while True:
        try:
            step()
            return
        except final:
            raise
        except away as exc:
            typer.echo(f"costline worker: waiting for {what}: {exc}", err=True)
        time.sleep(delay)
        delay = min(delay * 2, 10.0)


def claim_bucket_zone(settings: Settings) -> None:
    """Record the zone this worker names daily buckets in, or exit if the namespace's buckets
    are named in another (``costline.connectors.bucket_zone``). Waits for Redis like for Kafka: the
    check must pass before anything is counted."""
    from redis import exceptions

    from costline.connectors import bucket_zone
    from costline.connectors.redis_client import UNAVAILABLE, ClusterUrlError, connect

    def claim() -> None:
        with connect(settings.redis_url) as redis:
            bucket_zone.claim(redis, settings.namespace, settings.timezone)

    refusals = (bucket_zone.ZoneMismatch, exceptions.AuthenticationError, ClusterUrlError)
    try:
        # The URL is not repeated: it may carry a password.
        _until_answers("Redis", claim, UNAVAILABLE + (OSError,), final=refusals)
    except refusals as exc:
        # Waiting would change neither the recorded zone, the password nor the URL.
        typer.echo(f"costline worker: {exc}", err=True)
        raise typer.Exit(2) from exc


def web_port_problem(port: int) -> str | None:
    """Why this worker could not listen on its HTTP port, or ``None`` when it can.

    Tried before anything starts, as Faust's web server will bind it (every address, with
    ``SO_REUSEADDR``): a port another worker holds ends the command with one line instead of
    a traceback from inside Faust's start-up.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            why = "is in use (another worker?)" if exc.errno == errno.EADDRINUSE else \
                f"cannot be opened: {exc.strerror}"
            return (f"port {port} {why}: set COSTLINE_WEB_PORT (or costline --web-port) to a "
                    "free port for this worker's /healthz, /metrics and /slack/actions")
    return None


def faust_worker(app: Any, loglevel: str, stdout: IO[str] | None = None,
                 stop_timeout_s: float | None = None) -> Any:
    """Faust's worker for ``app``, whose stop ends within ``stop_timeout_s``
    (``costline.streams.worker.stop_deadline``). Its start-up spinner draws with terminal
    escapes (hide the cursor, backspace, show it again): on a terminal it is kept, in a log
    file it would be noise, so there it is left out."""
    from costline.streams.worker.faust_app import Worker

    out = sys.stdout if stdout is None else stdout
    worker = Worker(app, loglevel=loglevel, quiet=True, stdout=out,
                    stop_timeout_s=stop_timeout_s)
    if not out.isatty():
        worker.spinner = None
    return worker


def _kafka_answers(bootstrap: str, security: KafkaSecurity) -> bool:
    from costline.connectors.kafka import KafkaUnavailable, api_versions

    try:
        api_versions(bootstrap, timeout_s=2.0, security=security)
    except KafkaUnavailable:
        return False
    return True


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def worker(
        ctx: typer.Context,
        loglevel: str = typer.Option("info", help="debug, info, warning or error."),
    ) -> None:
        """Run the Faust stream processors (aggregation into Redis) until stopped."""

        from costline.connectors.kafka import KafkaLoginFailed
        from costline.streams.cli.root import settings_of
        from costline.streams.topics import LEDGER, create_topics, partitions_of
        from costline.streams.worker.app import build_app

        settings = settings_of(ctx)
        problem = web_port_problem(settings.web_port)
        if problem is not None:
            typer.echo(f"costline worker: {problem}", err=True)
            raise typer.Exit(2)
        claim_bucket_zone(settings)
        try:
            _until_kafka_answers(settings.kafka_bootstrap, lambda: create_topics(settings))
        except KafkaLoginFailed as exc:  # waiting would not make the password right
            typer.echo(f"costline worker: {exc}", err=True)
            raise typer.Exit(2) from exc
        partitions = partitions_of(settings, LEDGER)
        app, _ = build_app(settings, partitions)
        logging.getLogger("costline").setLevel(loglevel.upper())
        started = time.monotonic()
        worker = faust_worker(app, loglevel, stop_timeout_s=settings.stop_timeout_s)
        try:
            worker.execute_from_commandline()
        except SystemExit as exit_:
            # Faust gives up when the broker vanishes while it starts: wait and start again.
            security = settings.kafka_security()
            if exit_.code and time.monotonic() - started < STARTUP_S and \
                    not _kafka_answers(settings.kafka_bootstrap, security):
                worker.start_again()
                typer.echo("costline worker: Kafka went away while starting; starting again "
                           "once it answers", err=True)
                _until_kafka_answers(settings.kafka_bootstrap,
                                     lambda: _answering(settings.kafka_bootstrap, security))
                os.execv(sys.executable, [sys.executable, "-m", "costline.streams", *sys.argv[1:]])
            raise


def _answering(bootstrap: str, security: KafkaSecurity) -> None:
    """Return once Kafka answers; raise ``KafkaUnavailable`` (to be waited out) until then."""
    from costline.connectors.kafka import KafkaUnavailable

    if not _kafka_answers(bootstrap, security):
        raise KafkaUnavailable(f"no Kafka broker answered at {bootstrap}")
