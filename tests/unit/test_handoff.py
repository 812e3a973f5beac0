"""The consumer's hand-off: a delivery that does not block runs inline, one that does runs as
Faust runs it (raced against the flow's suspension), and the coroutine sees what it would have
seen in a task of its own: results, exceptions, cancellation."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import defaultdict
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.transport.conductor import Conductor
from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP
from mode import Service
from mode.utils.queues import FlowControlEvent, FlowControlQueue

from costline.streams.settings import Settings
from costline.streams.worker.app import Wiring, faust_app
from costline.streams.worker.folding import FoldingPool, ProcessFolding
from costline.streams.worker.handoff import (
    FIRST_POLL_MESSAGES,
    POLL_BYTES,
    App,
    HandOffConsumer,
    InboundTimes,
    PollByBytes,
    RawSchema,
    UnthreadedBuffer,
    first_step,
    messages_per_poll,
    resumed,
)

TP0 = TP("t", 0)


class Msg(str):
    """A message of partition ``TP0`` (a string, so deliveries can show what they got)."""

    tp = TP0


class FakeConsumer(Service):
    """What ``HandOffConsumer.hand_off`` uses of a consumer: its callback, its flow
    suspension event, mode's ``wait_first`` and the stream buffers each partition feeds."""

    def __init__(self, callback: Any, buffers: list[FlowControlQueue] | None = None) -> None:
        super().__init__()
        self.callback = callback
        self.suspend_flow = asyncio.Event()
        channels = [SimpleNamespace(queue=queue) for queue in buffers or []]
        self.app = SimpleNamespace(topics=SimpleNamespace(_tp_index={TP0: channels}))

    hand_off = HandOffConsumer.hand_off
    wait_for_room = HandOffConsumer.wait_for_room


async def test_a_delivery_that_does_not_block_finishes_inline_without_a_task() -> None:
    delivered: list[int] = []

    async def deliver(message: int) -> None:
        delivered.append(message)

    before = len(asyncio.all_tasks())
    consumer = FakeConsumer(deliver)
    made: list[Any] = []
    loop = asyncio.get_running_loop()
    loop.set_task_factory(lambda loop, coro, **kw: made.append(coro) or asyncio.Task(
        coro, loop=loop, **kw))
    try:
        for n in range(3):
            await consumer.hand_off(n)
    finally:
        loop.set_task_factory(None)
    assert delivered == [0, 1, 2]
    assert made == []
    assert len(asyncio.all_tasks()) == before


async def test_a_blocked_delivery_resumes_with_what_it_waited_for() -> None:
    room = asyncio.get_running_loop().create_future()
    got: list[Any] = []

    async def deliver(message: str) -> str:
        await asyncio.sleep(0)  # a bare yield first
        got.append(await room)
        return message.upper()

    consumer = FakeConsumer(deliver)
    handing = asyncio.ensure_future(consumer.hand_off(Msg("m")))
    await asyncio.sleep(0.01)
    assert not handing.done() and got == []
    room.set_result("room")
    await asyncio.wait_for(handing, 1)
    assert got == ["room"]


async def test_a_blocked_delivery_is_abandoned_when_the_flow_is_suspended() -> None:
    outcome: list[str] = []

    async def deliver(message: str) -> None:
        try:
            await asyncio.Event().wait()  # a stream buffer that never drains
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("delivered")

    consumer = FakeConsumer(deliver)
    handing = asyncio.ensure_future(consumer.hand_off(Msg("m")))
    await asyncio.sleep(0.01)
    consumer.suspend_flow.set()
    await asyncio.wait_for(handing, 1)
    await asyncio.sleep(0)
    assert outcome == ["cancelled"]


async def test_exceptions_reach_the_coroutine_and_the_hand_off() -> None:
    fut = asyncio.get_running_loop().create_future()

    async def deliver(message: str) -> None:
        try:
            await fut
        except KeyError:
            raise ValueError(f"bad {message}") from None

    consumer = FakeConsumer(deliver)
    handing = asyncio.ensure_future(consumer.hand_off(Msg("m")))
    await asyncio.sleep(0.01)
    fut.set_exception(KeyError("k"))
    with pytest.raises(ValueError, match="bad m"):
        await asyncio.wait_for(handing, 1)

    async def fails_at_once(message: str) -> None:
        raise RuntimeError(message)

    with pytest.raises(RuntimeError, match="now"):
        await FakeConsumer(fails_at_once).hand_off("now")


def _full_buffer(size: int = 20) -> FlowControlQueue:
    flow = FlowControlEvent(initially_suspended=False)
    buffer: FlowControlQueue = FlowControlQueue(maxsize=size, flow_control=flow)
    for n in range(size):
        buffer.put_nowait(n)
    return buffer


async def test_after_a_full_buffer_deliveries_wait_until_a_tenth_of_it_is_free() -> None:
    buffer = _full_buffer()
    consumer = FakeConsumer(buffer.put, [buffer])
    handing = asyncio.ensure_future(consumer.hand_off(Msg("m")))
    await asyncio.sleep(0.01)
    assert not handing.done()  # the buffer is full: the delivery waits
    buffer.get_nowait()  # the agent takes one: the delivery is put, the buffer is full again
    await asyncio.sleep(0.01)
    assert buffer.qsize() == 20 and not handing.done()
    buffer.get_nowait()
    await asyncio.sleep(0.01)
    assert buffer.qsize() == 19 and not handing.done()
    buffer.get_nowait()
    await asyncio.wait_for(handing, 1)  # 2 of 20 free: the next deliveries run inline


async def test_waiting_for_room_ends_when_the_flow_is_suspended() -> None:
    buffer = _full_buffer()
    consumer = FakeConsumer(buffer.put, [buffer])
    handing = asyncio.ensure_future(consumer.hand_off(Msg("m")))
    await asyncio.sleep(0.01)
    buffer.get_nowait()
    await asyncio.sleep(0.01)
    assert not handing.done()
    consumer.suspend_flow.set()
    await asyncio.wait_for(handing, 1)
    assert buffer.qsize() == 20


async def test_a_resumed_coroutine_that_catches_cancellation_goes_on() -> None:
    later = asyncio.get_running_loop().create_future()

    async def stubborn() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return await later

    coro = stubborn()
    finished, waiting_on = first_step(coro)
    assert not finished
    task = asyncio.ensure_future(resumed(coro, waiting_on))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0.01)
    assert not task.done()  # it caught the cancellation and waits again
    later.set_result("after")
    assert await asyncio.wait_for(task, 1) == "after"


def test_the_worker_app_uses_the_hand_off_consumer_and_a_raw_schema(tmp_path: Any) -> None:
    app = App("handoff-test", broker="kafka://127.0.0.1:1", autodiscover=False)
    assert app.transport.Consumer is HandOffConsumer
    topic = app.topic("t", schema=RawSchema())
    assert (topic.key_serializer, topic.value_serializer) == ("raw", "raw")

    settings = Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1")
    wiring = Wiring(settings)
    assert wiring.app.transport.Consumer is HandOffConsumer
    sources = wiring.topic("usage", "faults")
    assert isinstance(sources.schema, RawSchema)
    assert set(sources.topics) == {settings.topic("usage"), settings.topic("faults")}
    stock = faust_app(settings, app_class=faust.App)
    assert stock.transport.Consumer is not HandOffConsumer


async def test_the_aggregation_takes_its_bounds_from_the_settings(tmp_path: Any) -> None:
    settings = Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1", folding_takes=2,
                        folding_processes=1, unwritten_events=5_000, window_events=500)
    aggregator = Wiring(settings).aggregation()
    assert isinstance(aggregator.folding, ProcessFolding)
    assert aggregator.folding.depth == 2  # the child is started on the first assignment
    assert (aggregator.unwritten_events, aggregator.window_events) == (5_000, 500)
    inline = Wiring(settings.model_copy(update={"folding": "inline"})).aggregation()
    assert inline.folding.depth == 0
    pool = Wiring(settings.model_copy(update={"folding_processes": 3})).aggregation().folding
    assert isinstance(pool, FoldingPool)
    assert len(pool.members) == 3 and pool.depth == 2  # in all, as one process would have


async def test_the_worker_app_sizes_its_producer_buffer_and_runs_without_the_monitor(
        tmp_path: Any) -> None:
    """The buffer's size (asked before every delivery) counts the messages waiting to be
    produced; the Monitor is not among the sensors called on every message, nor started, and
    the one figure of it Faust's consumer reads is kept."""
    app = faust_app(Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1"))
    buffer = app.producer.buffer
    assert isinstance(buffer, UnthreadedBuffer) and buffer.app is app
    # the buffer Faust made left the service graph with it
    assert [node.data for node in app.producer.beacon.children] == [buffer]
    assert buffer.size == 0
    buffer.pending.put_nowait("a")
    buffer.pending.put_nowait("b")
    assert buffer.size == 2
    flushed: list[int] = []

    async def flush_atmost(n: int) -> int:
        flushed.append(n)
        return 0

    buffer.flush_atmost = flush_atmost  # type: ignore[method-assign]
    await buffer.wait_until_ebb()  # 2 waiting, of at most 100: on at once
    assert flushed == []
    buffer.max_messages = 1
    assert buffer.size > buffer.max_messages  # so wait_until_ebb flushes: Faust's rule
    await buffer.wait_until_ebb()
    assert flushed == [1]

    services = list(app.on_init_dependencies())
    assert app.monitor not in set(app.sensors)
    assert app.monitor not in services
    assert app.producer in services
    # What Faust's stall check reads: when a stream last took an event of each partition.
    (inbound,) = app.sensors
    assert isinstance(inbound, InboundTimes)
    before = time.monotonic()
    app.sensors.on_stream_event_in(TP0, 7, None, None)  # type: ignore[arg-type]
    assert before <= app.monitor.stream_inbound_time[TP0] <= time.monotonic()
    list(app.on_init_dependencies())
    assert list(app.sensors) == [inbound]  # once, however often asked

    threaded = App("threaded", broker="kafka://127.0.0.1:1", autodiscover=False,
                   producer_threaded=True)
    assert not isinstance(threaded.producer.buffer, UnthreadedBuffer)
    stock = faust_app(Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1"),
                      app_class=faust.App)
    assert stock.monitor in set(stock.on_init_dependencies()) | set(stock.sensors)


async def test_the_raw_schema_passes_kafkas_bytes_through() -> None:
    app = faust.App("raw-schema-test", broker="kafka://127.0.0.1:1", autodiscover=False)
    decode = RawSchema().compile(app)

    class Message:
        key, value, headers = b"k", b"\xff not json", [("h", b"1")]

    message = Message()
    event = await decode(message)
    assert (event.key, event.value, event.message) == (b"k", b"\xff not json", message)


def test_the_drain_loop_copied_is_the_one_faust_runs() -> None:
    """``HandOffConsumer._drain_messages`` is Faust 0.15.3's loop with one call changed: a
    Faust that delivers messages another way needs it reread."""
    assert faust.__version__ == "0.15.3"
    source = inspect.getsource(FaustConsumer._drain_messages)
    assert "await self.wait_first(\n                                callback(message), " \
           "self.suspend_flow.wait()\n                            )" in source
    ours = inspect.getsource(HandOffConsumer._drain_messages)
    assert "await hand_off(message)" in ours and "self.wait_first(" not in ours
    # ``wait_for_room`` finds a partition's stream buffers in the conductor's index
    assert "self._tp_index = defaultdict(set)" in inspect.getsource(Conductor.__init__)


class DrainStub(Service):
    """What both drain loops use of a consumer, recording what they do: deliveries, read
    offsets, gaps and commits. ``getmany`` hands out ``batches`` and then stops the consumer."""

    consumer_stopped_errors = ()
    hand_off = HandOffConsumer.hand_off
    wait_for_room = HandOffConsumer.wait_for_room

    def __init__(self, batches: list[list[tuple[TP, Any]]]) -> None:
        super().__init__()
        self.batches = batches
        self.delivered: list[tuple[str, int]] = []
        self._read_offset: dict[TP, int | None] = defaultdict(lambda: None)
        self.gaps: list[tuple[TP, int, int]] = []
        self.commits: list[int] = []
        self._commit_every, self._n_acked = 3, 0
        self.suspend_flow = asyncio.Event()
        self.diag = SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None)
        self.app = SimpleNamespace(topics=SimpleNamespace(
            acks_enabled_for=lambda t: t != "noack", _tp_index={}))
        self.transport = SimpleNamespace(app=SimpleNamespace(should_stop=False))

    async def callback(self, message: Any) -> None:
        if message.offset % 4 == 0:
            await asyncio.sleep(0)  # some deliveries suspend, as a full buffer makes them
        self.delivered.append((message.topic, message.offset))
        self._n_acked += 1

    async def getmany(self, timeout: float) -> Any:
        if not self.batches:
            self._stopped.set()
            return
        for item in self.batches.pop(0):
            yield item

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        self.gaps.append((tp, start, end))

    async def commit(self) -> None:
        self.commits.append(len(self.delivered))


def _drained(drain: Any) -> DrainStub:
    def batch(topic: str, *offsets: int) -> list[tuple[TP, Any]]:
        tp = TP(topic, 0)
        return [(tp, SimpleNamespace(topic=topic, offset=o, key=None, value=b"", tp=tp))
                for o in offsets]

    stub = DrainStub([
        batch("t", 0, 1, 2, 3, 4),
        batch("t", 3, 4, 5, 9, 10) + batch("noack", 0, 5),  # re-read, then a gap
        [],
        batch("t", 11, 20, 21, 22, 23, 24) + batch("u", 7, 8),  # "u" starts at 7: no gap
    ])
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    asyncio.get_event_loop().run_until_complete(drain(stub, fetcher))
    return stub


def test_the_drain_loop_does_what_fausts_does_with_every_message() -> None:
    """Deliveries, read offsets, gaps and commits, message for message, on the same input
    (offsets read before, gaps, a topic without acks, an empty fetch, suspending deliveries)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        faust_run = _drained(FaustConsumer._drain_messages)
        ours = _drained(HandOffConsumer._drain_messages)
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    assert ours.delivered == faust_run.delivered
    assert dict(ours._read_offset) == dict(faust_run._read_offset)
    assert ours.gaps == faust_run.gaps
    assert ours.commits == faust_run.commits
    # offset 3 was read before and is dropped; Faust hands on the last one read (4) again
    assert ours.delivered[:9] == [("t", o) for o in (0, 1, 2, 3, 4, 4, 5, 9, 10)]
    assert ours.gaps == [(TP("t", 0), 6, 9), (TP("t", 0), 12, 20)]  # none on "noack"
    assert ours.commits == [3, 6, 9, 12, 15, 18]


async def polls_asked(thread: PollByBytes, sizes: list[int], cap: int | None = None
                     ) -> list[int | None]:
    """The message counts the thread asks of the client in one poll after another, each
    returning messages of ``sizes`` bytes; Faust's ``cap`` on the last."""
    asked: list[int | None] = []

    async def fetched_records(partitions: Any, timeout: float, max_records: int | None) -> Any:
        asked.append(max_records)
        return {TP0: [SimpleNamespace(value=b"x" * size) for size in sizes]}

    fetcher = SimpleNamespace(_closed=False, fetched_records=fetched_records,
                              _subscriptions=SimpleNamespace(fetch_context=nullcontext))
    consumer = SimpleNamespace(_closed=False, _fetcher=fetcher)
    thread.consumer = SimpleNamespace(flow_active=True)  # type: ignore[assignment]
    await thread._fetch_records(consumer, {TP0}, timeout=0.0, max_records=None)
    await thread._fetch_records(consumer, {TP0}, timeout=0.0, max_records=None)
    if cap is not None:
        await thread._fetch_records(consumer, {TP0}, timeout=0.0, max_records=cap)
    return asked


async def fetch_bytes(app: Any) -> int:
    """What the worker's Kafka client fetches ahead per partition."""
    client = app.consumer._thread._create_worker_consumer(app.transport)
    try:
        return int(client._max_partition_fetch_bytes)
    finally:
        await client.stop()


async def test_the_worker_consumer_holds_a_bounded_share_of_what_it_fetched(
        tmp_path: Any) -> None:
    """Unbounded, one poll turns everything fetched for every owned partition into messages
    at once, so a worker's memory would grow with the partitions it owns."""
    app = faust_app(Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1"))
    thread = app.consumer._thread
    assert isinstance(thread, PollByBytes)
    assert await fetch_bytes(app) == 1024 * 1024
    asked = await polls_asked(thread, [100_000] * 3, cap=50)  # Faust's cap on the third
    # the first poll's count, then the count the first poll's messages showed holds POLL_BYTES
    assert POLL_BYTES // 100_000 != FIRST_POLL_MESSAGES
    assert asked == [FIRST_POLL_MESSAGES, POLL_BYTES // 100_000, 50]


async def test_an_operator_sizes_the_polls_and_the_fetches(tmp_path: Any) -> None:
    app = faust_app(Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1",
                             poll_bytes=1_000_000, fetch_bytes=256 * 1024))
    assert await fetch_bytes(app) == 256 * 1024
    assert await polls_asked(app.consumer._thread, [1_000] * 3) == [FIRST_POLL_MESSAGES, 1_000]


def test_a_poll_takes_about_poll_bytes_of_messages() -> None:
    def records(*sizes: int) -> dict[str, list[Any]]:
        return {"tp": [SimpleNamespace(value=b"x" * size) for size in sizes]}

    assert messages_per_poll(records(330, 330), 7) == POLL_BYTES // 330  # single events
    assert messages_per_poll(records(33_000, 35_000), 7) == POLL_BYTES // 34_000
    assert messages_per_poll(records(), 7) == 7  # nothing taken: nothing learnt
    assert messages_per_poll({"tp": [SimpleNamespace(value=None)]}, 7) == POLL_BYTES
    assert messages_per_poll(records(64 * 1024 * 1024), 7) == 1  # still one message
    assert messages_per_poll(records(330, 330), 7, poll_bytes=3_300) == 10
