"""Kafka: one consumer-group member shared by every trigger of a stream (ack mode).

:class:`KafkaSharedStreamProducer` reads with ``aiokafka`` (the ``kafka`` extra:
``pip install 'sharedstream[kafka]'``) and maps each advanced outcome to a
broker action, per ``(topic, partition)`` lane:

* **clean** (acked, nobody failed or rejected) - commit past the contiguous
  resolved prefix (offset of its last item + 1);
* **rejected** - publish the record to ``dead_letter_topic`` (original key,
  value and headers, plus ``sharedstream.*`` headers naming the source, the
  reason, the triggers that rejected it and why), await the broker's
  acknowledgement, then commit past it. When the broker refuses the
  dead-letter write for good (a record over its size limit, say), or no
  dead-letter topic is set, the record goes to the engine's
  ``dead_letter_fallback`` (the runtime's dead-letter table) instead; with
  neither, it is logged and discarded;
* **failed**, or fanned out to nobody - set the partition's *floor* at that
  offset: nothing at or after it is committed until it is redelivered and
  resolves, and the consumer seeks back to it so it is redelivered in this
  session. An offset that failed more than ``max_redeliveries`` times is
  dead-lettered (or discarded) instead, so one poison record cannot hold
  its partition forever.

**Per-watcher redelivery.** The records read again after a seek back go
only to the watchers that need them: for each offset at or past the floor
whose outcome came while the floor was held, the producer keeps who did not
ack it (:meth:`AdvanceOutcome.needed_by`: the triggers that failed on it,
were fenced off it or rejected it) and names them as the redelivery's
audience (:meth:`delivery_audience`). A watcher that acked a record stored
everything it derived from it, so it does not see the record again; a
record everyone acked is resolved at once on its second reading. An offset
whose outcome is not known yet when it is read again, or that went to
nobody, goes to every watcher, as before. The floor and the commits do not
change: a crash still redelivers from the last commit to everyone, and the
idempotency keys absorb what was stored.

Commits are coalesced and asynchronous (:mod:`sharedstream.brokerkit.coalesced_commits`):
``advance`` decides the partition's new commit target and returns without
waiting for the broker; one commit task sends the latest targets of all
partitions in a single ``commit`` call, one call in flight at a time. A
revoked partition's pending target is committed before the revocation
returns; ``aclose`` commits the final targets. If committing fails for good,
the error is raised from the next ``advance`` call or from the stream
generator, whichever runs first, and the group ends.

Auto-commit is refused: it would commit records nobody finished. SDK errors
leave this module wrapped in :class:`KafkaProducerError` subclasses
(``raise ... from exc``). aiokafka is imported lazily, so importing this
module (and the trigger) works without the extra installed.

The plumbing is the broker kit's (:mod:`sharedstream.brokerkit`): the lazy
SDK import, retries, the in-flight limit, the dead-letter desk and its
fallback, the redelivery rule and the coalesced committer. What is here is
Kafka's: the consumer and its rebalances, seeking back to a held offset,
the commit call and the dead-letter topic.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sharedstream.brokerkit.coalesced_commits import CoalescedCommitter
from sharedstream.brokerkit.deadletters import (
    ANNOTATION_DETAIL,
    ANNOTATION_REASON,
    ANNOTATION_TRIGGERS,
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    DeadLetterDesk,
    dead_letter_annotations,
)
from sharedstream.brokerkit.inflight import InFlightLimit
from sharedstream.brokerkit.message_identity import message_fingerprint
from sharedstream.brokerkit.redelivery import DeliveryTally, RedeliveryPolicy
from sharedstream.brokerkit.retry import retrying
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import (
    AdvanceItem,
    AdvanceOutcome,
    BrokerBacklog,
    DeadLetter,
    SharedStreamProducer,
    Verdict,
)
from sharedstream.engine.tracing import carrier_of
from sharedstream.producers._kafka_backlog import group_lag
from sharedstream.producers._kafka_replay import KafkaReplaySource
from sharedstream.producers._kafka_republish import KafkaRepublishError, republish_records
from sharedstream.producers._kafka_types import (
    KafkaCommitError,
    KafkaConfigError,
    KafkaConnectError,
    KafkaConsumeError,
    KafkaDeadLetterError,
    KafkaMessage,
    KafkaPayload,
    KafkaProducerError,
    KafkaSettings,
    message_of,
    security_fingerprint,
    sending_config,
)

__all__ = [
    "DLQ_HEADER_DETAIL",
    "DLQ_HEADER_OFFSET",
    "DLQ_HEADER_PARTITION",
    "DLQ_HEADER_REASON",
    "DLQ_HEADER_TOPIC",
    "DLQ_HEADER_TRIGGERS",
    "KafkaCommitError",
    "KafkaConfigError",
    "KafkaConnectError",
    "KafkaConsumeError",
    "KafkaDeadLetterError",
    "KafkaMessage",
    "KafkaPayload",
    "KafkaProducerError",
    "KafkaRepublishError",
    "KafkaSettings",
    "KafkaSharedStreamProducer",
    "security_fingerprint",
]

log = key_value_logger(__name__)

DLQ_HEADER_TOPIC = "sharedstream.source.topic"
DLQ_HEADER_PARTITION = "sharedstream.source.partition"
DLQ_HEADER_OFFSET = "sharedstream.source.offset"
DLQ_HEADER_REASON = ANNOTATION_REASON
DLQ_HEADER_TRIGGERS = ANNOTATION_TRIGGERS
DLQ_HEADER_DETAIL = ANNOTATION_DETAIL
"""Headers added to a dead-lettered record (values are UTF-8 text): the source
coordinates, the reason (``rejected`` or ``max_redeliveries``), the ids of the
triggers that rejected it or kept failing on it (comma-separated) and what they
said (``; ``-separated)."""


@dataclass
class _Lane:
    """Commit state of one assigned partition, for one assignment (epoch)."""

    epoch: int
    resolved_to: int = 0  # offset after the last resolved record (0: none yet)
    floor: int | None = None  # lowest offset held for redelivery
    failures: DeliveryTally[int] = field(default_factory=DeliveryTally)  # offset -> failures


_sdk = OptionalSdk(broker="Kafka", package="aiokafka", extra="kafka", error=KafkaConfigError)

_T = TypeVar("_T")


class KafkaSharedStreamProducer(SharedStreamProducer):
    """The Kafka side of a shared stream: one consumer-group member, coalesced commits.

    The constructor validates the settings (raising :class:`KafkaConfigError`,
    a ``ValueError``, also when the ``kafka`` extra is not installed) and
    connects to nothing; ``open_stream`` creates the
    consumer and starts the commit task, ``aclose`` stops both. See the
    module docstring for the outcome policy and the commit model.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        settings.validate()
        _sdk()  # a missing extra is a clear error here, not when the group connects
        self.settings = settings
        self._consumer: Any = None
        self._dlq: Any = None
        self._closed = False
        self._epoch = 0
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._rewinds: dict[tuple[str, int], int] = {}  # seeks per partition (stale-chunk guard)
        self._in_flight = InFlightLimit(settings.max_in_flight)
        self._redelivery = RedeliveryPolicy(settings.max_redeliveries)
        self._letters = DeadLetterDesk(self, setting="dead_letter_topic", logger=log)
        self._idle_until = 0.0
        # (topic, partition, offset) -> who still needs the record, for offsets read again
        # after a seek back (see the module docstring: per-watcher redelivery).
        self._owed: dict[tuple[str, int, int], frozenset[Hashable]] = {}
        self._committer: CoalescedCommitter[tuple[str, int]] = CoalescedCommitter(
            self._commit_offsets, name=f"sharedstream-kafka-commit[{settings.group_id}]",
            on_fatal=self._on_commit_failed, close_timeout=settings.commit_timeout,
        )

    @property
    def discarded(self) -> int:
        """Records dropped: no dead-letter topic and no fallback."""
        return self._letters.discarded

    # -- configuration -------------------------------------------------------------------

    def consumer_config(self) -> dict[str, Any]:
        """The keyword arguments of the ``AIOKafkaConsumer`` this producer builds."""
        s = self.settings
        config: dict[str, Any] = {
            "bootstrap_servers": s.bootstrap_servers,
            "group_id": s.group_id,
            "auto_offset_reset": "earliest",
            **dict(s.security),
            **dict(s.consumer_overrides),
            "enable_auto_commit": False,
        }
        if s.client_id is not None:
            config["client_id"] = s.client_id
        return config

    def replay_source(self) -> KafkaReplaySource:
        """A reader of this stream's partitions outside its group (:mod:`._kafka_replay`)."""
        return KafkaReplaySource(self.consumer_config(), tuple(self.settings.topics),
                                 self.settings.max_records, _sdk)

    def dead_letter_config(self) -> dict[str, Any]:
        """The keyword arguments of the dead-letter ``AIOKafkaProducer``."""
        return sending_config(self.settings, "dlq")

    # -- retries -------------------------------------------------------------------------

    async def _retrying(
        self, what: str, call: Callable[[], Awaitable[_T]],
        wrap: type[KafkaProducerError],
    ) -> _T:
        errors = _sdk("aiokafka.errors")

        def transient(exc: Exception) -> bool:
            return bool(getattr(exc, "retriable", False)) or isinstance(
                exc, errors.KafkaConnectionError | errors.KafkaTimeoutError)

        return await retrying(what, call, policy=self.settings.retry_policy(),
                              catch=errors.KafkaError, transient=transient, wrap=wrap)

    # -- the poll ------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Join the group and yield ``(KafkaMessage, KafkaPayload)`` for every record.

        Raises the commit task's error (a :class:`KafkaCommitError`) at the
        next fetch once committing failed for good, so the group ends even
        when no ``advance`` call comes to raise it.
        """
        aiokafka = _sdk()
        errors = _sdk("aiokafka.errors")
        listener_base = _sdk("aiokafka.abc").ConsumerRebalanceListener
        try:
            self._consumer = consumer = aiokafka.AIOKafkaConsumer(**self.consumer_config())
        except (TypeError, ValueError, errors.KafkaError) as exc:
            raise KafkaConfigError(f"invalid consumer settings: {exc}") from exc
        await self._retrying("connecting the consumer", consumer.start, KafkaConnectError)
        self._committer.start()
        listener = type("_SharedStreamRebalanceListener", (listener_base,), {
            "on_partitions_revoked": self._on_revoked_callback(),
            "on_partitions_assigned": self._on_assigned_callback(),
        })()
        try:
            consumer.subscribe(topics=list(self.settings.topics), listener=listener)
        except errors.KafkaError as exc:
            raise KafkaConfigError(f"cannot subscribe to {self.settings.topics}: {exc}") from exc
        loop = asyncio.get_running_loop()
        in_flight = self._in_flight
        while True:
            await in_flight.room()
            self._raise_if_commits_failed()
            wait = self._idle_until - loop.time()
            if wait > 0:  # records went to nobody: give subscribers a moment to come back
                await asyncio.sleep(wait)
            chunks = await self._retrying(
                "fetching records",
                lambda: consumer.getmany(
                    timeout_ms=self.settings.poll_timeout_ms, max_records=self.settings.max_records
                ),
                KafkaConsumeError,
            )
            self._raise_if_commits_failed()
            # aiokafka drops what was fetched before a seek; a seek made while the records
            # below are being yielded makes the rest of their chunk stale (the seek already
            # moved the position back, so they come again).
            tags = dict(self._rewinds)
            lanes, rewinds = self._lanes, self._rewinds
            for tp, records in chunks.items():
                tp_key = (tp.topic, tp.partition)
                lane = lanes.get(tp_key)
                if lane is None:
                    continue  # revoked since the fetch
                tag, epoch = tags.get(tp_key, 0), lane.epoch
                for record in records:
                    # Checked before every record: the previous yield may have let a
                    # seek or a rebalance run.
                    if rewinds.get(tp_key, 0) != tag or lanes.get(tp_key) is not lane:
                        break  # sought back or reassigned: the rest comes again
                    message = message_of(record)
                    payload = KafkaPayload(
                        record.topic, record.partition, record.offset, epoch,
                        message,
                    )
                    in_flight.take()
                    yield message, payload

    def _on_revoked_callback(self) -> Callable[..., Awaitable[None]]:
        async def on_partitions_revoked(_listener: Any, revoked: Any) -> None:
            await self._on_revoked(revoked)
        return on_partitions_revoked

    def _on_assigned_callback(self) -> Callable[..., Awaitable[None]]:
        async def on_partitions_assigned(_listener: Any, assigned: Any) -> None:
            self._on_assigned(assigned)
        return on_partitions_assigned

    def _on_assigned(self, assigned: Any) -> None:
        self._epoch += 1
        for tp in assigned:
            tp_key = (tp.topic, tp.partition)
            self._lanes[tp_key] = _Lane(epoch=self._epoch)
            self._committer.open(tp_key, self._epoch)
        log.info("partitions assigned", lanes=[f"{t}/{p}" for t, p in sorted(self._lanes)],
                 epoch=self._epoch)

    async def _on_revoked(self, revoked: Any) -> None:
        """Forget the revoked lanes, then commit what they resolved before returning.

        Records of the revoked assignment that the engine advances later
        find no lane (or a newer epoch's) and are ignored; the partitions'
        next owner redelivers them from the last commit.
        """
        keys = [(tp.topic, tp.partition) for tp in revoked]
        for tp_key in keys:
            self._lanes.pop(tp_key, None)
        if self._owed:  # the partitions' next owner delivers to everyone
            gone = set(keys)
            self._owed = {key: who for key, who in self._owed.items() if key[:2] not in gone}
        await self._committer.revoke(keys)

    # -- the engine's calls --------------------------------------------------------------

    @property
    def connected(self) -> bool | None:
        """Whether the consumer knows its group's coordinator (it has joined, or is joining).

        aiokafka forgets the coordinator when the broker stops answering and
        looks for it again until it is back, silently (no error reaches the
        poll), so this is the only sign of an outage. It reads aiokafka's
        coordinator state, which is not public API: if that ever changes,
        the answer is ``None`` (cannot tell), never an error.
        """
        if self._consumer is None:
            return False
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None or not hasattr(coordinator, "coordinator_id"):
            return None
        return coordinator.coordinator_id is not None

    async def broker_backlog(self) -> BrokerBacklog:
        """The group's lag per partition (:mod:`sharedstream.producers._kafka_backlog`)."""
        if self._consumer is None:
            raise KafkaConsumeError("the consumer is not open")
        return await group_lag(self._consumer, self.settings.topics, _sdk)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """``(topic, partition)``: Kafka commits are cumulative per partition."""
        return (broker_payload.topic, broker_payload.partition)

    def delivery_audience(self, broker_payload: Any) -> frozenset[Hashable] | None:
        """Who a record read again after a seek back is for; ``None``: everyone.

        Taken once: the entry is for this reading only (its outcome sets the
        next one, if the record is read yet again).
        """
        owed = self._owed
        if not owed:
            return None
        return owed.pop((broker_payload.topic, broker_payload.partition, broker_payload.offset),
                        None)

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """``topic/partition/offset``: the same for every redelivery of a record."""
        return f"{broker_payload.topic}/{broker_payload.partition}/{broker_payload.offset}"

    def raw_event_fingerprint(self, broker_payload: Any) -> str | None:
        """``<timestamp ms>-<CRC-32 of key and value>``: offsets repeat when a topic is recreated.

        The same for every redelivery of a record (the broker stores its
        timestamp with it); a new record at a reused offset differs unless
        its timestamp, key and value are all the same. ``None`` when the
        payload carries no record.
        """
        message = broker_payload.message
        if message is None:
            return None
        return message_fingerprint(message.timestamp, message.value, message.key)

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The record's headers (``traceparent``, ``tracestate``, ``baggage``)."""
        return carrier_of(raw_event.headers) if raw_event.headers else None

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """``kafka``, the topics, the consumer group."""
        return {"messaging.system": "kafka",
                "messaging.destination.name": ",".join(self.settings.topics),
                "messaging.consumer.group.name": self.settings.group_id}

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Dead-letter or hold records of one partition's resolved prefix; set its commit target.

        Awaits dead-letter publishing (a record is committed past only once
        the DLQ acknowledged it) but not the offset commit: the new target
        goes to the commit task, which sends it with the other partitions'.
        Raises :class:`KafkaCommitError` once committing failed for good, and
        :class:`KafkaDeadLetterError` when dead-lettering did.
        """
        self._in_flight.release(len(batch))
        self._raise_if_commits_failed()
        first: KafkaPayload = batch[0].broker_payload
        tp_key = (first.topic, first.partition)
        lane = self._lanes.get(tp_key)
        if lane is None:
            return  # revoked: the partition's new owner redelivers from the last commit
        for payload, outcome in batch:
            offset = payload.offset
            if payload.epoch != lane.epoch or offset < lane.resolved_to:
                continue  # read under an earlier assignment, or already resolved
            if lane.floor is not None and offset > lane.floor:
                # Behind a held record: it comes again. Its failure is not counted: it may
                # only have been in the inbox of a subscriber that died on the held record.
                self._note_needed(payload, outcome)
                continue
            if outcome.failed or not (outcome.acked or outcome.rejected):
                if self._redelivery.counts(outcome):  # a filter failed on this very record
                    failures = lane.failures.add(offset)
                    if self._redelivery.exhausted(failures):
                        await self._dead_letter(payload, REASON_MAX_REDELIVERIES, failures,
                                                outcome.verdicts)
                        self._resolve(lane, payload)
                        continue
                    # Back off a little more each time, so a failing record is no hot loop.
                    pause = min(self.settings.retry_backoff * 0.2 * 2 ** failures, 1.0)
                elif outcome.failed:
                    pause = 0.05  # only unseen failures (collateral): not counted against it
                else:
                    pause = 0.2  # nobody was subscribed: give them a moment to come back
                self._idle_until = max(self._idle_until,
                                       asyncio.get_running_loop().time() + pause)
                self._hold(lane, tp_key, offset)
                self._note_needed(payload, outcome)
                continue
            if outcome.rejected:
                await self._dead_letter(payload, REASON_REJECTED, lane.failures.get(offset),
                                        outcome.verdicts)
            self._resolve(lane, payload)
        self._committer.want(tp_key, lane.epoch, lane.resolved_to)

    def _note_needed(self, payload: KafkaPayload, outcome: AdvanceOutcome) -> None:
        """Keep who needs ``payload``'s record when it is read again (per-watcher redelivery).

        Nothing is kept when that is not known, or when the record went to
        nobody (whoever is subscribed at the next reading must get it).
        """
        key = (payload.topic, payload.partition, payload.offset)
        needed = outcome.needed_by()
        if needed is None or not (outcome.acked or needed):
            self._owed.pop(key, None)
        else:
            self._owed[key] = needed

    def _resolve(self, lane: _Lane, payload: KafkaPayload) -> None:
        offset = payload.offset
        if self._owed:
            self._owed.pop((payload.topic, payload.partition, offset), None)
        lane.resolved_to = offset + 1
        lane.failures.forget(offset)
        if lane.floor is not None and lane.floor <= offset:
            lane.floor = None

    def _hold(self, lane: _Lane, tp_key: tuple[str, int], offset: int) -> None:
        lane.floor = offset
        self._rewinds[tp_key] = self._rewinds.get(tp_key, 0) + 1
        tp = _sdk("aiokafka.structs").TopicPartition(*tp_key)
        errors = _sdk("aiokafka.errors")
        try:
            self._consumer.seek(tp, offset)
        except errors.IllegalStateError:
            log.info("partition revoked before it could be rewound", topic=tp_key[0],
                     partition=tp_key[1], offset=offset)
        else:
            log.info("holding the partition for redelivery", topic=tp_key[0],
                     partition=tp_key[1], offset=offset, failures=lane.failures.get(offset))

    async def _commit_offsets(self, targets: dict[tuple[str, int], int]) -> bool:
        """One ``consumer.commit`` of ``targets`` (the commit task's only broker call).

        Transient errors, and an attempt outlasting ``commit_timeout``, are
        retried with backoff; ``False`` when a rebalance refused the commit
        (the revocation commits what the revoked partitions still owe).
        """
        errors = _sdk("aiokafka.errors")
        structs = _sdk("aiokafka.structs")
        offsets = {structs.TopicPartition(*tp_key): target for tp_key, target in targets.items()}
        what = "committing " + ", ".join(f"{t}/{p} at {o}" for (t, p), o in sorted(targets.items()))

        async def commit() -> None:
            try:
                async with asyncio.timeout(self.settings.commit_timeout):
                    await self._consumer.commit(offsets)
            except TimeoutError as exc:
                raise errors.KafkaTimeoutError(
                    f"no answer within {self.settings.commit_timeout}s") from exc

        try:
            await self._retrying(what, commit, KafkaCommitError)
        except KafkaCommitError as exc:
            cause = exc.__cause__
            if isinstance(cause, errors.CommitFailedError | errors.IllegalStateError):
                log.info("commit refused by a rebalance", call=what, error=cause)
                return False
            raise
        return True

    def _on_commit_failed(self, _error: BaseException) -> None:
        self._in_flight.interrupt()  # wake a poll waiting for capacity: it raises the error

    def _raise_if_commits_failed(self) -> None:
        error = self._committer.error
        if error is not None:
            raise KafkaCommitError(f"committing offsets failed: {error}") from error

    async def _dead_letter(
        self, payload: KafkaPayload, reason: str, failures: int, verdicts: Sequence[Verdict]
    ) -> None:
        """Publish the record to the DLQ topic, or keep it through the fallback; then return.

        Returns only once the record is durable somewhere (or discarded, with
        a warning, when there is neither a DLQ topic nor a fallback), so the
        caller may commit past it. Raises :class:`KafkaDeadLetterError` when
        the DLQ refuses it and there is no fallback, and what the fallback
        raises when it fails.
        """
        name = f"{payload.topic}/{payload.partition}/{payload.offset}"
        topic = self.settings.dead_letter_topic
        message = payload.message
        if message is None and (topic is not None or self.dead_letter_fallback is not None):
            raise KafkaDeadLetterError(f"{name}: the record was not kept for dead-lettering")
        cause = self._letters.unconfigured()
        if topic is not None and message is not None:
            try:
                await self._publish_dead_letter(topic, message, reason, verdicts)
            except KafkaProducerError as exc:
                if self.dead_letter_fallback is None:
                    raise
                cause = f"the dead-letter topic {topic} refused it: {exc}"
            else:
                self._letters.sent(name, topic, reason, verdicts)
                return
        await self._letters.keep(
            source=name, reason=reason, cause=cause, verdicts=verdicts,
            payload=(message and message.value) or b"",
            headers=message.headers if message is not None else (),
            history=f"after {failures} failed deliveries",
        )

    async def _publish_dead_letter(
        self, topic: str, message: KafkaMessage, reason: str, verdicts: Sequence[Verdict]
    ) -> None:
        if self._dlq is None:
            aiokafka = _sdk()
            try:
                producer = aiokafka.AIOKafkaProducer(**self.dead_letter_config())
            except (TypeError, ValueError, _sdk("aiokafka.errors").KafkaError) as exc:
                raise KafkaConfigError(f"invalid dead-letter producer settings: {exc}") from exc
            await self._retrying("connecting the dead-letter producer", producer.start,
                                 KafkaConnectError)
            self._dlq = producer
        headers = [
            *message.headers,
            (DLQ_HEADER_TOPIC, message.topic.encode()),
            (DLQ_HEADER_PARTITION, str(message.partition).encode()),
            (DLQ_HEADER_OFFSET, str(message.offset).encode()),
            *((name, text.encode("utf-8", "replace"))
              for name, text in dead_letter_annotations(reason, verdicts).items()),
        ]
        dlq = self._dlq
        name = f"{message.topic}/{message.partition}/{message.offset}"

        async def send() -> None:
            await dlq.send_and_wait(topic, value=message.value, key=message.key, headers=headers)

        await self._retrying(f"dead-lettering {name} to {topic}", send, KafkaDeadLetterError)

    async def republish(self, letters: Sequence[DeadLetter]) -> None:
        """Produce kept dead letters again, each a new record of its source topic.

        Outside any poll, on a producer of its own (stopped before this
        returns). Each letter's value and headers go, in order and each
        acknowledged before the next, to the topic and partition its
        ``topic/partition/offset`` source names; without a key (none is
        kept), at a new offset: the store sees a new raw event, so a
        repeated call fires the events again. Raises
        :class:`KafkaRepublishError` (nothing sent) when a letter names no
        topic of this stream, and when a send fails after bounded retries
        (the earlier letters are published); :class:`KafkaConnectError` when
        the brokers cannot be reached. See :mod:`sharedstream.producers._kafka_republish`.
        """
        await republish_records(self.settings, letters, sdk=_sdk, retrying=self._retrying)

    async def aclose(self) -> None:
        """Commit the final targets (best-effort), then stop the consumer and the DLQ, once.

        Called after the engine advanced what was resolved, so the final
        commit covers everything stored; if it fails, the rest is redelivered.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._committer.close()
        finally:
            consumer, self._consumer = self._consumer, None
            dlq, self._dlq = self._dlq, None
            self._lanes.clear()
        try:
            if consumer is not None:
                await consumer.stop()
        finally:
            if dlq is not None:
                await dlq.stop()
