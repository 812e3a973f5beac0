"""Alert changes → Slack, one thread per alert, never lost and never posted twice.

The worker hands :meth:`SlackNotifier.deliver` the alert records it consumed from
``NS.alerts.v1`` (a batch, e.g. from ``stream.take(200, within=2)``) and acks them when it
returns. It raises :class:`DeliveryError` only when something could not be delivered *for now*
(Slack rate limits beyond the retries, Slack or Redis down): the batch should then be
redelivered, and whatever did get through is recognised by the ledger and not sent again.
Permanent refusals (a revoked token, a malformed record) are logged and counted, not raised:
retrying them would stall the topic without ever succeeding.

Thread model: the first firing of an alert posts a message (its root). Every later change
updates that root (``chat.update``) and replies in its thread. When several new alerts for one
channel arrive in one batch (``digest_min`` or more), they share one digest root instead of
flooding the channel; each alert's later changes still update the digest and reply under it.

Routing: the channel the rule engine resolved from the rule's own ``channels`` map (the
record's ``notify.channel``); else ``notify.route_by_tag`` looks the group's tag value up in
``channel_by_tag_value``; without a match the record's ``notify.slack``; without that the
fallback channel. A channel Slack does not know (or an archived one) is logged and the
fallback is used instead.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.http_retry.jitter import Jitter
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient

from costline.connectors.alert_change import AlertChange, InvalidAlertRecord
from costline.connectors.redis_client import FAILURES
from costline.connectors.slack_ledger import Member, SlackLedger, StepState, ThreadRef
from costline.connectors.slack_render import (
    Block,
    fallback_text,
    message_for,
    render_change_reply,
)

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://slack.com/api/"
TRANSIENT_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error",
                              "service_unavailable", "request_timeout"})
CHANNEL_ERRORS = frozenset({"channel_not_found", "not_in_channel", "is_archived"})
ROOT_GONE_ERRORS = frozenset({"message_not_found", "channel_not_found", "cant_update_message"})
AMBIGUOUS_MARK = "\n_(sent again: an earlier attempt was interrupted)_"


class Secret(Protocol):
    def get_secret_value(self) -> str: ...


class DeliveryError(Exception):
    """Something could not be delivered now; the caller must not ack its Kafka message."""


class SlackError(Exception):
    """A failed Slack call, described by method and Slack's error code — never the token."""

    def __init__(self, method: str, error: str, status: int | None, *,
                 answered: bool = True) -> None:
        super().__init__(f"Slack {method} failed: {error}"
                         + (f" (HTTP {status})" if status is not None else ""))
        self.method = method
        self.error = error
        self.status = status
        self.answered = answered
        """False when no answer came back: Slack may have acted on the request."""


class SlackUnavailable(SlackError, DeliveryError):
    """Transient: rate limited past the retries, a server error, no connection."""


class SlackRefused(SlackError):
    """Permanent for this request: retrying the same call cannot succeed."""


@dataclass(frozen=True)
class Delivery:
    """What happened to one alert change: posted, digested, updated, duplicate, stale,
    unposted (never fired in Slack, so nothing to change), logged (no token) or failed
    (refused for good; see the log)."""

    alert_id: str
    change: str
    outcome: str
    channel: str | None = None
    ts: str | None = None


class TransientErrorRetryHandler(AsyncRetryHandler):
    """Retries what slack-sdk's built-in handlers leave out: gateway errors and
    ``ok: false`` answers that only mean "try again"."""

    async def _can_retry_async(self, *, state: RetryState, request: HttpRequest,
                               response: HttpResponse | None = None,
                               error: Exception | None = None) -> bool:
        if response is None:
            return False
        if response.status_code in (502, 504):
            return True
        body = response.body
        return (response.status_code == 200 and isinstance(body, dict)
                and body.get("ok") is False and body.get("error") in TRANSIENT_ERRORS)


class ProportionalJitter(Jitter):
    """Up to the interval again, rather than slack-sdk's fixed extra second: the backoff
    stays in proportion when it is configured short."""

    def recalculate(self, duration: float) -> float:
        return duration * (1.0 + random.random())


class ChannelPacer:
    """At most one message per ``interval_s`` per channel: Slack's own posting pace."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next: dict[str, float] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def wait(self, channel: str) -> None:
        async with self._locks[channel]:
            delay = self._next.get(channel, 0.0) - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self._next[channel] = self._clock() + self._interval_s

    def sent(self, channel: str) -> None:
        """A message leaves now: the next one waits a full interval from here, however long
        the caller took between its turn and the request."""
        self._next[channel] = max(self._next.get(channel, 0.0),
                                  self._clock() + self._interval_s)

    def alias(self, name: str, channel_id: str) -> None:
        """A channel first posted to by name is paced by its id from then on."""
        self._next[channel_id] = max(self._next.get(channel_id, 0.0),
                                     self._next.get(name, 0.0))


class SlackNotifier:
    """Posts, updates and threads alert messages; see the module docstring for the model."""

    def __init__(self, *, token: str | Secret | None, ledger: SlackLedger | None,
                 fallback_channel: str, base_url: str = DEFAULT_API_URL,
                 channel_by_tag_value: Mapping[str, str] | None = None,
                 min_interval_s: float = 1.0, digest_min: int = 4,
                 rate_limit_retries: int = 5, server_error_retries: int = 3,
                 retry_backoff_s: float = 0.5, timeout_s: float = 15.0) -> None:
        self._token = _secret(token)
        if self._token is not None and ledger is None:
            raise ValueError("a ledger is needed to send: without it a restart would re-post")
        self._ledger = ledger
        self.fallback_channel = fallback_channel
        self._base_url = base_url
        self._by_tag = dict(channel_by_tag_value or {})
        self._pacer = ChannelPacer(min_interval_s)
        self._digest_min = max(2, digest_min)
        self._retries = (rate_limit_retries, server_error_retries, retry_backoff_s)
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._channel_ids: dict[str, str] = {}
        self._root_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary())
        self._resume_at = 0.0
        """No call before this (monotonic) time: the ``Retry-After`` of Slack's last 429
        that outlasted the client's retries."""
        self.stats: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"SlackNotifier(base_url={self._base_url!r}, sending={self.sending})"

    @property
    def sending(self) -> bool:
        return self._token is not None

    # ── lifecycle ─────────────────────────────────────────────────────────────────────────

    async def __aenter__(self) -> SlackNotifier:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._client = None

    def _web_client(self) -> AsyncWebClient:
        """One HTTP session for all calls, created inside the running loop."""
        if self._client is None:
            rate_limit_retries, server_error_retries, backoff = self._retries
            interval = BackoffRetryIntervalCalculator(backoff_factor=backoff,
                                                      jitter=ProportionalJitter())
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s))
            self._client = AsyncWebClient(
                token=self._token, base_url=self._base_url, session=self._session,
                timeout=int(self._timeout_s),
                retry_handlers=[
                    AsyncConnectionErrorRetryHandler(server_error_retries, interval),
                    AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries),
                    AsyncServerErrorRetryHandler(server_error_retries, interval),
                    TransientErrorRetryHandler(server_error_retries, interval),
                ])
        return self._client

    # ── routing ───────────────────────────────────────────────────────────────────────────

    def route(self, change: AlertChange) -> str:
        """The channel the rule itself routed the alert to (its ``channels`` map, or a tag
        value naming a channel: ``notify.channel``); else the owner's channel from our map
        when ``route_by_tag`` finds one; else the rule's ``slack``; else ours."""
        routed = change.notify_channel
        if routed and routed != change.notify_slack:
            return routed
        if change.route_by_tag:
            value = change.group.get(change.route_by_tag)
            if value is not None and value in self._by_tag:
                return self._by_tag[value]
        return change.notify_slack or self.fallback_channel

    # ── delivery ──────────────────────────────────────────────────────────────────────────

    async def notify(self, record: Mapping[str, Any]) -> Delivery:
        """One record; see :meth:`deliver`."""
        return (await self.deliver([record]))[0]

    async def deliver(self, records: Sequence[Mapping[str, Any]]) -> list[Delivery]:
        """Deliver a batch in order; raise :class:`DeliveryError` if any must be retried."""
        changes: list[AlertChange] = []
        outcomes: list[Delivery] = []
        for record in records:
            try:
                changes.append(AlertChange.from_record(record))
            except InvalidAlertRecord as exc:
                log.error("alert record refused, not sent: %s", exc)
                self.stats["failed"] += 1
                outcomes.append(Delivery(str(record.get("alert_id", "?")), "-", "failed"))
        if self._token is None:
            return outcomes + [self._log_only(change) for change in changes]
        try:
            jobs, unposted = await self._plan(changes)
        except FAILURES as exc:
            raise DeliveryError(f"the Slack ledger is unavailable ({type(exc).__name__})"
                                ) from None
        outcomes += unposted
        postponed: list[str] = []
        held: set[str] = set()
        for job in jobs:
            if held.intersection(c.thread_key for c in job):
                postponed.append(job[0].alert_id)
                continue
            try:
                outcomes += await self._run(job)
            except (DeliveryError,) + FAILURES as exc:
                log.warning("alert %s not delivered yet: %s", job[0].alert_id, _describe(exc))
                held.update(c.thread_key for c in job)
                postponed.append(job[0].alert_id)
        if postponed:
            self.stats["postponed"] += len(postponed)
            raise DeliveryError(f"{len(postponed)} alert change(s) to retry: "
                                f"{', '.join(sorted(set(postponed)))}")
        return outcomes

    def _log_only(self, change: AlertChange) -> Delivery:
        """No token: the message is written to the log instead, so nothing is silent."""
        channel = self.route(change)
        log.info("Slack not configured; %s would get: %s", channel, fallback_text(change))
        self.stats["logged"] += 1
        return Delivery(change.alert_id, change.change_key, "logged", channel)

    async def _plan(self, changes: Sequence[AlertChange]
                    ) -> tuple[list[list[AlertChange]], list[Delivery]]:
        """Jobs in batch order: new alerts grouped per channel into digests when many,
        every other change on its own. Like Alertmanager, an alert that never fired in
        Slack is not posted for being pending, resolved or silenced."""
        new_by_channel: dict[str, list[AlertChange]] = defaultdict(list)
        jobs: list[list[AlertChange]] = []
        unposted: list[Delivery] = []
        posted: set[str] = set()
        ledger = self._require_ledger()
        for change in changes:
            if change.thread_key in posted or await ledger.thread(change.thread_key):
                jobs.append([change])
            elif change.state != "firing":
                unposted.append(Delivery(change.alert_id, change.change_key, "unposted"))
                continue
            else:
                group = new_by_channel[self.route(change)]
                if not group:
                    jobs.append(group)
                group.append(change)
            posted.add(change.thread_key)
        return [job for group in jobs for job in self._split_small(group)], unposted

    def _split_small(self, group: list[AlertChange]) -> list[list[AlertChange]]:
        if len(group) >= self._digest_min:
            return [group]
        return [[change] for change in group]

    async def _run(self, job: list[AlertChange]) -> list[Delivery]:
        ledger = self._require_ledger()
        thread = await ledger.thread(job[0].thread_key)
        if len(job) > 1 or thread is None:
            return await self._post_root(job)
        return [await self._apply(job[0], thread)]

    async def _post_root(self, changes: list[AlertChange]) -> list[Delivery]:
        """Post a new thread root for one alert, or a digest for several."""
        ledger = self._require_ledger()
        channel = self.route(changes[0])
        await self._ready_to_post(channel)
        for change in changes:
            if await ledger.begin(change.thread_key, change.change_key,
                                  "root") is StepState.AMBIGUOUS:
                self._ambiguous(change, "root")
        message = message_for(changes)
        try:
            ref = await self._post(channel, message.text, message.blocks, paced=True)
        except SlackError as exc:
            if exc.answered:
                for change in changes:
                    await ledger.abandon(change.thread_key, change.change_key, "root")
            if isinstance(exc, SlackUnavailable):
                raise
            return [self._refused(change, exc) for change in changes]
        await ledger.save_root(ref, {c.thread_key: c.record for c in changes})
        for change in changes:
            await ledger.finish(change.thread_key, change.change_key, "root", ref.ts)
        outcome = "digested" if len(changes) > 1 else "posted"
        self.stats["digests" if len(changes) > 1 else "posted"] += 1
        return [Delivery(c.alert_id, c.change_key, outcome, ref.channel, ref.ts)
                for c in changes]

    async def _apply(self, change: AlertChange, thread: ThreadRef) -> Delivery:
        """A later change of a posted alert: update the root, then reply in its thread."""
        ledger = self._require_ledger()
        steps = await ledger.steps(change.thread_key, change.change_key)
        if _done(steps.get("root")) or (_done(steps.get("update"))
                                        and _done(steps.get("reply"))):
            self.stats["duplicates"] += 1
            return Delivery(change.alert_id, change.change_key, "duplicate", thread.channel,
                            thread.ts)
        async with self._root_lock(thread):
            members = await ledger.members(thread)
            mine = next((m for m in members if m.thread_key == change.thread_key), None)
            latest = AlertChange.from_record(mine.record) if mine else None
            if latest is not None and latest.at > change.at:
                self.stats["stale"] += 1
                return Delivery(change.alert_id, change.change_key, "stale", thread.channel,
                                thread.ts)
            previous = _previous(change, mine)
            if not _done(steps.get("update")):
                moved = await self._update_root(change, thread, members, mine, previous)
                if moved is not None:
                    return moved[0]
        return await self._reply(change, thread, previous)

    async def _update_root(self, change: AlertChange, thread: ThreadRef,
                           members: list[Member], mine: Member | None,
                           previous: AlertChange | None) -> list[Delivery] | None:
        """Re-render the root from all of its alerts; a root that is gone starts anew."""
        ledger = self._require_ledger()
        order = mine.order if mine else len(members)
        shown = [change if m.thread_key == change.thread_key else
                 AlertChange.from_record(m.record) for m in members]
        if mine is None:
            shown.append(change)
        message = message_for(shown, await ledger.notes(thread))
        try:
            await self._call("chat.update", channel=thread.channel, ts=thread.ts,
                             text=message.text, blocks=message.blocks)
        except SlackRefused as exc:
            if exc.error not in ROOT_GONE_ERRORS:
                return [self._refused(change, exc)]
            log.warning("root of alert %s is gone (%s); posting it anew", change.alert_id,
                        exc.error)
            return await self._post_root([change])
        await ledger.set_member(thread, change.thread_key, change.record,
                                previous.record if previous else None, order)
        await ledger.finish(change.thread_key, change.change_key, "update", thread.ts)
        self.stats["updated"] += 1
        return None

    async def _reply(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None) -> Delivery:
        ledger = self._require_ledger()
        text = render_change_reply(change, previous)
        await self._ready_to_post(thread.channel)
        state = await ledger.begin(change.thread_key, change.change_key, "reply")
        if state is StepState.AMBIGUOUS:
            self._ambiguous(change, "reply")
            text += AMBIGUOUS_MARK
        try:
            reply = await self._post(thread.channel, text, None, thread_ts=thread.ts,
                                     paced=True)
        except SlackError as exc:
            if exc.answered:
                await ledger.abandon(change.thread_key, change.change_key, "reply")
            if isinstance(exc, SlackUnavailable):
                raise
            return self._refused(change, exc)
        await ledger.finish(change.thread_key, change.change_key, "reply", reply.ts)
        self.stats["replies"] += 1
        return Delivery(change.alert_id, change.change_key, "updated", thread.channel,
                        thread.ts)

    # ── notes from people (buttons) ───────────────────────────────────────────────────────

    async def annotate(self, channel: str, ts: str, note: str) -> None:
        """Say on the message who did what: a line on the root and a reply in its thread."""
        if self._token is None:
            log.info("Slack not configured; note for %s %s: %s", channel, ts, note)
            return
        ledger = self._require_ledger()
        thread = ThreadRef(channel, ts)
        async with self._root_lock(thread):
            notes = await ledger.add_note(thread, note)
            members = await ledger.members(thread)
            if members:
                shown = [AlertChange.from_record(m.record) for m in members]
                message = message_for(shown, notes)
                await self._call("chat.update", channel=channel, ts=ts, text=message.text,
                                 blocks=message.blocks)
        await self._post(channel, note, None, thread_ts=ts)

    # ── Slack calls ───────────────────────────────────────────────────────────────────────

    async def _ready_to_post(self, channel: str) -> None:
        """Wait out a 429's ``Retry-After`` and the channel's pace. Delivery steps wait here
        before the ledger marks them pending, so a step left pending by a dead process is
        one whose request may really have reached Slack, not one still waiting its turn."""
        await self._hold_off()
        await self._pacer.wait(self._channel_ids.get(channel, channel))

    async def _hold_off(self) -> None:
        delay = self._resume_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _post(self, channel: str, text: str, blocks: list[Block] | None, *,
                    thread_ts: str | None = None, paced: bool = False) -> ThreadRef:
        """``chat.postMessage`` at the channel's pace (``paced``: the caller already waited
        for it); an unknown channel → the fallback."""
        if not paced:
            await self._ready_to_post(channel)
        params: dict[str, Any] = {"channel": channel, "text": text}
        if blocks:
            params["blocks"] = blocks
        if thread_ts:
            params["thread_ts"] = thread_ts
        self._pacer.sent(self._channel_ids.get(channel, channel))
        try:
            answer = await self._call("chat.postMessage", **params)
        except SlackRefused as exc:
            if exc.error not in CHANNEL_ERRORS or thread_ts or channel == self.fallback_channel:
                raise
            log.warning("Slack channel %s refused (%s); using %s", channel, exc.error,
                        self.fallback_channel)
            self.stats["fallbacks"] += 1
            return await self._post(self.fallback_channel, text, blocks)
        ref = ThreadRef(str(answer["channel"]), str(answer["ts"]))
        if channel not in self._channel_ids:
            self._channel_ids[channel] = ref.channel
            self._pacer.alias(channel, ref.channel)
        return ref

    async def _call(self, method: str, **params: Any) -> dict[str, Any]:
        """One API call; Slack's exception is replaced by ours, which carries no request.
        A 429 holds back every later call, in this delivery or the next, until its
        ``Retry-After`` has passed."""
        await self._hold_off()
        failure: SlackError | None = None
        try:
            response = await self._web_client().api_call(method, json=params)
        except SlackApiError as exc:
            failure = _classify(method, exc)
            if failure.status == 429:
                self._resume_at = max(self._resume_at,
                                      time.monotonic() + _retry_after(exc.response))
        except (TimeoutError, aiohttp.ClientError) as exc:
            failure = SlackUnavailable(method, type(exc).__name__, None, answered=False)
        if failure is not None:
            raise failure
        return dict(response.data) if isinstance(response.data, dict) else {}

    # ── small helpers ─────────────────────────────────────────────────────────────────────

    def _require_ledger(self) -> SlackLedger:
        if self._ledger is None:
            raise RuntimeError("no ledger configured")
        return self._ledger

    def _root_lock(self, thread: ThreadRef) -> asyncio.Lock:
        """Changes to alerts sharing a digest root are applied one at a time."""
        key = f"{thread.channel}:{thread.ts}"
        lock = self._root_locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._root_locks[key] = lock
        return lock

    def _ambiguous(self, change: AlertChange, step: str) -> None:
        log.warning("alert %s change %s: an earlier %s attempt may have reached Slack; "
                    "sending again", change.alert_id, change.change_key, step)
        self.stats["ambiguous"] += 1

    def _refused(self, change: AlertChange, exc: SlackError) -> Delivery:
        log.error("alert %s not sent, Slack refused it for good: %s", change.alert_id, exc)
        self.stats["failed"] += 1
        return Delivery(change.alert_id, change.change_key, "failed")


def _secret(token: str | Secret | None) -> str | None:
    if token is None:
        return None
    value = token if isinstance(token, str) else token.get_secret_value()
    return value.strip() or None


def _classify(method: str, exc: SlackApiError) -> SlackError:
    """Slack's answer → transient (retry later) or refused (retrying cannot help)."""
    response = exc.response
    status = int(getattr(response, "status_code", 0) or 0) or None
    data = getattr(response, "data", None)
    error = str(data.get("error") or "unknown") if isinstance(data, dict) else f"http_{status}"
    transient = error in TRANSIENT_ERRORS or status == 429 or (status or 0) >= 500
    kind = SlackUnavailable if transient else SlackRefused
    return kind(method, error, status)


def _retry_after(response: Any) -> float:
    """Seconds Slack asked to wait (``Retry-After``); one second when it did not say."""
    headers = getattr(response, "headers", None) or {}
    for name, value in dict(headers).items():
        if str(name).lower() == "retry-after":
            text = value[0] if isinstance(value, list | tuple) and value else value
            try:
                return max(0.0, min(float(str(text).strip()), 3600.0))
            except ValueError:
                break
    return 1.0


def _describe(exc: BaseException) -> str:
    """Redis errors can quote their URL; name only the kind of failure."""
    return str(exc) if isinstance(exc, SlackError | DeliveryError) else type(exc).__name__


def _done(marker: str | None) -> bool:
    return bool(marker and marker.startswith("done"))


def _previous(change: AlertChange, member: Member | None) -> AlertChange | None:
    """The state this change moves away from, for the thread reply's wording."""
    if member is None:
        return None
    latest = AlertChange.from_record(member.record)
    if latest.change_key != change.change_key:
        return latest
    return AlertChange.from_record(member.previous) if member.previous else None
