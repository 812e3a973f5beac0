"""How the worker's Kafka consumer hands each fetched message to the agents' streams, and
what else the worker's Faust app leaves out of every message's way (see ``App``).

Faust's consumer delivers every message as ``wait_first(callback(message),
suspend_flow.wait())``: four tasks and three cancellations per message, so that a delivery
blocked by flow control (a rebalance, a full stream buffer) can be abandoned when the flow is
suspended. Most deliveries do not block: they put the message in a stream's queue and
return. The worker's app with a no-op handler (``bench/throughput.py``'s (b)) spent 51-54
CPU-us per single-event message with this hand-off and 101-131 on Faust's own consumer
(alternating runs); 25.6-28.2 once the consumer also waited for room (``wait_for_room``).

``HandOffConsumer`` runs the delivery inline up to its first suspension. When it completes
there, as most do, no task is made. When it suspends (its stream's buffer is full, the flow is
being suspended), the rest of it runs exactly as Faust runs it: raced against the flow's
suspension, in the consumer's ``wait_first`` (mode's ``Service``). The first step runs in the
consumer's fetch task, not in a task of its own: Faust's delivery path neither looks at the
current task nor sets context variables. After a delivery that suspended, the consumer lets
the stream's buffer drain before it delivers more (``wait_for_room``). It also polls the Kafka
client in short steps (``_getmany``), each taking about ``POLL_BYTES`` of messages
(``PollByBytes``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator, Mapping, Sequence
from time import monotonic
from typing import Any, cast

import faust
from faust.sensors import Sensor
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import TP, TransportT
from mode import Service


class _Resume:
    """Awaits a coroutine that already ran up to its first suspension, where it waits on
    ``waiting_on``: it hands that on to the task awaiting this, as the coroutine's own task
    would have, and drives the coroutine on from there (cancellation included)."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self.coro, self.waiting_on = coro, waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting_on = self.coro, self.waiting_on
        while True:
            try:
                sent = yield waiting_on
            except BaseException as exc:  # noqa: BLE001 - thrown in by the task: pass it on
                step, arg = coro.throw, exc
            else:
                step, arg = coro.send, sent
            try:
                waiting_on = step(arg)
            except StopIteration as done:
                return done.value
            finally:
                del arg  # a thrown exception holds this frame through its traceback


async def resumed(coro: Coroutine[Any, Any, Any], waiting_on: Any) -> Any:
    return await _Resume(coro, waiting_on)


def first_step(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run ``coro`` up to its first suspension: (True, its result) when it finished there,
    else (False, what it waits on). Its exceptions propagate."""
    try:
        return False, coro.send(None)
    except StopIteration as done:
        return True, done.value


# The longest one poll of the Kafka client waits for records (see ``_getmany``).
POLL_S = 0.05
# After a delivery found a stream's buffer full, the consumer waits until this share of the
# buffer is free again, looking every ``ROOM_POLL_S`` (see ``wait_for_room``).
ROOM_SHARE = 0.1
ROOM_POLL_S = 0.002
# About how many bytes of messages one poll of the Kafka client takes (see ``PollByBytes``),
# and how many messages the first poll takes, before their size is known.
POLL_BYTES = 32 * 1024 * 1024
FIRST_POLL_MESSAGES = 1024


def messages_per_poll(records: Mapping[Any, Sequence[Any]], current: int,
                      poll_bytes: int = POLL_BYTES) -> int:
    """How many messages the next poll may take to hold about ``poll_bytes``, judged by the
    messages of the last one (``current`` again when it took none)."""
    count = sum(map(len, records.values()))
    if not count:
        return current
    size = sum(len(record.value or b"") for batch in records.values() for record in batch)
    return max(1, poll_bytes * count // max(size, 1))


class PollByBytes(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, whose polls take about the app's ``poll_bytes`` of
    messages (``POLL_BYTES`` by default, COSTLINE_POLL_BYTES).

    Unbounded (Faust's default), a poll turns all that was fetched for every owned partition
    into messages at once: one worker owning 24 partitions peaked at 321-335 MiB on a backlog
    of 100-event messages (``bench/throughput.py --scale 1 --scale-partitions 24``), 241-256
    MiB with polls of 1,024 messages (six runs). A fixed count costs small messages dearly,
    each poll having its own price: the no-op agent took 16,900-19,200 single-event
    messages/s with polls of 1,024, 21,600-22,600 with 8,192 and 23,500-25,800 unbounded
    (alternating runs, ``--events 100000 --tagsets 20000 --single-events 100000 --scale 0``).
    Bounded in bytes, the 24-partition worker peaked at 243-246 MiB and the no-op agent took
    22,800-23,400 single-event messages/s: ~1,000 batch messages a poll, ~100,000 single
    events. Faust's ``broker_max_poll_records``, when set, still caps the count."""

    poll_messages = FIRST_POLL_MESSAGES

    async def _fetch_records(self, consumer: Any, active_partitions: Any,
                             timeout: float | None = None, max_records: int | None = None) -> Any:
        limit = min(self.poll_messages, max_records or self.poll_messages)
        records = await super()._fetch_records(consumer, active_partitions, timeout=timeout,
                                               max_records=limit)
        self.poll_messages = messages_per_poll(records, self.poll_messages,
                                               getattr(self.app, "poll_bytes", POLL_BYTES))
        return records


class HandOffConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer, delivering messages without a task each (see above), with
    polls bounded in bytes (``PollByBytes``)."""

    def _new_consumer_thread(self) -> PollByBytes:
        return PollByBytes(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: Any, timeout: float) -> Any:
        # Faust polls the client for up to a second. Right after a poll that took a fetch's
        # records, the next poll was seen to wait out that whole second and return nothing,
        # with every partition active (none paused for a full stream buffer), though the
        # client logged the next fetch's records within milliseconds of it starting (a no-op
        # agent on 2,002 batch messages: 1.3 s, one second of it in one such poll; 0.36 s with
        # short polls). Why the client's waiter was not woken was not pinned down; Faust's
        # slower hand-off seldom polled that early. Short polls bound the wait. (With every
        # partition paused Faust sleeps a second without polling; that was not seen here.)
        return await super()._getmany(active_partitions, min(timeout, POLL_S))

    async def hand_off(self, message: Any) -> None:
        coro = self.callback(message)
        finished, waiting_on = first_step(coro)
        if not finished:
            rest = asyncio.ensure_future(resumed(coro, waiting_on))
            # a delivery abandoned before its task ran is closed now, not when collected
            rest.add_done_callback(lambda _: coro.close())
            await self.wait_first(rest, self.suspend_flow.wait())
            await self.wait_for_room(message.tp)

    async def wait_for_room(self, tp: Any) -> None:
        """Before the next delivery, let the stream buffers ``tp`` feeds drain until a
        ``ROOM_SHARE`` of each is free.

        A delivery mostly suspends because its stream's buffer is full: the agent is slower
        than Kafka. Once full, a buffer that is only refilled as the agent frees room stays at
        the brim, and deliveries keep suspending, each paying for Faust's put task and the
        hand-off's race: 6% of a profile of the single-event worker (py-spy, 100 of 1,708
        samples) was that path. With the wait the next deliveries run inline until the buffer
        is full again: the worker took 43.5 and 50.6 CPU-us per single-event message instead of
        65.2 and 68.3 (``bench/throughput.py``, alternating runs, waiting for 60% of the
        buffer; a tenth did as well within this machine's noise). A tenth is room for an
        agent's take (100 messages of the default 1,024) and no more: no partition's messages
        are delivered meanwhile, so a buffer drained slowly (alerts held up by Slack) holds up
        the others about as long as Faust's own blocked delivery would. Checked every
        ``ROOM_POLL_S``; a suspended flow (a rebalance) or a stopping consumer ends the wait."""
        buffers = [chan.queue for chan in self.app.topics._tp_index.get(tp, ())]
        # the most each may hold for deliveries to go on
        limits = [b.maxsize - max(1, int(b.maxsize * ROOM_SHARE)) for b in buffers]
        while not (self.suspend_flow.is_set() or self.should_stop):
            if all(b.qsize() <= limit for b, limit in zip(buffers, limits, strict=True)):
                return
            await asyncio.sleep(ROOM_POLL_S)

    async def _drain_messages(self, fetcher: Any) -> None:
        # Faust 0.15.3's loop (faust.transport.consumer.Consumer._drain_messages) with one
        # change: ``hand_off`` where it awaits ``wait_first(callback(message), ...)``.
        hand_off = self.hand_off
        getmany = self.getmany
        consumer_should_stop = cast(Service, self)._stopped.is_set
        fetcher_should_stop = cast(Service, fetcher)._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        yield_every, num_since_yield = 100, 0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                ait = getmany(timeout=1.0)
                # getmany can return at once many times over: let the loop run between
                await self.sleep(0)
                if not self.should_stop:
                    async for tp, message in ait:
                        num_since_yield += 1
                        if num_since_yield > yield_every:
                            await asyncio.sleep(0)
                            num_since_yield = 0
                        offset = message.offset
                        r_offset = get_read_offset(tp)
                        if r_offset is not None and offset < r_offset:
                            continue  # read before: Faust drops it too
                        gap = offset - (r_offset or 0)
                        if gap > 1 and r_offset and acks_enabled_for(message.topic):
                            await self._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        await hand_off(message)
                        set_read_offset(tp, offset)
                unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)


class RawSchema(faust.Schema):
    """Keys and values as the bytes Kafka holds: the agent decodes them itself. Faust's own
    decoder looks up both serializers for every message to return the same bytes."""

    def __init__(self) -> None:
        super().__init__(key_serializer="raw", value_serializer="raw")

    def compile(self, app: Any, **kwargs: Any) -> Any:
        event = app.conf.Event

        async def decode(message: Any, *, propagate: bool = False) -> Any:
            return event(app, message.key, message.value, message.headers, message)
        return decode


# Two more costs Faust pays on every delivered message, which the worker has no use for: in a
# profile of the single-event worker (py-spy, ``bench/throughput.py --profile-case single``),
# 4% of its busy samples went to the producer buffer's size and 6% to the Monitor sensor.
# ``bench/faust_app.py`` times both against Faust's: 1.2-2.1 against 6.6-8.4 us per message
# (four runs).


class UnthreadedBuffer(ProducerBuffer):
    """Faust's producer buffer, for a producer that is not threaded. Faust's consumer asks its
    size before every message it delivers (``wait_until_ebb``), and Faust's ``size`` looks
    ``producer_threaded`` up in the settings each time, slowly, to choose a queue."""

    @property
    def size(self) -> int:
        return self.pending.qsize()


class Producer(faust_aiokafka.Producer):
    """Faust's aiokafka producer with an ``UnthreadedBuffer`` when it is not threaded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.app.conf.producer_threaded:
            # In place of the one Faust made, which only the service graph holds before the
            # app starts: it leaves the graph too.
            self.buffer.beacon.detach(self.beacon)
            self.buffer = UnthreadedBuffer(loop=self.loop, beacon=self.beacon)
            self.buffer.app = self.app


class HandOffTransport(faust_aiokafka.Transport):
    Consumer = HandOffConsumer
    Producer = Producer


class InboundTimes(Sensor):
    """The one figure of Faust's Monitor the worker keeps: when a stream last took an event of
    each partition (the Monitor's ``stream_inbound_time``). Faust's consumer reads it to log a
    partition whose stream has taken nothing for ``stream_processing_timeout`` while Kafka
    holds more: without it, every partition of a backlog looks stalled."""

    def __init__(self, times: dict[TP, float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times = times

    def on_stream_event_in(self, tp: TP, offset: int, stream: Any, event: Any) -> None:
        self.times[tp] = monotonic()  # the Monitor's clock for it


class App(faust.App):
    """A Faust app whose consumer is a ``HandOffConsumer``, whose producer's buffer is an
    ``UnthreadedBuffer``, and whose only sensor is ``InboundTimes``.

    Faust's Monitor sensor keeps statistics for Faust's own web pages (``/stats/``, served
    only in Faust's debug mode) from calls on every message and every event: costline's
    ``/metrics`` has its own counters. The Monitor still exists, unstarted, for the consumer's
    direct calls (end offsets, commits, the inbound times ``InboundTimes`` records)."""

    _inbound_times: InboundTimes | None = None
    poll_bytes = POLL_BYTES  # what a poll of the Kafka client takes (``PollByBytes``)

    def _new_transport(self) -> TransportT:
        return HandOffTransport(self.conf.broker_consumer, self)

    def on_init_dependencies(self) -> Any:
        services = super().on_init_dependencies()  # adds the Monitor to the sensors
        self.sensors.remove(self.monitor)
        if self._inbound_times is None:
            self._inbound_times = InboundTimes(self.monitor.stream_inbound_time)
            self.sensors.add(self._inbound_times)
        return services
