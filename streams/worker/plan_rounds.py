"""What the three shells of automatic actions share — reclamation, budget enforcement and the
checkpoint lifecycle: a round that checks its caps before any of its actions happens, handing
the ledger's outbox to the audit log, and saying what went wrong in one line.

The decisions stay pure in their own modules (``cap_breach`` of ``costline.rules.reclaim`` and
``costline.rules.enforce``); these are the I/O around them, written once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

Sink = Callable[[dict[str, Any]], Awaitable[None]]


class Identified(Protocol):
    """A plan, as far as a round needs it: its id."""

    @property
    def plan_id(self) -> str: ...


class Tracks(Protocol):
    """A plan as its ledger tracks it (``Tracked`` of reclamation and the checkpoint
    lifecycle, ``Enforcement`` of enforcement)."""

    @property
    def plan(self) -> Identified: ...


T = TypeVar("T", bound=Tracks)


class RoundLedger(Protocol):
    """The part of a plan ledger (``costline.connectors.reclaim_ledger``) a round uses."""

    async def released(self, rule: str, now: float, excluding: Sequence[str] = ()) -> int: ...

    async def reserve(self, rule: str, plan_ids: Sequence[str], now: float,
                      limit: int) -> int | None: ...

    async def outbox(self, limit: int = 500) -> list[str]: ...

    async def sent(self, item: str) -> None: ...


async def round_breach(ledger: RoundLedger, rule: str, plan_ids: Sequence[str], now: float,
                       max_per_hour: int, breach: Callable[[int], str | None]) -> str | None:
    """Why this round of ``plan_ids`` must not act, or ``None`` once its place in the rule's
    hourly cap is reserved. ``breach(done)`` is the pure cap check given what the last hour
    already did: asked first of the hour as read, then again of what the atomic reservation
    found if another worker's round took the room in between."""
    before = await ledger.released(rule, now, excluding=plan_ids)
    why = breach(before)
    if why is not None or not plan_ids:
        return why
    held = await ledger.reserve(rule, plan_ids, now, max_per_hour)
    if held is None:
        return None
    return breach(held) or f"aborted: max_per_hour {max_per_hour} reached"


async def act_round(ledger: RoundLedger, rule: str, live: Sequence[T], now: float,
                    max_per_hour: int, breach: Callable[[int], str | None],
                    abort: Callable[[T, str], Awaitable[None]],
                    act: Callable[[T], Awaitable[None]], log: logging.Logger) -> None:
    """Caps first: if this round's actions break one (``breach``, as for ``round_breach``),
    none of them happens and each is closed by ``abort`` with the reason; otherwise each
    ``act``s in turn."""
    why = await round_breach(ledger, rule, [t.plan.plan_id for t in live], now, max_per_hour,
                             breach)
    if why is not None:
        log.warning("rule %s: %s", rule, why)
        for tracked in live:
            await abort(tracked, why)
        return
    for tracked in live:
        await act(tracked)


async def flush_outbox(ledger: RoundLedger, sink: Sink, log: logging.Logger
                       ) -> list[dict[str, Any]]:
    """Hand the outbox to the sink, oldest first; stop at the first refusal, which stays in
    the outbox for the next call."""
    handed: list[dict[str, Any]] = []
    for item in await ledger.outbox():
        record = json.loads(item)
        try:
            await sink(record)
        except Exception as exc:  # noqa: BLE001 - kept in the outbox for the next call
            log.warning("action sink refused %s: %s", record.get("action_id"), error_text(exc))
            break
        await ledger.sent(item)
        handed.append(record)
    return handed


def error_text(exc: BaseException) -> str:
    """An exception in one line for the audit log: its type and the start of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
