"""What the demo played, summed on its own in decimal: the spend and waste the pipeline must
have counted, to the micro-unit.

The sums follow the contract, not the worker's code: an event id counts once (the first
event sent with it), a usage event costs the cost it states (credits and refunds are
negative) or its quantity times the price book's price, each event rounded to micro-units
half to even; a fault wastes its units × (lost + recovery seconds) / 3600 × the hourly price.
(A failed run's ``failed_run`` waste is its spend, worked out when read: not summed here.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from typing import Any

from costline.rules.prices import MICRO, PriceBook, format_micro
from costline.rules.runs import FAILED_RUN
from costline.rules.state import StateView
from costline.streams.demo.scenario import Scenario


def _events(messages: Iterable[dict[str, Any] | list[dict[str, Any]]]
            ) -> Iterator[dict[str, Any]]:
    for message in messages:
        yield from message if isinstance(message, list) else [message]


def _micro(amount: Decimal) -> int:
    return int((amount * MICRO).to_integral_value(rounding=ROUND_HALF_EVEN))


def played_micro(scenario: Scenario, book: PriceBook) -> dict[str, int]:
    """The scenario's ``spend`` and ``fault waste``, in micro-units."""
    seen: set[str] = set()
    cost = waste = 0
    with localcontext(prec=60):
        for event in _events([*scenario.usage, *scenario.faults]):
            if event["event_id"] in seen:
                continue
            seen.add(event["event_id"])
            if event["kind"] == "usage":
                stated = event.get("cost")
                if stated is None:
                    price = book.price_of(event["resource_type"]).price
                    cost += _micro(Decimal(repr(event["quantity"])) * price)
                else:
                    cost += _micro(Decimal(repr(stated)))
            elif event["kind"] == "fault":
                hourly = book.price_of(event["resource_type"]).price
                seconds = (Decimal(repr(event["lost_seconds"]))
                           + Decimal(repr(event["recovery_seconds"])))
                waste += _micro(event["units"] * seconds / 3600 * hourly)
    return {"spend": cost, "fault waste": waste}


def counted_micro(state: StateView, start: float, end: float) -> dict[str, int]:
    """What ``state`` counted over [start, end), as ``played_micro`` sums it. Failed-run waste
    is worked out from spend when read (``costline.rules.runs``), so it is left out: what the
    events carry is spend and fault waste."""
    waste = state.totals("waste", {}, ["fault"], start, end)
    return {"spend": sum(state.totals("cost", {}, [], start, end).values()),
            "fault waste": sum(v for (fault,), v in waste.items() if fault != FAILED_RUN)}


def exactness(played: dict[str, int], counted: dict[str, int]) -> dict[str, Any]:
    """Played against counted, per measure, as exact strings; ``equal`` only when all are."""
    return {
        "measures": {measure: {"played": format_micro(played[measure]),
                               "counted": format_micro(counted.get(measure, 0))}
                     for measure in played},
        "equal": all(counted.get(measure, 0) == micro for measure, micro in played.items()),
    }
