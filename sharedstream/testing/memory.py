"""The broker module of the in-memory broker, built on the broker kit: the worked example.

Terms. A :class:`~sharedstream.testing.memory_broker.MemoryBroker` (its own
module) holds *streams* (a topic, a queue), each made of *lanes* (a
partition, a FIFO message group) of records; a stream's dead-letter
destination is another stream. The broker stands in for a real broker's
SDK: the producer and the trigger below use it the way a broker module uses
its client, and hold only what is specific to it. Everything else is the kit's
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
from collections.abc import AsyncGenerator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, PayloadFormat
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
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer, Verdict
from sharedstream.engine.tracing import carrier_of
from sharedstream.testing.memory_broker import Delivery, MemoryBroker, MemoryRecord

__all__ = [
    "ACK_MODES",
    "HEADER_DETAIL",
    "HEADER_REASON",
    "HEADER_SOURCE",
    "HEADER_TRIGGERS",
    "PAYLOAD_FORMATS",
    "MemoryConfigError",
    "MemoryProducerError",
    "MemorySettings",
    "MemorySharedStreamProducer",
    "MemorySharedStreamTrigger",
]

log = key_value_logger(__name__)

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
        self._letters = DeadLetterDesk(self, setting="dead_letter", logger=log)
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

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The record's headers (``traceparent`` among them, when it was published traced)."""
        return carrier_of(raw_event.headers) if raw_event.headers else None

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """``memory`` and the stream's name."""
        return {"messaging.system": "memory",
                "messaging.destination.name": self.settings.stream}

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

    def shared_stream_name(self) -> str:
        """``memory orders``: the stream's name (not its broker, as a real cluster's address)."""
        return f"memory {self.settings.stream}"

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
