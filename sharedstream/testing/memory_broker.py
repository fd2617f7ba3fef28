"""The in-memory broker itself: what a real broker module gets from its SDK.

A :class:`MemoryBroker` holds *streams* (a topic, a queue), each made of
*lanes* (a partition, a FIFO message group): append-only lists of
:class:`MemoryRecord`, numbered from offset 0, with committed offsets
(cumulative acknowledgement), leases and deletions (per-message
acknowledgement). Brokers are found by name (:meth:`MemoryBroker.named`),
because a trigger is rebuilt from its kwargs and can only carry names. The
broker module built on it is :mod:`sharedstream.testing.memory`.

Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from sharedstream.brokerkit.codecs import DecodeCache

__all__ = ["Delivery", "MemoryBroker", "MemoryRecord"]


class MemoryRecord(DecodeCache):
    """One message: where it is, its value and headers. The raw event the filters receive.

    A :class:`~sharedstream.brokerkit.codecs.DecodeCache`: each payload
    format decodes the value once for every trigger of the stream.
    """

    __slots__ = ("headers", "lane", "offset", "stream", "value")

    def __init__(self, stream: str, lane: str, offset: int, value: bytes | None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.stream, self.lane, self.offset, self.value = stream, lane, offset, value
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def name(self) -> str:
        """``stream/lane/offset``: the same for every delivery of the record."""
        return f"{self.stream}/{self.lane}/{self.offset}"

    def raw_bytes(self) -> bytes | None:
        """The value, for the payload formats that decode it."""
        return self.value

    def __repr__(self) -> str:
        return f"MemoryRecord({self.name}, {self.value!r})"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a record: the producer's broker payload, and a lease's handle.

    ``receipt`` is the record's receive count at this delivery (per-message
    mode; 0 in cumulative mode): renewing or releasing with a stale receipt
    does nothing, as with an SQS receipt handle. ``expires_at`` is when the
    lease first expires (on the broker's clock; renewals move it on).
    """

    record: MemoryRecord
    receipt: int = 0
    expires_at: float = math.inf


@dataclass
class _StreamState:
    lanes: dict[str, list[MemoryRecord]] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)  # cumulative mode
    deleted: set[tuple[str, int]] = field(default_factory=set)  # per-message mode
    visible: list[tuple[int, str]] = field(default_factory=list)  # heap of (offset, lane)
    leased: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    """Received, not settled: (lane, offset) -> (receipt, expiry)."""
    expiries: list[tuple[float, str, int, int]] = field(default_factory=list)
    """Heap of (expiry, lane, offset, receipt); stale entries are skipped."""
    receives: dict[tuple[str, int], int] = field(default_factory=dict)
    consumers: int = 0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class MemoryBroker:
    """Streams of lanes of records, with committed offsets, leases, deletions and dead letters.

    Every call is synchronous and O(log n) amortized, except
    :meth:`wait_for_records`. Streams come into being on first use. Leases
    run on ``clock`` (``time.monotonic``, the event loop's clock, by default).
    """

    _registry: ClassVar[dict[str, MemoryBroker]] = {}

    def __init__(self, name: str = "default", *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.clock = clock
        self._streams: dict[str, _StreamState] = {}

    @classmethod
    def named(cls, name: str = "default") -> MemoryBroker:
        """The broker registered under ``name``, created (and registered) on first use."""
        broker = cls._registry.get(name)
        if broker is None:
            broker = cls._registry[name] = cls(name)
        return broker

    @classmethod
    def forget(cls, name: str) -> None:
        """Drop the broker registered under ``name`` (a test's clean-up); idempotent."""
        cls._registry.pop(name, None)

    def _stream(self, stream: str) -> _StreamState:
        state = self._streams.get(stream)
        if state is None:
            state = self._streams[stream] = _StreamState()
        return state

    def produce(
        self, stream: str, values: Sequence[bytes | None], *, lane: str = "0",
        headers: Mapping[str, str] | None = None,
    ) -> list[MemoryRecord]:
        """Append ``values`` to one lane, in order; wake the readers. Returns the records."""
        state = self._stream(stream)
        records = state.lanes.setdefault(lane, [])
        state.committed.setdefault(lane, 0)
        added = []
        for value in values:
            record = MemoryRecord(stream, lane, len(records), value, headers)
            records.append(record)
            heapq.heappush(state.visible, (record.offset, lane))
            added.append(record)
        self._wake(state)
        return added

    def records(self, stream: str, lane: str = "0") -> list[MemoryRecord]:
        """Every record of a lane, settled or not (a dead-letter stream's letters, say)."""
        return list(self._stream(stream).lanes.get(lane, ()))

    def lanes(self, stream: str) -> list[str]:
        """The lanes of ``stream``, sorted."""
        return sorted(self._stream(stream).lanes)

    # cumulative reading

    def read(self, stream: str, lane: str, offset: int) -> MemoryRecord | None:
        """The record at ``offset`` of a lane, or ``None`` past its end."""
        records = self._stream(stream).lanes.get(lane, ())
        return records[offset] if offset < len(records) else None

    def commit(self, stream: str, lane: str, offset: int) -> None:
        """Set a lane's committed offset (the next to read); it never moves back."""
        committed = self._stream(stream).committed
        committed[lane] = max(committed.get(lane, 0), offset)

    def committed(self, stream: str, lane: str = "0") -> int:
        """A lane's committed offset."""
        return self._stream(stream).committed.get(lane, 0)

    # per-message reading

    def receive(self, stream: str, *, lease: float) -> Delivery | None:
        """Lease out the lowest visible record for ``lease`` seconds, or return ``None``."""
        state = self._stream(stream)
        now = self.clock()
        self._expire(state, now)
        while state.visible:
            offset, lane = heapq.heappop(state.visible)
            key = (lane, offset)
            if key in state.deleted or key in state.leased:
                continue
            receipt = state.receives[key] = state.receives.get(key, 0) + 1
            expires_at = now + lease
            state.leased[key] = (receipt, expires_at)
            heapq.heappush(state.expiries, (expires_at, lane, offset, receipt))
            return Delivery(state.lanes[lane][offset], receipt, expires_at)
        return None

    def renew(self, deliveries: Sequence[Delivery], *, lease: float) -> list[Delivery]:
        """Extend the leases still held under these receipts by ``lease`` s; return those."""
        now, renewed = self.clock(), []
        for delivery in deliveries:
            record = delivery.record
            state, key = self._stream(record.stream), (record.lane, record.offset)
            if state.leased.get(key, (None,))[0] == delivery.receipt:
                state.leased[key] = (delivery.receipt, now + lease)
                heapq.heappush(state.expiries,
                               (now + lease, record.lane, record.offset, delivery.receipt))
                renewed.append(delivery)
        return renewed

    def release(self, delivery: Delivery) -> None:
        """Make a leased record visible again now (ignored with a stale receipt)."""
        record = delivery.record
        state, key = self._stream(record.stream), (record.lane, record.offset)
        if state.leased.get(key, (None,))[0] == delivery.receipt:
            del state.leased[key]
            heapq.heappush(state.visible, (record.offset, record.lane))
            self._wake(state)

    def delete(self, delivery: Delivery) -> None:
        """Settle a received record for good (whatever its lease)."""
        record = delivery.record
        state, key = self._stream(record.stream), (record.lane, record.offset)
        state.leased.pop(key, None)
        state.deleted.add(key)

    def _expire(self, state: _StreamState, now: float) -> None:
        while state.expiries and state.expiries[0][0] <= now:
            expires_at, lane, offset, receipt = heapq.heappop(state.expiries)
            key = (lane, offset)
            if state.leased.get(key) == (receipt, expires_at):  # not renewed nor settled
                del state.leased[key]
                heapq.heappush(state.visible, (offset, lane))

    # what a harness reads

    def settled(self, stream: str) -> int:
        """Records of ``stream`` committed past or deleted: never delivered again."""
        state = self._stream(stream)
        return sum(state.committed.values()) + sum(
            1 for lane, offset in state.deleted if offset >= state.committed.get(lane, 0))

    def consumers(self, stream: str) -> int:
        """How many producers have ``stream`` open right now."""
        return self._stream(stream).consumers

    def connect(self, stream: str) -> None:
        """Count a consumer of ``stream`` in (a producer's ``open_stream``)."""
        self._stream(stream).consumers += 1

    def disconnect(self, stream: str) -> None:
        """Count a consumer of ``stream`` out (a producer's ``aclose``)."""
        self._stream(stream).consumers -= 1

    async def wait_for_records(self, stream: str) -> None:
        """Return when records arrive or are released in ``stream`` (bound it with a timeout).

        A lapsed lease wakes nobody: a reader sees it at its next bounded wait.
        """
        waiter = asyncio.get_running_loop().create_future()
        waiters = self._stream(stream).waiters
        waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in waiters:
                waiters.remove(waiter)

    @staticmethod
    def _wake(state: _StreamState) -> None:
        waiters, state.waiters = state.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


# -- the producer -----------------------------------------------------------------------------
