"""An in-memory broker, and the reference producer and trigger of a broker module built on it.

Terms. A :class:`MemoryBroker` holds *streams* (a topic, a queue), each made
of *lanes* (a partition, a FIFO message group): append-only lists of
:class:`MemoryRecord`, numbered from offset 0. A stream's dead-letter
destination is another stream. Brokers are found by name
(:meth:`MemoryBroker.named`), because a trigger is rebuilt from its kwargs
and can only carry names.

The producer acknowledges in one of two modes, picked per trigger (``acks``):

* ``"cumulative"`` (the Kafka way): each lane has a committed offset. The
  producer commits the contiguous resolved prefix; at a failed record it
  holds the lane's *floor* and rewinds the lane to it, so the record comes
  again in this session; a new producer starts at the committed offsets.
* ``"per-message"`` (the SQS way): each record is deleted on its own; a
  failed record becomes visible again at once; records a closing producer
  still held become visible again. Order is not kept across redeliveries.

Invariants:

1. Nothing is committed or deleted before the engine advanced it, clean or
   rejected; a rejected record is dead-lettered first.
2. A record the subscribers' filters failed on (``failed > unseen``) more
   than ``max_redeliveries`` times is dead-lettered with the reason
   ``max_redeliveries``, then settled. Collateral failures (``unseen``) and
   records nobody was subscribed to are redelivered without counting.
3. Bounded: at most ``max_in_flight`` records are yielded and not yet
   advanced; a failing record is retried after a pause that doubles up to
   0.2 s; every wait for new records lasts at most ``poll_timeout``.

Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import (
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamProducer,
    Verdict,
    verdict_detail,
    verdict_triggers,
)
from sharedstream.engine.producer import DeadLetter as FallbackLetter
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = [
    "ACK_MODES",
    "HEADER_REASON",
    "HEADER_SOURCE",
    "HEADER_TRIGGERS",
    "MemoryBroker",
    "MemoryConfigError",
    "MemoryRecord",
    "MemorySettings",
    "MemorySharedStreamProducer",
    "MemorySharedStreamTrigger",
]

log = logging.getLogger(__name__)

ACK_MODES = ("cumulative", "per-message")
HEADER_SOURCE = "sharedstream.source"
HEADER_REASON = "sharedstream.reason"
HEADER_TRIGGERS = "sharedstream.triggers"
HEADER_DETAIL = "sharedstream.detail"
REASON_REJECTED = "rejected"
REASON_MAX_REDELIVERIES = "max_redeliveries"


class MemoryConfigError(SharedStreamError, ValueError):
    """A memory trigger's settings are unusable (an unknown mode, a lossy setting)."""


# -- the broker -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryRecord:
    """One message: where it is, its value and headers. The raw event the filters receive."""

    stream: str
    lane: str
    offset: int
    value: bytes | None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``stream/lane/offset``: the same for every delivery of the record."""
        return f"{self.stream}/{self.lane}/{self.offset}"


@dataclass
class _StreamState:
    lanes: dict[str, list[MemoryRecord]] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)  # cumulative mode
    deleted: set[tuple[str, int]] = field(default_factory=set)  # per-message mode
    visible: list[tuple[int, str]] = field(default_factory=list)  # heap of (offset, lane)
    hidden: set[tuple[str, int]] = field(default_factory=set)  # received, not yet settled
    consumers: int = 0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class MemoryBroker:
    """Streams of lanes of records, with committed offsets, deletions and dead letters.

    Every call is synchronous and O(log n) or better, except
    :meth:`wait_for_records`. Streams come into being on first use.
    """

    _registry: ClassVar[dict[str, MemoryBroker]] = {}

    def __init__(self, name: str = "default") -> None:
        self.name = name
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
            record = MemoryRecord(stream, lane, len(records), value, dict(headers or {}))
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

    def read(self, stream: str, lane: str, offset: int) -> MemoryRecord | None:
        """The record at ``offset`` of a lane, or ``None`` past its end (cumulative reading)."""
        records = self._stream(stream).lanes.get(lane, ())
        return records[offset] if offset < len(records) else None

    def commit(self, stream: str, lane: str, offset: int) -> None:
        """Set a lane's committed offset (the next to read); it never moves back."""
        committed = self._stream(stream).committed
        committed[lane] = max(committed.get(lane, 0), offset)

    def committed(self, stream: str, lane: str = "0") -> int:
        """A lane's committed offset."""
        return self._stream(stream).committed.get(lane, 0)

    def receive(self, stream: str) -> MemoryRecord | None:
        """Hide and return the lowest visible record, or ``None`` (per-message reading)."""
        state = self._stream(stream)
        while state.visible:
            offset, lane = heapq.heappop(state.visible)
            key = (lane, offset)
            if key not in state.deleted and key not in state.hidden:
                state.hidden.add(key)
                return state.lanes[lane][offset]
        return None

    def release(self, record: MemoryRecord) -> None:
        """Make a received record visible again (it is received again, later)."""
        state = self._stream(record.stream)
        key = (record.lane, record.offset)
        if key in state.hidden:
            state.hidden.discard(key)
            heapq.heappush(state.visible, (record.offset, record.lane))
            self._wake(state)

    def delete(self, record: MemoryRecord) -> None:
        """Settle a received record for good."""
        state = self._stream(record.stream)
        key = (record.lane, record.offset)
        state.hidden.discard(key)
        state.deleted.add(key)

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
        """Return when records arrive or become visible in ``stream`` (bound it with a timeout)."""
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


# -- the producer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemorySettings:
    """What a memory producer is built from (validated when built)."""

    stream: str
    broker: str = "default"
    acks: str = "cumulative"
    dead_letter: str | None = None
    max_redeliveries: int = 5
    max_in_flight: int = 1000
    poll_timeout: float = 1.0
    ack_on_receive: bool = False
    """Lossy: would settle records before any trigger stored them. Always refused."""

    def __post_init__(self) -> None:
        if self.acks not in ACK_MODES:
            raise MemoryConfigError(f"acks must be one of {', '.join(ACK_MODES)}, "
                                    f"not {self.acks!r}")
        if self.ack_on_receive:
            raise MemoryConfigError("ack_on_receive=True refused: it would settle records "
                                    "before the triggers stored their events")
        if self.max_redeliveries < 0 or self.max_in_flight < 1 or self.poll_timeout <= 0:
            raise MemoryConfigError("max_redeliveries must be >= 0, max_in_flight >= 1 "
                                    "and poll_timeout > 0")


@dataclass
class _Lane:
    """One lane's reading and commit state (cumulative mode), for one producer."""

    position: int  # next offset to yield
    resolved_to: int  # next offset to commit past
    floor: int | None = None  # lowest offset held for redelivery


class MemorySharedStreamProducer(SharedStreamProducer):
    """The reference producer: one consumer of a memory stream shared by all its triggers.

    Built by :meth:`MemorySharedStreamTrigger.create_shared_stream_producer`
    from settings only; :meth:`open_stream` "connects". See the module
    docstring for the policy of each acknowledgement mode.
    """

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings
        self.discarded = 0
        """Rejected or poison records dropped because there was nowhere to dead-letter them."""
        self._broker: MemoryBroker | None = None
        self._lanes: dict[str, _Lane] = {}
        self._failures: dict[tuple[str, int], int] = {}  # (lane, offset) -> own failures
        self._held: dict[tuple[str, int], MemoryRecord] = {}  # received, unsettled (per-message)
        self._turn = 0  # round-robin start among lanes
        self._in_flight = 0
        self._capacity: asyncio.Event | None = None
        self._idle_until = 0.0

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Yield ``(record, record)`` for every record, waiting for more at the end.

        Pauses while ``max_in_flight`` records wait to be advanced, and after
        a failure (see :meth:`advance`). Never returns.
        """
        broker = self._broker = MemoryBroker.named(self.settings.broker)
        stream = self.settings.stream
        broker.connect(stream)
        capacity = self._capacity = asyncio.Event()
        capacity.set()
        loop = asyncio.get_running_loop()
        read = self._read_next if self.settings.acks == "cumulative" else self._receive_next
        while True:
            await capacity.wait()
            pause = self._idle_until - loop.time()
            if pause > 0:  # a record just failed: no hot loop of redeliveries
                await asyncio.sleep(pause)
            record = read(broker)
            if record is None:
                with contextlib.suppress(TimeoutError):  # a bounded poll: look again
                    async with asyncio.timeout(self.settings.poll_timeout):
                        await broker.wait_for_records(stream)
                continue
            self._in_flight += 1
            if self._in_flight >= self.settings.max_in_flight:
                capacity.clear()
            yield record, record

    def _read_next(self, broker: MemoryBroker) -> MemoryRecord | None:
        stream = self.settings.stream
        names = broker.lanes(stream)
        for i in range(len(names)):
            name = names[(self._turn + i) % len(names)]
            lane = self._lanes.get(name)
            if lane is None:
                start = broker.committed(stream, name)
                lane = self._lanes[name] = _Lane(position=start, resolved_to=start)
            record = broker.read(stream, name, lane.position)
            if record is not None:
                lane.position += 1
                self._turn += i + 1
                return record
        return None

    def _receive_next(self, broker: MemoryBroker) -> MemoryRecord | None:
        record = broker.receive(self.settings.stream)
        if record is not None:
            self._held[(record.lane, record.offset)] = record
        return record

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The record's lane: its order is kept, and acknowledgement is per lane."""
        lane: str = broker_payload.lane
        return lane

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """``stream/lane/offset``, the same for every redelivery."""
        name: str = broker_payload.name
        return name

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit or delete, dead-letter, or redeliver each record of one lane's resolved prefix.

        Raises only what the dead-letter fallback raises (the record is then
        neither settled nor lost: the group ends and it comes again).
        """
        self._in_flight = max(0, self._in_flight - len(batch))
        if self._capacity is not None and self._in_flight < self.settings.max_in_flight:
            self._capacity.set()
        if self.settings.acks == "cumulative":
            await self._advance_lane(batch)
        else:
            for record, outcome in batch:
                await self._advance_one(record, outcome)

    async def _advance_lane(self, batch: Sequence[AdvanceItem]) -> None:
        broker = self._require_broker()
        lane_name: str = batch[0].broker_payload.lane
        lane = self._lanes[lane_name]
        for record, outcome in batch:
            offset = record.offset
            if offset < lane.resolved_to:
                continue  # an earlier delivery of it was resolved already
            if lane.floor is not None and offset > lane.floor:
                continue  # behind a held record: it comes again after the rewind
            if self._failed(outcome):
                if not await self._poison(record, outcome):
                    lane.floor = lane.position = offset  # hold, and rewind to it
                    continue
            elif outcome.rejected:
                await self._dead_letter(record, REASON_REJECTED, outcome.verdicts)
            lane.resolved_to = offset + 1
            self._failures.pop((lane_name, offset), None)
            if lane.floor is not None and lane.floor <= offset:
                lane.floor = None
        broker.commit(self.settings.stream, lane_name, lane.resolved_to)

    async def _advance_one(self, record: MemoryRecord, outcome: AdvanceOutcome) -> None:
        broker = self._require_broker()
        key = (record.lane, record.offset)
        if self._failed(outcome):
            if not await self._poison(record, outcome):
                self._held.pop(key, None)
                broker.release(record)
                return
        elif outcome.rejected:
            await self._dead_letter(record, REASON_REJECTED, outcome.verdicts)
        self._failures.pop(key, None)
        self._held.pop(key, None)
        broker.delete(record)

    def _failed(self, outcome: AdvanceOutcome) -> bool:
        """Whether the record must come again; sets the pause before it does."""
        nobody = not (outcome.acked or outcome.failed or outcome.rejected)
        if not (outcome.failed or nobody):
            return False
        loop_time = asyncio.get_running_loop().time()
        pause = 0.05 if outcome.failed else 0.1  # collateral, or nobody was subscribed
        self._idle_until = max(self._idle_until, loop_time + pause)
        return True

    async def _poison(self, record: MemoryRecord, outcome: AdvanceOutcome) -> bool:
        """Count a failure of the record's own; dead-letter it past ``max_redeliveries``."""
        if outcome.failed <= outcome.unseen:
            return False  # not the record's doing: redeliver without counting
        key = (record.lane, record.offset)
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        if failures <= self.settings.max_redeliveries:
            loop_time = asyncio.get_running_loop().time()
            self._idle_until = max(self._idle_until, loop_time + min(0.005 * 2 ** failures, 0.2))
            return False
        await self._dead_letter(record, REASON_MAX_REDELIVERIES, outcome.verdicts)
        return True

    async def _dead_letter(
        self, record: MemoryRecord, reason: str, verdicts: Sequence[Verdict],
    ) -> None:
        """Append the record to the dead-letter stream, else to the fallback, else drop it."""
        triggers = ",".join(verdict_triggers(verdicts))
        detail = verdict_detail(verdicts)
        if self.settings.dead_letter is not None:
            headers = {**record.headers, HEADER_SOURCE: record.name, HEADER_REASON: reason}
            if triggers:
                headers[HEADER_TRIGGERS] = triggers
            if detail:
                headers[HEADER_DETAIL] = detail
            self._require_broker().produce(self.settings.dead_letter, [record.value],
                                           headers=headers)
        elif self.dead_letter_fallback is not None:
            await self.dead_letter_fallback(FallbackLetter(
                stream=f"memory {self.settings.stream}", source=record.name,
                reason=f"{reason}: {detail}" if detail else reason,
                triggers=verdict_triggers(verdicts), payload=record.value or b"",
                headers=tuple((k, v.encode()) for k, v in record.headers.items()),
            ))
        else:
            self.discarded += 1
            log.warning("discarding %s (%s): no dead-letter stream", record.name, reason)
            return
        self.dead_lettered += 1

    def _require_broker(self) -> MemoryBroker:
        if self._broker is None:
            raise RuntimeError("advance() before open_stream()")
        return self._broker

    async def aclose(self) -> None:
        """Hand back what this consumer still held (per-message mode); count it out. Once."""
        broker, self._broker = self._broker, None
        if broker is None:
            return
        held, self._held = self._held, {}
        for record in held.values():  # what a crashed consumer's lease expiry would free
            broker.release(record)
        broker.disconnect(self.settings.stream)


# -- the trigger ----------------------------------------------------------------------------


class MemorySharedStreamTrigger(BaseEventTrigger):
    """Fire for each record of a memory stream that :meth:`matches` (all, by default).

    All triggers of one stream with the same consumer settings share one
    producer. The event payload is :meth:`to_payload`'s dict (``value``,
    ``name``, ``lane``, ``offset``, ``headers``). Subclass and override
    :meth:`matches`, or :meth:`filter_shared_stream` to reject records.
    """

    def __init__(
        self, *, stream: str, broker: str = "default", acks: str = "cumulative",
        dead_letter: str | None = None, max_redeliveries: int = 5, max_in_flight: int = 1000,
        poll_timeout: float = 1.0, ack_on_receive: bool = False,
    ) -> None:
        super().__init__()
        self.settings = MemorySettings(  # refuse unusable settings where declared
            stream=stream, broker=broker, acks=acks, dead_letter=dead_letter,
            max_redeliveries=max_redeliveries, max_in_flight=max_in_flight,
            poll_timeout=poll_timeout, ack_on_receive=ack_on_receive,
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and the settings, as constructor kwargs."""
        s = self.settings
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": s.stream, "broker": s.broker, "acks": s.acks,
            "dead_letter": s.dead_letter, "max_redeliveries": s.max_redeliveries,
            "max_in_flight": s.max_in_flight, "poll_timeout": s.poll_timeout,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: this trigger runs only on its shared stream."""
        raise NotImplementedError("MemorySharedStreamTrigger runs on its shared stream only")
        yield  # type: ignore[unreachable]  # makes this an async generator

    def shared_stream_key(self) -> Hashable:
        """Every setting of the shared consumer (none of the filter's)."""
        s = self.settings
        return ("memory", s.broker, s.stream, s.acks, s.dead_letter, s.max_redeliveries,
                s.max_in_flight, s.poll_timeout)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet)."""
        names = ("stream", "broker", "acks", "dead_letter", "max_redeliveries",
                 "max_in_flight", "poll_timeout")
        return MemorySharedStreamProducer(
            MemorySettings(**{name: kwargs[name] for name in names if name in kwargs}))

    def matches(self, record: MemoryRecord) -> bool:
        """Whether ``record`` fires an event (default: every record)."""
        return True

    def to_payload(self, record: MemoryRecord) -> dict[str, Any]:
        """The event payload for a matching record."""
        return {"value": record.value, "name": record.name, "lane": record.lane,
                "offset": record.offset, "headers": dict(record.headers)}

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any],
    ) -> AsyncIterator[TriggerEvent]:
        """One event per matching record."""
        async for record in shared_stream:
            if self.matches(record):
                yield TriggerEvent(self.to_payload(record))
