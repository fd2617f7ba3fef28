"""Kafka replay: a bounded reader of a shared stream's partitions, outside its consumer group.

Lanes are ``topic/partition``, positions offsets. The plan:

- **start**: the first offset at or after ``since`` (``ListOffsets`` by
  timestamp; none: nothing to replay there), or the offset given for the
  lane; never before the partition's first retained record.
- **end**: the offset the stream's group committed on the partition when
  the plan is made - what the live consumer advanced past. A partition the
  group never committed on replays nothing: the live consumer reads it
  from its first record (``auto_offset_reset`` is ``earliest``) and the new
  watcher sees all of it anyway. With ``until``, no further than the first
  offset after that time.

Two clients of its own, never the group's: the planner is a consumer with
the stream's ``group_id`` that only *reads* the group's commits
(``OffsetFetch``) - it never subscribes, joins, or commits (auto-commit is
off) - and the reader a consumer without a group, assigned the partitions
and sought to the positions. Memory: one fetch (``max_records``) at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.replay import ReplayError, ReplayItem, ReplayPlan, ReplayRequest
from sharedstream.producers._kafka_types import KafkaPayload, message_of

__all__ = ["KafkaReplaySource"]


def _millis(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def lane_of(topic: str, partition: int) -> str:
    """``topic/partition``: a Kafka lane's name, as in the backlog and in replay plans."""
    return f"{topic}/{partition}"


class KafkaReplaySource:
    """The :class:`~sharedstream.engine.replay.ReplaySource` of a Kafka shared stream."""

    def __init__(self, consumer_config: Mapping[str, Any], topics: tuple[str, ...],
                 max_records: int, sdk: OptionalSdk) -> None:
        """``consumer_config``: the live consumer's kwargs (its group, security, overrides)."""
        self._config = dict(consumer_config)
        self._topics = topics
        self._max_records = max_records
        self._sdk = sdk
        self._clients: list[Any] = []

    async def _started(self, **overrides: Any) -> Any:
        aiokafka = self._sdk("aiokafka")
        errors = self._sdk("aiokafka.errors")
        consumer = aiokafka.AIOKafkaConsumer(**{**self._config, **overrides,
                                                "enable_auto_commit": False})
        self._clients.append(consumer)
        try:
            await consumer.start()
        except errors.KafkaError as exc:
            raise ReplayError(f"cannot connect to Kafka at {self._config.get('bootstrap_servers')}"
                              f" for the replay: {exc!r}") from exc
        return consumer

    async def _partitions(self, consumer: Any) -> list[Any]:
        topic_partition = self._sdk("aiokafka.structs").TopicPartition
        known = await consumer.topics()
        found = []
        for topic in self._topics:
            if topic not in known:
                raise ReplayError(f"topic {topic!r} does not exist")
            numbers = consumer.partitions_for_topic(topic) or ()
            found += [topic_partition(topic, n) for n in sorted(numbers)]
        return found

    async def plan(self, request: ReplayRequest) -> dict[str, tuple[int, int]]:
        """Each partition's ``(start, end)`` offsets (see the module docstring)."""
        errors = self._sdk("aiokafka.errors")
        consumer = await self._started()
        try:
            partitions = await self._partitions(consumer)
            lanes = {lane_of(tp.topic, tp.partition): tp for tp in partitions}
            if request.offsets is not None:
                request = self._named(request)
                unknown = sorted(set(request.offsets or ()) - set(lanes))
                if unknown:
                    raise ReplayError(f"no such partition: {', '.join(unknown)} (the stream reads"
                                      f" {', '.join(lanes)})")
            firsts = await consumer.beginning_offsets(partitions)
            starts = await self._starts(consumer, partitions, request)
            commits = {tp: await consumer.committed(tp) for tp in partitions}
            cutoffs = ({} if request.until is None else await consumer.offsets_for_times(
                {tp: _millis(request.until) for tp in partitions}))
        except errors.KafkaError as exc:
            raise ReplayError(f"planning the replay failed: {exc!r}") from exc
        finally:
            await self._close(consumer)
        plan: dict[str, tuple[int, int]] = {}
        for lane, tp in lanes.items():
            end = commits[tp] if commits[tp] is not None else firsts[tp]
            cutoff = cutoffs.get(tp)
            if cutoff is not None:
                end = min(end, cutoff.offset)
            start = starts.get(tp)
            start = end if start is None else min(max(start, firsts[tp]), end)
            plan[lane] = (start, end)
        return plan

    def _named(self, request: ReplayRequest) -> ReplayRequest:
        """``request`` with each bare partition (``"0"``) named ``topic/0`` (one topic only)."""
        offsets = dict(request.offsets or {})
        bare = [lane for lane in offsets if "/" not in lane]
        if bare and len(self._topics) != 1:
            raise ReplayError(f"the stream reads topics {', '.join(self._topics)}: name the "
                              f"topic of each partition (topic/0:120)")
        named = {(f"{self._topics[0]}/{lane}" if "/" not in lane else lane): offset
                 for lane, offset in offsets.items()}
        return ReplayRequest(offsets=named, until=request.until)

    async def _starts(self, consumer: Any, partitions: list[Any],
                      request: ReplayRequest) -> dict[Any, int | None]:
        if request.offsets is not None:
            return {tp: request.offsets.get(lane_of(tp.topic, tp.partition))
                    for tp in partitions}
        assert request.since is not None  # noqa: S101 - ReplayRequest checks: one or the other
        found = await consumer.offsets_for_times({tp: _millis(request.since)
                                                  for tp in partitions})
        return {tp: None if found.get(tp) is None else found[tp].offset for tp in partitions}

    async def read(self, plan: ReplayPlan, positions: Mapping[str, int]
                   ) -> AsyncIterator[ReplayItem]:
        """Every record of ``plan`` from ``positions``, as the live stream gives it."""
        errors = self._sdk("aiokafka.errors")
        starts, ends = self._left(plan, positions)
        if not ends:
            return
        consumer = await self._started(group_id=None)
        try:
            consumer.assign(list(ends))
            for tp, at in starts.items():
                consumer.seek(tp, at)
            while ends:
                try:
                    chunks = await consumer.getmany(*ends, timeout_ms=1000,
                                                    max_records=self._max_records)
                except errors.KafkaError as exc:
                    raise ReplayError(f"reading the replay failed: {exc!r}") from exc
                for tp, records in chunks.items():
                    end = ends.get(tp)
                    if end is None:
                        continue
                    for record in records:
                        if record.offset >= end:
                            break
                        message = message_of(record)
                        yield ReplayItem(lane_of(tp.topic, tp.partition), record.offset + 1,
                                         message, KafkaPayload(tp.topic, tp.partition,
                                                               record.offset, 0, message))
                for tp in list(ends):  # gaps (compaction, transaction markers) end a lane too
                    if await consumer.position(tp) >= ends[tp]:
                        del ends[tp]
                        consumer.pause(tp)
        finally:
            await self._close(consumer)

    def _left(self, plan: ReplayPlan, positions: Mapping[str, int]
              ) -> tuple[dict[Any, int], dict[Any, int]]:
        """The partitions with records left: where each resumes, and where it ends."""
        topic_partition = self._sdk("aiokafka.structs").TopicPartition
        starts: dict[Any, int] = {}
        ends: dict[Any, int] = {}
        for lane, (start, end) in plan.items():
            topic, _, number = lane.rpartition("/")
            at = max(positions.get(lane, start), start)
            if at < end:
                tp = topic_partition(topic, int(number))
                starts[tp], ends[tp] = at, end
        return starts, ends

    async def _close(self, consumer: Any) -> None:
        if consumer in self._clients:
            self._clients.remove(consumer)
            await consumer.stop()

    async def aclose(self) -> None:
        """Stop every client still open; idempotent."""
        for consumer in list(self._clients):
            await self._close(consumer)
