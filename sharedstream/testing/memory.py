"""An in-memory broker, and a broker module for it built on the broker kit: the worked example.

Terms. A :class:`MemoryBroker` holds *streams* (a topic, a queue), each made
of *lanes* (a partition, a FIFO message group): append-only lists of
:class:`MemoryRecord`, numbered from offset 0. A stream's dead-letter
destination is another stream. Brokers are found by name
(:meth:`MemoryBroker.named`), because a trigger is rebuilt from its kwargs
and can only carry names. The broker stands in for a real broker's SDK: the
producer and the trigger below use it the way a broker module uses its
client, and hold only what is specific to it. Everything else is the kit's
(:mod:`sharedstream.brokerkit`): the filter, decoding and ``match``
(``BrokerTrigger``), the error hierarchy, the in-flight limit, the
redelivery rule, the dead-letter desk, the lease keeper and source claims.

The producer acknowledges in one of two modes, picked per trigger (``acks``):

* ``"cumulative"`` (the Kafka way): each lane has a committed offset. The
  producer commits the contiguous resolved prefix; at a failed record it
  holds the lane's *floor* and rewinds the lane to it, so the record comes
  again in this session; a new producer starts at the committed offsets.
* ``"per-message"`` (the SQS way): a record is received under a *lease*
  (``lease`` seconds, renewed by the kit's ``LeaseKeeper`` while it is
  outstanding) and deleted on its own; a failed record is released (visible
  again at once), a lapsed lease makes it visible again, and a closing
  producer releases what it still held. Order is not kept across redeliveries.

Invariants:

1. Nothing is committed or deleted before the engine advanced it, clean or
   rejected; a rejected record is dead-lettered first (to the ``dead_letter``
   stream, else through the engine's fallback, else discarded and counted).
2. A record the subscribers' filters failed on (``failed > unseen``) more
   than ``max_redeliveries`` times is dead-lettered with the reason
   ``max_redeliveries``, then settled. Collateral failures (``unseen``) and
   records nobody was subscribed to are redelivered without counting.
3. Bounded: at most ``max_in_flight`` records are yielded and not yet
   advanced; a failing record is retried after a pause that doubles up to
   0.2 s; every wait for new records lasts at most ``poll_timeout``; failure
   counts are kept for at most 4096 records.
4. One stream of one broker is consumed in a process with one set of
   settings at a time: a second producer with other settings is refused
   when it opens (the two would split or skip each other's records).

Everything runs on one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, DecodeCache, PayloadFormat
from sharedstream.brokerkit.deadletters import (
    ANNOTATION_DETAIL,
    ANNOTATION_REASON,
    ANNOTATION_TRIGGERS,
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    DeadLetterDesk,
    dead_letter_annotations,
)
from sharedstream.brokerkit.errors import BrokerConfigError, BrokerError
from sharedstream.brokerkit.fingerprints import SourceClaims, fingerprint
from sharedstream.brokerkit.inflight import InFlightLimit
from sharedstream.brokerkit.lease import LeaseKeeper
from sharedstream.brokerkit.redelivery import DeliveryTally, RedeliveryPolicy
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.engine.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer, Verdict

__all__ = [
    "ACK_MODES",
    "HEADER_DETAIL",
    "HEADER_REASON",
    "HEADER_SOURCE",
    "HEADER_TRIGGERS",
    "PAYLOAD_FORMATS",
    "Delivery",
    "MemoryBroker",
    "MemoryConfigError",
    "MemoryProducerError",
    "MemoryRecord",
    "MemorySettings",
    "MemorySharedStreamProducer",
    "MemorySharedStreamTrigger",
]

log = logging.getLogger(__name__)

ACK_MODES = ("cumulative", "per-message")
HEADER_SOURCE = "sharedstream.source"
"""The dead-letter header naming the record a letter came from (``stream/lane/offset``)."""
HEADER_REASON, HEADER_TRIGGERS, HEADER_DETAIL = (
    ANNOTATION_REASON, ANNOTATION_TRIGGERS, ANNOTATION_DETAIL)
_MAX_TALLIES = 4096


class MemoryProducerError(BrokerError):
    """Base class of what the memory producer raises."""


class MemoryConfigError(MemoryProducerError, BrokerConfigError):
    """A memory trigger's settings are unusable (an unknown mode, a lossy setting, a clash)."""


# -- the broker (what a real broker module gets from its SDK) ------------------------------


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
    lease: float = 30.0
    """Per-message mode: seconds a received record stays invisible to other consumers."""
    ack_on_receive: bool = False
    """Lossy: would settle records before any trigger stored them. Always refused."""

    def __post_init__(self) -> None:
        if self.acks not in ACK_MODES:
            raise MemoryConfigError(f"acks must be one of {', '.join(ACK_MODES)}, "
                                    f"not {self.acks!r}")
        if self.ack_on_receive:
            raise MemoryConfigError("ack_on_receive=True refused: it would settle records "
                                    "before the triggers stored their events")
        if (self.max_redeliveries < 0 or self.max_in_flight < 1 or self.poll_timeout <= 0
                or self.lease <= 0):
            raise MemoryConfigError("max_redeliveries must be >= 0, max_in_flight >= 1, "
                                    "poll_timeout and lease > 0")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> MemorySettings:
        """The settings among a trigger's kwargs (others are ignored); validated."""
        if "stream" not in kwargs:
            raise MemoryConfigError("missing memory trigger setting 'stream'")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in kwargs.items() if name in names})

    def consumer_kwargs(self) -> dict[str, Any]:
        """The settings as trigger kwargs (``ack_on_receive`` left out: it is always off)."""
        kwargs = dataclasses.asdict(self)
        del kwargs["ack_on_receive"]
        return kwargs

    def fingerprint(self) -> str:
        """A digest of every setting: equal for triggers that can share one consumer."""
        return fingerprint(self.consumer_kwargs())


@dataclass
class _Lane:
    """One lane's reading and commit state (cumulative mode), for one producer."""

    position: int  # next offset to yield
    resolved_to: int  # next offset to commit past
    floor: int | None = None  # lowest offset held for redelivery


_consumed = SourceClaims()
"""Streams consumed in this process, ``(broker, stream)``, and the settings consuming each."""


class MemorySharedStreamProducer(SharedStreamProducer):
    """The reference producer: one consumer of a memory stream shared by all its triggers.

    Built by :meth:`MemorySharedStreamTrigger.create_shared_stream_producer`
    from settings only; :meth:`open_stream` claims the stream and
    "connects". See the module docstring for each acknowledgement mode.
    """

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings
        self._source = (settings.broker, settings.stream)
        self._fingerprint = settings.fingerprint()
        self._broker: MemoryBroker | None = None
        self._in_flight = InFlightLimit(settings.max_in_flight)
        self._redelivery = RedeliveryPolicy(settings.max_redeliveries)
        self._failures: DeliveryTally[tuple[str, int]] = DeliveryTally(_MAX_TALLIES)
        self._letters = DeadLetterDesk(self, stream=f"memory {settings.stream}",
                                       setting="dead_letter", logger=log)
        self._lanes: dict[str, _Lane] = {}  # cumulative mode
        self._turn = 0  # round-robin start among lanes
        self._leases: LeaseKeeper[Delivery] | None = None  # per-message mode
        self._renewing: asyncio.Task[None] | None = None
        self._idle_until = 0.0

    @property
    def discarded(self) -> int:
        """Records dropped: no dead-letter stream and no fallback."""
        return self._letters.discarded

    async def open_stream(self) -> AsyncGenerator[tuple[Any, Any], None]:
        """Yield ``(MemoryRecord, Delivery)`` for every record, waiting for more at the end.

        Raises :class:`MemoryConfigError` when the stream is already consumed
        in this process with other settings. Pauses while ``max_in_flight``
        records wait to be advanced, and after a failure (see :meth:`advance`).
        Never returns.
        """
        broker = self._connect()
        stream, in_flight = self.settings.stream, self._in_flight
        loop = asyncio.get_running_loop()
        take = self._read_next if self.settings.acks == "cumulative" else self._receive_next
        while True:
            await in_flight.room()
            pause = self._idle_until - loop.time()
            if pause > 0:  # a record just failed: no hot loop of redeliveries
                await asyncio.sleep(pause)
            delivery = take(broker)
            if delivery is None:
                with contextlib.suppress(TimeoutError):  # a bounded poll: look again
                    async with asyncio.timeout(self.settings.poll_timeout):
                        await broker.wait_for_records(stream)
                continue
            in_flight.take()
            yield delivery.record, delivery

    def _connect(self) -> MemoryBroker:
        if not _consumed.claim(self._source, self._fingerprint):
            raise MemoryConfigError(
                f"memory stream {self.settings.stream!r} is already consumed in this process "
                "with other settings; its triggers must agree on every consumer setting")
        broker = self._broker = MemoryBroker.named(self.settings.broker)
        broker.connect(self.settings.stream)
        if self.settings.acks == "per-message":
            self._leases = LeaseKeeper(self._renew, lease=self.settings.lease, batch_size=100,
                                       clock=broker.clock)
            self._renewing = asyncio.get_running_loop().create_task(
                self._leases.run(), name=f"memory {self.settings.stream} lease renewal")
        return broker

    async def _renew(self, batch: Sequence[Delivery]) -> list[Delivery]:
        """The lease keeper's renewal call: the leases still ours, extended."""
        return self._require_broker().renew(batch, lease=self.settings.lease)

    def _read_next(self, broker: MemoryBroker) -> Delivery | None:
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
                return Delivery(record)
        return None

    def _receive_next(self, broker: MemoryBroker) -> Delivery | None:
        delivery = broker.receive(self.settings.stream, lease=self.settings.lease)
        if delivery is not None and self._leases is not None:
            self._leases.hold(delivery, delivery.expires_at)
        return delivery

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The record's lane: its order is kept, and acknowledgement is per lane."""
        lane: str = broker_payload.record.lane
        return lane

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """``stream/lane/offset``, the same for every redelivery."""
        name: str = broker_payload.record.name
        return name

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit or delete, dead-letter, or redeliver each record of one lane's resolved prefix.

        Raises only what the dead-letter fallback raises (the record is then
        neither settled nor lost: the group ends and it comes again).
        """
        self._in_flight.release(len(batch))
        broker = self._require_broker()
        if self.settings.acks == "cumulative":
            await self._advance_lane(broker, batch)
            return
        if self._leases is not None:
            for item in batch:  # renewal stops before anything is awaited
                self._leases.settle(item.broker_payload)
        for delivery, outcome in batch:
            if await self._settles(delivery.record, outcome):
                broker.delete(delivery)
            else:
                broker.release(delivery)

    async def _advance_lane(self, broker: MemoryBroker, batch: Sequence[AdvanceItem]) -> None:
        lane_name: str = batch[0].broker_payload.record.lane
        lane = self._lanes[lane_name]
        for delivery, outcome in batch:
            offset = delivery.record.offset
            if offset < lane.resolved_to:
                continue  # an earlier delivery of it was resolved already
            if lane.floor is not None and offset > lane.floor:
                continue  # behind a held record: it comes again after the rewind
            if not await self._settles(delivery.record, outcome):
                lane.floor = lane.position = offset  # hold, and rewind to it
                continue
            lane.resolved_to = offset + 1
            if lane.floor is not None and lane.floor <= offset:
                lane.floor = None
        broker.commit(self.settings.stream, lane_name, lane.resolved_to)

    async def _settles(self, record: MemoryRecord, outcome: AdvanceOutcome) -> bool:
        """Whether ``record`` may be settled now (dead-lettered first when it must be).

        ``False``: it must come again; the poll pauses before the next read.
        """
        key = (record.lane, record.offset)
        if outcome.failed or not (outcome.acked or outcome.rejected):
            if self._redelivery.counts(outcome):  # a filter failed on this very record
                failures = self._failures.add(key)
                if self._redelivery.exhausted(failures):
                    await self._dead_letter(record, REASON_MAX_REDELIVERIES, outcome.verdicts,
                                            failures)
                    self._failures.forget(key)
                    return True
                pause = min(0.005 * 2 ** failures, 0.2)
            else:
                pause = 0.05 if outcome.failed else 0.1  # collateral, or nobody subscribed
            self._idle_until = max(self._idle_until, asyncio.get_running_loop().time() + pause)
            return False
        if outcome.rejected:
            await self._dead_letter(record, REASON_REJECTED, outcome.verdicts,
                                    self._failures.get(key))
        self._failures.forget(key)
        return True

    async def _dead_letter(
        self, record: MemoryRecord, reason: str, verdicts: Sequence[Verdict], failures: int,
    ) -> None:
        """Append the record to the dead-letter stream, else hand it to the desk."""
        destination = self.settings.dead_letter
        if destination is not None:
            headers = {**record.headers, HEADER_SOURCE: record.name,
                       **dead_letter_annotations(reason, verdicts)}
            self._require_broker().produce(destination, [record.value], headers=headers)
            self._letters.sent(record.name, destination, reason, verdicts)
            return
        await self._letters.keep(
            source=record.name, reason=reason, cause=self._letters.unconfigured(),
            verdicts=verdicts, payload=record.value or b"",
            headers=tuple((name, value.encode()) for name, value in record.headers.items()),
            history=f"after {failures} failed deliveries",
        )

    def _require_broker(self) -> MemoryBroker:
        if self._broker is None:
            raise RuntimeError("advance() before open_stream()")
        return self._broker

    async def aclose(self) -> None:
        """Stop renewing, release what is still leased, count out, release the claim. Once."""
        broker, self._broker = self._broker, None
        if broker is None:
            return
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.cancel()
            await asyncio.wait([renewing])
        if self._leases is not None:
            for delivery in self._leases.held():  # what a crashed consumer's lease would free
                self._leases.settle(delivery)
                broker.release(delivery)
        broker.disconnect(self.settings.stream)
        _consumed.release(self._source, self._fingerprint)


# -- the trigger ------------------------------------------------------------------------------

PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "bytes": AS_HELD, "utf-8": UTF8, "json": JSON, "msgpack": MSGPACK}
"""``payload_format`` -> how a record's value is decoded (``bytes``: as is)."""


class MemorySharedStreamTrigger(BrokerTrigger):
    """Fire for each record of a memory stream whose decoded value matches ``match``.

    All triggers of one stream with the same consumer settings share one
    producer (``payload_format`` and ``match`` are each trigger's own).

    :param stream: the stream to consume. :param broker: the
        :meth:`MemoryBroker.named` broker holding it.
    :param acks: ``"cumulative"`` or ``"per-message"`` (see the module docstring).
    :param dead_letter: the stream for rejected and poison records; ``None``
        hands them to the engine's fallback, or discards them.
    :param max_redeliveries: failed deliveries of one record tolerated.
    :param max_in_flight: records yielded and not yet advanced before reading pauses.
    :param poll_timeout: the longest wait for new records before looking again.
    :param lease: per-message mode: seconds a received record stays leased.
    :param ack_on_receive: lossy, always refused (what the conformance suite checks).
    :param payload_format: ``bytes`` (as is), ``utf-8``, ``json`` or ``msgpack``;
        a value that does not decode is rejected.
    :param match: ``{"headers": {name: value}, "json": {"a.b": value}}``.

    The payload of each event is a dict: ``value`` (decoded), ``name``,
    ``lane``, ``offset`` and ``headers``.
    """

    payload_formats: ClassVar[Mapping[str, PayloadFormat]] = PAYLOAD_FORMATS
    match_named_field = "headers"

    def __init__(
        self, *, stream: str, broker: str = "default", acks: str = "cumulative",
        dead_letter: str | None = None, max_redeliveries: int = 5, max_in_flight: int = 1000,
        poll_timeout: float = 1.0, lease: float = 30.0, ack_on_receive: bool = False,
        payload_format: str = "bytes", match: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.settings = MemorySettings(  # refuse unusable settings where declared
            stream=stream, broker=broker, acks=acks, dead_letter=dead_letter,
            max_redeliveries=max_redeliveries, max_in_flight=max_in_flight,
            poll_timeout=poll_timeout, lease=lease, ack_on_receive=ack_on_receive,
        )

    def consumer_kwargs(self) -> dict[str, Any]:
        """The shared consumer's settings, as constructor kwargs."""
        return self.settings.consumer_kwargs()

    def shared_stream_key(self) -> Hashable:
        """The broker, the stream and a fingerprint of every consumer setting."""
        s = self.settings
        return ("memory", s.broker, s.stream, s.fingerprint())

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet)."""
        return MemorySharedStreamProducer(MemorySettings.from_kwargs(kwargs))

    # -- what a record holds -------------------------------------------------------------

    def message_body(self, message: MemoryRecord) -> bytes | None:
        """The record's value."""
        return message.value

    def message_named_values(self, message: MemoryRecord) -> Mapping[str, str]:
        """The record's headers."""
        return message.headers

    def message_fields_native(self, message: MemoryRecord) -> bool:
        """Always: names, offsets and headers are text and ints."""
        return True

    def describe_message(self, message: MemoryRecord) -> str:
        """``stream/lane/offset``."""
        return message.name

    def to_payload(self, value: Any, message: MemoryRecord) -> dict[str, Any]:
        """The event payload for a matching record."""
        return {"value": value, "name": message.name, "lane": message.lane,
                "offset": message.offset, "headers": dict(message.headers)}
