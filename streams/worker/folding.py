"""Parsing, pricing and folding a take of messages: in the worker's own process, or in a child
process beside it.

Folding is most of the aggregation's CPU (parsing alone is a third of it). In a child process it
no longer shares the worker's interpreter lock with Faust and the Kafka client: the worker's
process moves messages and writes windows to Redis while the child folds the take before, so a
worker uses two cores instead of one. What crosses between them is small beside the work it saves:
the messages' bytes one way, and per partition the refused messages and the folded sums (cells,
tag sets, event digests) the other.

Takes are answered in the order they were submitted. A child that dies is started again and
given the takes it had not answered; a worker that dies closes its end, and the child exits.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import traceback
from collections import deque
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from costline.rules.events import Rejection, parse_message
from costline.rules.prices import PriceBook, PricingError
from costline.rules.tally import Folder, Tally
from costline.streams.worker import child_process, collector

log = logging.getLogger("costline.folding")

PROCESS_NAME = "costline-folder"


@dataclass(slots=True)
class Screened:
    """One partition's messages of a take, screened and folded: the refused ones as (index in
    the partition's messages, code, reason), and the sums of the others (an event sent twice
    within them counted once)."""

    refused: list[tuple[int, str, str]]
    tally: Tally


def screen(folder: Folder, values: Sequence[bytes], skip: Set[bytes] = frozenset()) -> Screened:
    """Parse, price and fold messages; a message is counted whole or refused whole, and an
    event whose digest is in ``skip`` (counted before) is not counted again.

    Each message is folded as soon as it is priced, so its events are freed before the next
    one is parsed. Parsing a whole take first kept its events alive together (10,000 for 100
    batch messages): the collector walked them at each young collection, and they filled the
    CPU's caches. The take cost 10.99–11.52 CPU-µs per event that way, 9.51–10.05 with the
    collector off, against 7.81–8.26 message by message (``bench/stages.py --take 100``, two
    runs)."""
    refused: list[tuple[int, str, str]] = []
    tally = Tally()
    for index, value in enumerate(values):
        verdict = parse_message(value)
        if isinstance(verdict, Rejection):
            refused.append((index, verdict.code, verdict.reason))
            continue
        try:
            priced = folder.price(verdict.events, verdict.times)
        except PricingError as exc:
            refused.append((index, exc.code, exc.reason))
            continue
        folder.fold(tally, priced, skip)
    return Screened(refused, tally)


class Folding(Protocol):
    depth: int  # takes the aggregator may leave unanswered while it takes more

    def start(self) -> None:
        """Be ready to fold (a child process takes a second or two to start)."""

    def submit(self, takes: list[list[bytes]]) -> asyncio.Future[list[Screened]]:
        """Screen each partition's messages of a take; the answer keeps their order."""


class InlineFolding:
    """Folds in the worker's own process, before ``submit`` returns."""

    depth = 0

    def __init__(self, folder: Folder) -> None:
        self.folder = folder

    def start(self) -> None:
        pass

    def submit(self, takes: list[list[bytes]]) -> asyncio.Future[list[Screened]]:
        answer: asyncio.Future[list[Screened]] = asyncio.get_running_loop().create_future()
        answer.set_result([screen(self.folder, values) for values in takes])
        return answer


class FoldingDied(RuntimeError):
    """The child process failed to answer and could not be started again."""


class ProcessFolding:
    """Folds in a child process while the worker takes the next takes.

    The two speak over a socket pair, in frames (an 8-byte length, then msgpack), read and
    written by the worker's event loop itself: a thread handing answers over would wait for
    the interpreter lock behind the busy loop, for as long as a take takes to fold.
    """

    # Of the takes left with the child (``depth``, COSTLINE_FOLDING_TAKES), the ones written
    # to it: the one it folds and the next. The others wait as the messages' own bytes, not
    # as a second copy in the socket's buffer.
    SENT_AHEAD = 2

    def __init__(self, prices: PriceBook, depth: int = 4) -> None:
        self.prices = prices
        # Takes submitted and not yet answered beyond which the worker waits. A take waits
        # for its window's write when the window is full: takes queued behind it keep the
        # child folding meanwhile.
        self.depth = depth
        self._pending: deque[tuple[list[list[bytes]], asyncio.Future[list[Screened]]]] = deque()
        self._sent = 0  # of the pending takes, those written to the child
        self._process: Any = None
        self._writer: asyncio.StreamWriter | None = None  # once connected to this child
        self._reading: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def in_hand(self) -> int:
        """Takes submitted and not yet answered."""
        return len(self._pending)

    def start(self) -> None:
        if self._process is None:
            self._spawn()

    def submit(self, takes: list[list[bytes]]) -> asyncio.Future[list[Screened]]:
        answer: asyncio.Future[list[Screened]] = asyncio.get_running_loop().create_future()
        self.start()
        self._pending.append((takes, answer))
        self._send()
        return answer

    def _send(self) -> None:
        writer = self._writer
        while writer is not None and self._sent < min(len(self._pending), self.SENT_AHEAD):
            blob = msgpack.packb(self._pending[self._sent][0])
            writer.write(len(blob).to_bytes(_HEADER, "big"))
            writer.write(blob)
            self._sent += 1

    def close(self) -> None:
        """Stop the child; takes still unanswered stay so."""
        process, self._process, self._writer = self._process, None, None
        if self._reading is not None:
            self._reading.cancel()
        if process is not None:
            process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        process = child_process.start(PROCESS_NAME, child_main, self.prices, theirs)
        theirs.close()
        self._process, self._writer = process, None
        self._reading = asyncio.ensure_future(self._read(process, ours))
        log.info("folding process started (pid %d)", process.pid)

    async def _read(self, process: Any, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            if process is not self._process:
                return
            # Takes submitted while it started, or left unanswered by the child before it.
            self._writer, self._sent = writer, 0
            self._send()
            while True:
                size = int.from_bytes(await reader.readexactly(_HEADER), "big")
                self._answered(await reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the child is gone
        finally:
            writer.close()
        if process is self._process:
            self._died()

    def _answered(self, data: bytes) -> None:
        _, answer = self._pending.popleft()
        self._sent -= 1
        self._send()
        if answer.done():
            return
        try:
            answer.set_result(_unpack_answer(data))
        except Exception as exc:  # noqa: BLE001 - the agent waiting for it raises it
            answer.set_exception(exc)

    def _died(self) -> None:
        code = self._process.exitcode if self._process is not None else None
        log.error("the folding process ended (exit code %s); starting a new one for %d "
                  "unanswered takes", code, len(self._pending))
        self._process = self._writer = None
        try:
            self._spawn()
        except Exception as exc:  # noqa: BLE001 - every waiting take learns why
            while self._pending:
                _, answer = self._pending.popleft()
                if not answer.done():
                    answer.set_exception(FoldingDied(f"the folding process could not be "
                                                     f"started again: {exc}"))


class FoldingPool:
    """Several folding processes. One alone is a worker's busiest process on 100-event
    messages (~90 % of a core) while the machine's CPUs are not all busy. A take goes to the
    first process that has fewer than ``SPILL_AT`` takes in hand, else to the one with the
    fewest: while the first keeps up the others stay idle, so small takes (single-event
    messages, where the worker's own process is the busiest) are not spread over processes
    that would contend for the CPUs. The aggregator waits for the answers in the order it
    submitted the takes; each process keeps its own cache of tag sets."""

    SPILL_AT = 2  # a take being folded and the next one sent (``ProcessFolding.SENT_AHEAD``)

    def __init__(self, members: Sequence[ProcessFolding], depth: int) -> None:
        self.members = list(members)
        # Takes left with the processes in all: as many as one process would be left with,
        # so a second process costs the worker no more messages held (with twice as many, a
        # worker on a 48-partition backlog peaked at 309 MiB instead of 259).
        self.depth = depth

    @property
    def pids(self) -> list[int | None]:
        return [member.pid for member in self.members]

    def start(self) -> None:
        for member in self.members:
            member.start()

    def submit(self, takes: list[list[bytes]]) -> asyncio.Future[list[Screened]]:
        member = next((m for m in self.members if m.in_hand < self.SPILL_AT), None)
        if member is None:
            member = min(self.members, key=lambda m: m.in_hand)
        return member.submit(takes)

    def close(self) -> None:
        for member in self.members:
            member.close()


_HEADER = 8  # bytes of a frame's length


def child_main(prices: PriceBook, sock: socket.socket) -> None:
    """The child: fold the takes the worker sends until it closes its end."""
    folder = Folder(prices)
    collector.settle()
    with sock:
        while (data := _receive(sock)) is not None:
            try:
                blob = _pack_answer([screen(folder, values) for values in msgpack.unpackb(data)])
            except Exception as exc:  # noqa: BLE001 - the worker reports it
                blob = msgpack.packb(["error", "".join(traceback.format_exception(exc)), []])
            try:
                sock.sendall(len(blob).to_bytes(_HEADER, "big"))
                sock.sendall(blob)
            except OSError:
                return  # the worker is gone


def _pack_answer(screened: list[Screened]) -> bytes:
    """msgpack, not pickle: what crosses is data, never code. A sum beyond 64 bits (refused
    later, when it is added to Redis's) crosses as its decimal text."""
    parts = [[s.refused, s.tally.packed()] for s in screened]
    try:
        return msgpack.packb(["ok", False, parts])  # type: ignore[no-any-return]
    except OverflowError:
        for _, packed in parts:
            _convert_sums(packed[0], str)
        return msgpack.packb(["ok", True, parts])  # type: ignore[no-any-return]


def _unpack_answer(data: bytes) -> list[Screened]:
    kind, detail, parts = msgpack.unpackb(data, strict_map_key=False)
    if kind != "ok":
        raise RuntimeError(f"folding failed in the child: {detail}")
    answer = []
    for refused, packed in parts:
        if detail:  # sums sent as text
            _convert_sums(packed[0], int)
        answer.append(Screened([tuple(r) for r in refused], Tally.unpacked(packed)))
    return answer


def _convert_sums(sums: list[Any], kind: type) -> None:
    """The cells of ``Tally.packed``'s sums (every third item), their values as ``kind``."""
    for index in range(2, len(sums), 3):
        sums[index] = {measure: kind(micro) for measure, micro in sums[index].items()}


def _receive(sock: socket.socket) -> bytearray | None:
    """One frame, or None once the worker has closed its end."""
    header = _exactly(sock, _HEADER)
    return None if header is None else _exactly(sock, int.from_bytes(header, "big"))


def _exactly(sock: socket.socket, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = sock.recv_into(view[got:])
        if not count:
            return None
        got += count
    return buffer
