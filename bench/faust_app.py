"""What the worker's Faust app spends per delivered message outside the agent, against Faust's.

    .venv/bin/python bench/faust_app.py [--messages N] [--repeat N] [--json]

Two costs Faust pays for every message it delivers, each timed on the worker's app
(``costline.streams.worker.handoff.App``) and, as the baseline in the same run, on a stock
``faust.App``:

* the sensors' four calls (message in, stream event in and out, message out): Faust's Monitor
  sensor against the worker's ``InboundTimes``;
* the producer buffer's ``size``, asked before every delivery (``wait_until_ebb``): Faust's
  buffer against the worker's ``UnthreadedBuffer``.

No broker is needed: the apps are built, not started. Prints µs per message (the best of
``--repeat`` runs of ``--messages`` calls each).
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import faust  # noqa: E402 - after the path
from faust.types import TP  # noqa: E402

from costline.streams.worker.handoff import App  # noqa: E402

PARTITION = TP("usage", 0)


class _Task:
    """What the Monitor keeps per stream's task (weakly referenced)."""


class _Stream:
    task_owner = _Task()

    def __str__(self) -> str:
        return "stream"


class _Message:
    time_in: float | None = None
    time_out: float | None = None
    time_total: float | None = None


def built(app_class: type[faust.App]) -> faust.App:
    app = app_class(f"bench-{app_class.__module__}", broker="kafka://127.0.0.1:1",
                    autodiscover=False)
    list(app.on_init_dependencies())  # what starting it does to its sensors
    return app


def sensor_calls(app: faust.App) -> Callable[[], None]:
    """One message's sensor calls, in the order Faust makes them."""
    sensors, message, stream = app.sensors, _Message(), _Stream()

    def deliver() -> None:
        sensors.on_message_in(PARTITION, 1, message)  # type: ignore[arg-type]
        state = sensors.on_stream_event_in(PARTITION, 1, stream, None)  # type: ignore[arg-type]
        sensors.on_stream_event_out(PARTITION, 1, stream, None, state)  # type: ignore[arg-type]
        sensors.on_message_out(PARTITION, 1, message)  # type: ignore[arg-type]
    return deliver


def buffer_size(app: faust.App) -> Callable[[], Any]:
    buffer = app.producer.buffer
    return lambda: buffer.size


def best_us(call: Callable[[], Any], messages: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=messages, repeat=repeat)) / messages * 1e6


def measure(messages: int, repeat: int) -> dict[str, dict[str, float]]:
    apps = {"faust": built(faust.App), "worker": built(App)}
    return {
        cost: {name: best_us(make(app), messages, repeat) for name, app in apps.items()}
        for cost, make in (("sensors", sensor_calls), ("buffer size", buffer_size))
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args()
    figures = measure(a.messages, a.repeat)
    if a.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"µs per delivered message (best of {a.repeat} runs of {a.messages:,})")
    print(f"{'':<14}{'faust.App':>12}{'worker app':>12}{'saved':>10}")
    for cost, by_app in figures.items():
        print(f"{cost:<14}{by_app['faust']:>12.2f}{by_app['worker']:>12.2f}"
              f"{by_app['faust'] - by_app['worker']:>10.2f}")
    total = {name: sum(f[name] for f in figures.values()) for name in ("faust", "worker")}
    print(f"{'both':<14}{total['faust']:>12.2f}{total['worker']:>12.2f}"
          f"{total['faust'] - total['worker']:>10.2f}")


if __name__ == "__main__":
    main()
