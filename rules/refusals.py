"""Refused money: what the input the worker refused would have counted, by reason.

A refused message is counted nowhere: its money is missing from every total until its dead
letter is replayed (``costline dead-letters replay``). So that ``costline spend``, the API and
the dashboard can say how much is missing, intake tallies each refused message per hour of
its events' time and per reason (``connectors.refusal_tally`` keeps the tally in Redis):
messages, events, the cost the usage events stated themselves, and the quantity of each
resource type and unit of those that did not.

The quantities are priced when the tally is read, with the price book of that moment. A
message refused because its resource type was not in the book has no price when it is
refused; once the book prices the type, the same tally says what the message is worth, which
is when replaying it makes sense. A quantity the book still cannot price (an unknown type, or
a unit the book does not price it in) is reported as such, never guessed.

The tally is kept per UTC hour: a period is read as the hours that start in it, exact for every
zone whose offset is a whole number of hours.

Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from costline.rules.events import Parsed, UsageEvent, parse_message
from costline.rules.money import money_micro
from costline.rules.prices import MAX_EVENT_MICRO, MICRO, PriceBook, exact, to_micro

HOUR_S = 3600
MESSAGES, EVENTS, STATED, QUANTITY = "m", "e", "c", "q"
Quantities = dict[tuple[str, str], int]


@dataclass
class Refused:
    """What the messages refused for one reason held: ``stated`` is the micro-units of cost
    the usage events stated themselves, ``quantities`` the micro-units of quantity of those
    that did not, by (resource type, unit)."""

    messages: int = 0
    events: int = 0
    stated: int = 0
    quantities: Quantities = field(default_factory=dict)


@dataclass(frozen=True)
class Priced:
    """Refused money at today's prices: ``amount`` in micro-units, and the quantities the
    price book cannot price, by (resource type, unit)."""

    amount: int
    unpriced: Quantities


def hourly_counts(raw: bytes, code: str, refused_at: float) -> dict[int, dict[str, int]]:
    """The tally's increments for one refused message: hour (Unix seconds) → field → amount.

    Events are counted in the hour of their own time and the message in its first event's; a
    message that does not parse (or whose times are out of range) is counted in the hour it
    was refused, with no events. Fields are ``<code>\\t<m|e|c>`` and
    ``<code>\\tq\\t<resource type>\\t<unit>``."""
    parsed = parse_message(raw, now=refused_at)
    if not isinstance(parsed, Parsed) or not parsed.events:
        return {_hour(refused_at): {f"{code}\t{MESSAGES}": 1}}
    out: dict[int, dict[str, int]] = {}
    for index, (event, ts) in enumerate(zip(parsed.events, parsed.times, strict=True)):
        fields = out.setdefault(_hour(ts), {})
        if index == 0:
            _add(fields, f"{code}\t{MESSAGES}", 1)
        _add(fields, f"{code}\t{EVENTS}", 1)
        if isinstance(event, UsageEvent):
            if event.cost is not None:
                _add(fields, f"{code}\t{STATED}", _bounded(exact(event.cost)))
            else:
                name = f"{code}\t{QUANTITY}\t{event.resource_type}\t{event.unit}"
                _add(fields, name, _bounded(exact(event.quantity)))
    return out


def negated(counts: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, int]]:
    """The increments that take a message's counts back out (its dead letter was replayed)."""
    return {hour: {name: -value for name, value in fields.items()}
            for hour, fields in counts.items()}


def by_reason(fields: Iterable[tuple[str, int]]) -> dict[str, Refused]:
    """The tally's fields (summed over the hours asked) → what was refused per reason."""
    out: dict[str, Refused] = {}
    for name, value in fields:
        code, _, rest = name.partition("\t")
        what, _, detail = rest.partition("\t")
        refused = out.setdefault(code, Refused())
        if what == MESSAGES:
            refused.messages += value
        elif what == EVENTS:
            refused.events += value
        elif what == STATED:
            refused.stated += value
        elif what == QUANTITY:
            resource_type, _, unit = detail.partition("\t")
            key = (resource_type, unit)
            refused.quantities[key] = refused.quantities.get(key, 0) + value
    return {code: refused for code, refused in sorted(out.items()) if refused.messages > 0}


def priced(refused: Refused, prices: PriceBook) -> Priced:
    """The money of ``refused`` at the book's prices: what the events stated, plus each
    quantity the book prices in that unit."""
    amount, unpriced = refused.stated, {}
    for (resource_type, unit), quantity in sorted(refused.quantities.items()):
        price = prices.prices.get(resource_type)
        if price is None or price.unit != unit:
            unpriced[(resource_type, unit)] = quantity
        else:
            amount += to_micro(Decimal(quantity) / MICRO * price.price)
    return Priced(amount, unpriced)


def refused_lines(tally: Mapping[str, Refused], prices: PriceBook) -> list[str]:
    """The warning ``costline spend`` prints for a period with refused input: one line per
    reason, with its money for people, and how to count it once the book is right."""
    lines = []
    for code, refused in tally.items():
        money = priced(refused, prices)
        what = f"{refused.messages} message(s)" + (
            f", {refused.events} event(s)" if refused.events else "")
        known = f"{money_micro(money.amount, prices.currency)} at today's prices"
        unknown = ", ".join(f"{_quantity(q)} {unit} of {rtype} ({_why(prices, rtype, unit)})"
                            for (rtype, unit), q in money.unpriced.items())
        if not refused.events:
            said = "amount unknown (not readable as events)"
        elif unknown and money.amount:
            said = f"{known}, plus {unknown}"
        else:
            said = unknown or known
        lines.append(f"warning: refused input in this period, not in the totals: {code}: "
                     f"{what}: {said}; see costline dead-letters list --reason {code}")
    return lines


def _why(prices: PriceBook, resource_type: str, unit: str) -> str:
    price = prices.prices.get(resource_type)
    if price is None:
        return "not in the price book"
    return f"priced per {price.unit}, not per {unit}"


def _quantity(micro: int) -> str:
    return f"{(Decimal(micro) / MICRO).normalize():,f}"


def _bounded(amount: Decimal) -> int:
    """Micro-units of an amount, or 0 past what one event may add (a tally must not overflow
    Redis's integers for one absurd event)."""
    micro = to_micro(amount)
    return micro if abs(micro) <= MAX_EVENT_MICRO else 0


def _add(fields: dict[str, int], name: str, value: int) -> None:
    fields[name] = fields.get(name, 0) + value


def _hour(ts: float) -> int:
    return int(ts // HOUR_S) * HOUR_S
