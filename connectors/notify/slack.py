"""Slack: alert changes as Block Kit messages, one thread per alert, buttons to act on them.

The first firing of an alert posts a message (its root). Every later change updates that root
(``chat.update``) and replies in its thread. When several new alerts for one channel arrive in
one batch (``digest_min`` or more), they share one digest root instead of flooding the
channel; each alert's later changes still update the digest and reply under it. The delivery
model (ledger, threads, digests) is ``Threaded``'s; what Slack adds is its two-step follow-up,
its pace (one message per second per channel) and its rate limits.

Routing: the channel the rule engine resolved from the rule's own map (the change's
``notify.channel``); else ``notify.route_by_tag`` looks the group's tag value up in
``channel_by_tag_value`` (``COSTLINE_SLACK_CHANNELS``); without a match the rule's ``slack``;
without that the fallback channel. A channel Slack does not know (or an archived one) is
logged and the fallback is used instead.

Permanent refusals (a revoked token, a malformed record) are logged and counted, not raised:
retrying them would stall the topic without ever succeeding.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.http_retry.jitter import Jitter
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

from costline.connectors.alert_change import AlertChange
from costline.connectors.delivery_ledger import DeliveryLedger, Member, ThreadRef
from costline.connectors.notify import (
    NOTIFIERS,
    ChannelError,
    Delivery,
    Refused,
    Secret,
    Setup,
    Unavailable,
    notifier,
)
from costline.connectors.notify._threads import REPLY, UPDATE, Threaded, done
from costline.connectors.slack_render import (
    Block,
    fallback_text,
    message_for,
    render_change_reply,
)
from costline.rules.notify import Channel
from costline.rules.notify_params import NotifierParams, routed

if TYPE_CHECKING:
    # Imported where used: every costline command loads the notifiers (their rule keys),
    # and only the worker sends.
    import aiohttp
    from slack_sdk.web.async_client import AsyncWebClient

DEFAULT_API_URL = "https://slack.com/api/"
TRANSIENT_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error",
                              "service_unavailable", "request_timeout"})
CHANNEL_ERRORS = frozenset({"channel_not_found", "not_in_channel", "is_archived"})
ROOT_GONE_ERRORS = frozenset({"message_not_found", "channel_not_found", "cant_update_message"})
AMBIGUOUS_MARK = "\n_(sent again: an earlier attempt was interrupted)_"


class SlackError(ChannelError):
    """A failed Slack call, described by method and Slack's error code — never the token."""

    def __init__(self, method: str, error: str, status: int | None, *,
                 answered: bool = True) -> None:
        super().__init__(method, error, status, answered=answered, channel="Slack")


class SlackUnavailable(SlackError, Unavailable):
    """Transient: rate limited past the retries, a server error, no connection."""


class SlackRefused(SlackError, Refused):
    """Permanent for this request: retrying the same call cannot succeed."""


class SlackParams(NotifierParams):
    """A Slack channel or user, and the channels of the tag values ``route_by_tag`` names."""

    shorthand: ClassVar[str | None] = "channel"

    channel: Channel | None = Field(
        None, description="channel (#name) or user (@name) the alerts go to; default "
        "COSTLINE_SLACK_FALLBACK_CHANNEL")
    by_tag: dict[str, Channel] = Field(
        default_factory=dict,
        description="tag value → channel, for route_by_tag (a value that is itself a "
        "#channel or @user needs no entry)")

    def published(self, name: str, tag: str | None, value: str | None) -> dict[str, Any]:
        """``slack``, ``route_by_tag`` and ``channel``: the rule's channel, the routing tag,
        and the channel this alert goes to."""
        itself = value is not None and value[:1] in ("#", "@") and len(value) > 1
        found = routed(self.by_tag, value, itself) if tag is not None else None
        return {"slack": self.channel, "route_by_tag": tag, "channel": found or self.channel}


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


@notifier("slack")
class SlackNotifier(Threaded):
    """Posts, updates and threads alert messages in Slack, with buttons to act on them.

    ```yaml
    rules:
      - name: team-monthly
        kind: budget
        group_by: [owner]
        period: month
        limit: 250000
        notify:
          slack: "#ml-budgets"
          route_by_tag: owner
          channels: {alice: "#alice-jobs"}
    ```
    """

    params_model = SlackParams
    follow_steps = (UPDATE, REPLY)

    def __init__(self, *, token: str | Secret | None, ledger: DeliveryLedger | None,
                 fallback_channel: str, base_url: str = DEFAULT_API_URL,
                 channel_by_tag_value: Mapping[str, str] | None = None,
                 min_interval_s: float = 1.0, digest_min: int = 4,
                 rate_limit_retries: int = 5, server_error_retries: int = 3,
                 retry_backoff_s: float = 0.5, timeout_s: float = 15.0) -> None:
        self._token = _secret(token)
        if self._token is not None and ledger is None:
            raise ValueError("a ledger is needed to send: without it a restart would re-post")
        super().__init__(ledger if self._token is not None else None)
        self.fallback_channel = fallback_channel
        self._base_url = base_url
        self._by_tag = dict(channel_by_tag_value or {})
        self._pacer = ChannelPacer(min_interval_s)
        self.digest_min = max(2, digest_min)
        self._retries = (rate_limit_retries, server_error_retries, retry_backoff_s)
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._channel_ids: dict[str, str] = {}
        self._resume_at = 0.0
        """No call before this (monotonic) time: the ``Retry-After`` of Slack's last 429
        that outlasted the client's retries."""

    @classmethod
    def build(cls, setup: Setup) -> SlackNotifier:
        """Sends when ``SLACK_BOT_TOKEN`` is set, and only logs otherwise."""
        settings = setup.settings
        token = settings.slack_bot_token
        return cls(token=token, ledger=setup.ledger("slack") if token is not None else None,
                   fallback_channel=settings.slack_fallback_channel,
                   base_url=settings.slack_api_url,
                   channel_by_tag_value=settings.slack_channels)

    def __repr__(self) -> str:
        return f"SlackNotifier(base_url={self._base_url!r}, sending={self.sending})"

    def wants(self, change: AlertChange) -> bool:
        """Slack is also where alerts go when their rule names no notifier (no ``notify``,
        or ``route_by_tag`` alone)."""
        return "slack" in change.notify or not any(name in change.notify for name in NOTIFIERS)

    # ── lifecycle ─────────────────────────────────────────────────────────────────────────

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._client = None

    def _web_client(self) -> AsyncWebClient:
        """One HTTP session for all calls, created inside the running loop."""
        if self._client is None:
            import aiohttp
            from slack_sdk.http_retry.builtin_async_handlers import (
                AsyncConnectionErrorRetryHandler,
                AsyncRateLimitErrorRetryHandler,
                AsyncServerErrorRetryHandler,
            )
            from slack_sdk.web.async_client import AsyncWebClient

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

    def not_configured(self, change: AlertChange) -> str:
        return f"Slack not configured; {self.route(change)} would get: {fallback_text(change)}"

    # ── delivery ──────────────────────────────────────────────────────────────────────────

    async def ready(self, destination: str) -> None:
        """Wait out a 429's ``Retry-After`` and the channel's pace."""
        await self._hold_off()
        await self._pacer.wait(self._channel_ids.get(destination, destination))

    async def open(self, changes: Sequence[AlertChange], destination: str) -> ThreadRef:
        message = message_for(changes)
        return await self._post(destination, message.text, message.blocks, paced=True)

    async def before_reply(self, change: AlertChange, thread: ThreadRef,
                           members: list[Member], mine: Member | None,
                           previous: AlertChange | None, steps: dict[str, str]
                           ) -> list[Delivery] | None:
        """Re-render the root from all of its alerts; a root that is gone starts anew."""
        if done(steps.get(UPDATE)):
            return None
        ledger = self.ledger
        order = mine.order if mine else len(members)
        shown = [change if m.thread_key == change.thread_key else
                 AlertChange.from_record(m.record) for m in members]
        if mine is None:
            shown.append(change)
        message = message_for(shown, await ledger.notes(thread))
        try:
            await self._call("chat.update", channel=thread.destination, ts=thread.ref,
                             text=message.text, blocks=message.blocks)
        except SlackRefused as exc:
            if exc.error not in ROOT_GONE_ERRORS:
                return [self.refused(change, exc)]
            self.log.warning("root of alert %s is gone (%s); posting it anew",
                             change.alert_id, exc.error)
            return await self.post_root([change])
        await ledger.set_member(thread, change.thread_key, change.record,
                                previous.record if previous else None, order)
        await ledger.finish(change.thread_key, change.change_key, UPDATE, thread.ref)
        self.stats["updated"] += 1
        return None

    async def follow(self, change: AlertChange, thread: ThreadRef,
                     previous: AlertChange | None, again: bool) -> str:
        """Reply in the root's thread with what changed."""
        text = render_change_reply(change, previous)
        if again:
            text += AMBIGUOUS_MARK
        reply = await self._post(thread.destination, text, None, thread_ts=thread.ref,
                                 paced=True)
        return reply.ref

    # ── notes from people (buttons) ───────────────────────────────────────────────────────

    async def annotate(self, channel: str, ts: str, note: str) -> None:
        """Say on the message who did what: a line on the root and a reply in its thread."""
        if self._token is None:
            self.log.info("Slack not configured; note for %s %s: %s", channel, ts, note)
            return
        ledger = self.ledger
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

    async def _hold_off(self) -> None:
        delay = self._resume_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _post(self, channel: str, text: str, blocks: list[Block] | None, *,
                    thread_ts: str | None = None, paced: bool = False) -> ThreadRef:
        """``chat.postMessage`` at the channel's pace (``paced``: the caller already waited
        for it); an unknown channel → the fallback."""
        if not paced:
            await self.ready(channel)
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
            self.log.warning("Slack channel %s refused (%s); using %s", channel, exc.error,
                             self.fallback_channel)
            self.stats["fallbacks"] += 1
            return await self._post(self.fallback_channel, text, blocks)
        ref = ThreadRef(str(answer["channel"]), str(answer["ts"]))
        if channel not in self._channel_ids:
            self._channel_ids[channel] = ref.destination
            self._pacer.alias(channel, ref.destination)
        return ref

    async def _call(self, method: str, **params: Any) -> dict[str, Any]:
        """One API call; Slack's exception is replaced by ours, which carries no request.
        A 429 holds back every later call, in this delivery or the next, until its
        ``Retry-After`` has passed."""
        import aiohttp

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
