"""One thread per alert, kept in the delivery ledger: the delivery model every notifier shares.

The first firing of an alert opens its thread on the channel (a root: a Slack message, an
email, a PagerDuty incident, an Alertmanager alert). Every later change of the alert (a higher
line, a repeat, a mute, the resolution) follows up in that thread. When several new alerts
for one destination arrive in one batch (``digest_min`` or more), they share one root: a
digest. Like Alertmanager, an alert that never fired on a channel is not sent for being
pending, resolved or silenced.

Each send is a step in the ledger, marked ``pending`` before the call and ``done`` after the
channel accepted (``connectors/delivery_ledger.py``): a redelivered change whose steps are
done is a duplicate and is not sent again; a step found pending is sent again and counted as
ambiguous. A notifier says how to send (``open``, ``follow``) and where (``route``); this
class decides when.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from abc import abstractmethod
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import ClassVar

from costline.connectors.alert_change import AlertChange, InvalidAlertRecord, title
from costline.connectors.delivery_ledger import DeliveryLedger, Member, StepState, ThreadRef
from costline.connectors.notify import (
    ChannelError,
    Delivery,
    DeliveryError,
    Notifier,
    Unavailable,
)
from costline.connectors.redis_client import FAILURES

ROOT, UPDATE, REPLY = "root", "update", "reply"


class Threaded(Notifier):
    """A notifier that delivers through the ledger, one thread per alert.

    Without a ledger the notifier is not configured to send (no token, no mail server): each
    change is logged instead, so nothing is silent.
    """

    digest_min: int | None = 4
    """New alerts for one destination in one batch that share a digest root; None: never."""

    follow_steps: ClassVar[tuple[str, ...]] = (REPLY,)
    """The steps of a later change; all done means the change was delivered."""

    def __init__(self, ledger: DeliveryLedger | None) -> None:
        self._ledger = ledger
        self._root_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary())
        self.stats: Counter[str] = Counter()
        self.log = logging.getLogger(type(self).__module__)

    @property
    def sending(self) -> bool:
        return self._ledger is not None

    # ── what a channel defines ────────────────────────────────────────────────────────────

    @abstractmethod
    def route(self, change: AlertChange) -> str:
        """The destination a new thread for this alert opens at (no spaces)."""

    @abstractmethod
    async def open(self, changes: Sequence[AlertChange], destination: str) -> ThreadRef:
        """Send the root of a new thread: one alert, or a digest of several. Raise a
        ``ChannelError`` when the channel did not take it."""

    @abstractmethod
    async def follow(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None, again: bool) -> str:
        """Send a later change of an alert in its thread (``again``: an earlier attempt may
        have arrived); return what the channel calls the message. Raise a ``ChannelError``
        when the channel did not take it."""

    async def ready(self, destination: str) -> None:
        """Wait until a message to ``destination`` may leave (a rate limit's ``Retry-After``,
        a pace). Steps wait here before the ledger marks them pending, so a step left
        pending by a dead process is one whose request may really have been sent."""

    async def before_reply(self, change: AlertChange, thread: ThreadRef,
                           members: list[Member], mine: Member | None,
                           previous: AlertChange | None, steps: dict[str, str]
                           ) -> list[Delivery] | None:
        """Record the change as its alert's latest before the reply is sent; a channel that
        also edits its root (Slack) does so here, and may answer for the change instead."""
        order = mine.order if mine else len(members)
        await self.ledger.set_member(thread, change.thread_key, change.record,
                                     previous.record if previous else None, order)
        return None

    def not_configured(self, change: AlertChange) -> str:
        """What the log says instead of sending, when the channel is not configured."""
        return f"{self.name} not configured; {self.route(change)} would get: {title(change)}"

    # ── delivery ──────────────────────────────────────────────────────────────────────────

    @property
    def ledger(self) -> DeliveryLedger:
        if self._ledger is None:
            raise RuntimeError("no ledger configured")
        return self._ledger

    async def deliver_changes(self, changes: Sequence[AlertChange]) -> list[Delivery]:
        """Deliver in order; raise ``DeliveryError`` if any change must be retried."""
        if not self.sending:
            return [self._log_only(change) for change in changes]
        try:
            jobs, unposted = await self._plan(changes)
        except FAILURES as exc:
            raise DeliveryError(f"the {self.name} ledger is unavailable "
                                f"({type(exc).__name__})") from None
        outcomes = list(unposted)
        postponed: list[str] = []
        held: set[str] = set()
        for job in jobs:
            if held.intersection(c.thread_key for c in job):
                postponed.append(job[0].alert_id)
                continue
            try:
                outcomes += await self._run(job)
            except (DeliveryError, *FAILURES) as exc:
                self.log.warning("alert %s not delivered to %s yet: %s", job[0].alert_id,
                                 self.name, describe(exc))
                held.update(c.thread_key for c in job)
                postponed.append(job[0].alert_id)
        if postponed:
            self.stats["postponed"] += len(postponed)
            raise DeliveryError(f"{len(postponed)} alert change(s) to retry on {self.name}: "
                                f"{', '.join(sorted(set(postponed)))}")
        return outcomes

    def _log_only(self, change: AlertChange) -> Delivery:
        self.log.info("%s", self.not_configured(change))
        self.stats["logged"] += 1
        return Delivery(change.alert_id, change.change_key, "logged", self.route(change))

    async def _plan(self, changes: Sequence[AlertChange]
                    ) -> tuple[list[list[AlertChange]], list[Delivery]]:
        """Jobs in batch order: new alerts grouped per destination into digests when many,
        every other change on its own."""
        new_by_destination: dict[str, list[AlertChange]] = defaultdict(list)
        jobs: list[list[AlertChange]] = []
        unposted: list[Delivery] = []
        opened: set[str] = set()
        for change in changes:
            if change.thread_key in opened or await self.ledger.thread(change.thread_key):
                jobs.append([change])
            elif change.state != "firing":
                unposted.append(Delivery(change.alert_id, change.change_key, "unposted"))
                continue
            else:
                group = new_by_destination[self.route(change)]
                if not group:
                    jobs.append(group)
                group.append(change)
            opened.add(change.thread_key)
        return [job for group in jobs for job in self._split_small(group)], unposted

    def _split_small(self, group: list[AlertChange]) -> list[list[AlertChange]]:
        least = self.digest_min
        if least is not None and len(group) >= max(2, least):
            return [group]
        return [[change] for change in group]

    async def _run(self, job: list[AlertChange]) -> list[Delivery]:
        thread = await self.ledger.thread(job[0].thread_key)
        if len(job) > 1 or thread is None:
            return await self.post_root(job)
        return [await self._apply(job[0], thread)]

    async def post_root(self, changes: list[AlertChange]) -> list[Delivery]:
        """Open a new thread for one alert, or a digest for several."""
        ledger = self.ledger
        destination = self.route(changes[0])
        await self.ready(destination)
        for change in changes:
            if await ledger.begin(change.thread_key, change.change_key,
                                  ROOT) is StepState.AMBIGUOUS:
                self._ambiguous(change, ROOT)
        try:
            ref = await self.open(changes, destination)
        except ChannelError as exc:
            if exc.answered:
                for change in changes:
                    await ledger.abandon(change.thread_key, change.change_key, ROOT)
            if isinstance(exc, Unavailable):
                raise
            return [self.refused(change, exc) for change in changes]
        await ledger.save_root(ref, {c.thread_key: c.record for c in changes})
        for change in changes:
            await ledger.finish(change.thread_key, change.change_key, ROOT, ref.ref)
        outcome = "digested" if len(changes) > 1 else "posted"
        self.stats["digests" if len(changes) > 1 else "posted"] += 1
        return [Delivery(c.alert_id, c.change_key, outcome, ref.destination, ref.ref)
                for c in changes]

    async def _apply(self, change: AlertChange, thread: ThreadRef) -> Delivery:
        """A later change of an alert with a thread."""
        ledger = self.ledger
        steps = await ledger.steps(change.thread_key, change.change_key)
        if done(steps.get(ROOT)) or all(done(steps.get(step)) for step in self.follow_steps):
            self.stats["duplicates"] += 1
            return Delivery(change.alert_id, change.change_key, "duplicate",
                            thread.destination, thread.ref)
        async with self._root_lock(thread):
            members = await ledger.members(thread)
            mine = next((m for m in members if m.thread_key == change.thread_key), None)
            latest = AlertChange.from_record(mine.record) if mine else None
            if latest is not None and latest.at > change.at:
                self.stats["stale"] += 1
                return Delivery(change.alert_id, change.change_key, "stale",
                                thread.destination, thread.ref)
            previous = previous_of(change, mine)
            answered = await self.before_reply(change, thread, members, mine, previous, steps)
            if answered is not None:
                return answered[0]
        return await self._reply(change, thread, previous)

    async def _reply(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None) -> Delivery:
        ledger = self.ledger
        await self.ready(thread.destination)
        state = await ledger.begin(change.thread_key, change.change_key, REPLY)
        again = state is StepState.AMBIGUOUS
        if again:
            self._ambiguous(change, REPLY)
        try:
            ref = await self.follow(change, thread, previous, again)
        except ChannelError as exc:
            if exc.answered:
                await ledger.abandon(change.thread_key, change.change_key, REPLY)
            if isinstance(exc, Unavailable):
                raise
            return self.refused(change, exc)
        await ledger.finish(change.thread_key, change.change_key, REPLY, ref)
        self.stats["replies"] += 1
        return Delivery(change.alert_id, change.change_key, "updated", thread.destination,
                        thread.ref)

    # ── small helpers ─────────────────────────────────────────────────────────────────────

    def _root_lock(self, thread: ThreadRef) -> asyncio.Lock:
        """Changes to alerts sharing a digest root are applied one at a time."""
        key = f"{thread.destination} {thread.ref}"
        lock = self._root_locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._root_locks[key] = lock
        return lock

    def _ambiguous(self, change: AlertChange, step: str) -> None:
        self.log.warning("alert %s change %s: an earlier %s attempt may have reached %s; "
                         "sending again", change.alert_id, change.change_key, step, self.name)
        self.stats["ambiguous"] += 1

    def refused(self, change: AlertChange, exc: ChannelError) -> Delivery:
        self.log.error("alert %s not sent, %s refused it for good: %s", change.alert_id,
                       self.name, exc)
        self.stats["failed"] += 1
        return Delivery(change.alert_id, change.change_key, "failed")


def done(marker: str | None) -> bool:
    return bool(marker and marker.startswith("done"))


def previous_of(change: AlertChange, member: Member | None) -> AlertChange | None:
    """The state this change moves away from, for the follow-up's wording."""
    if member is None:
        return None
    latest = AlertChange.from_record(member.record)
    if latest.change_key != change.change_key:
        return latest
    return AlertChange.from_record(member.previous) if member.previous else None


def describe(exc: BaseException) -> str:
    """Redis errors can quote their URL; name only the kind of failure."""
    if isinstance(exc, ChannelError | DeliveryError | InvalidAlertRecord):
        return str(exc)
    return type(exc).__name__
