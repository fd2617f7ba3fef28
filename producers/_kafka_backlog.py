"""Kafka's backlog of a shared stream: the consumer group's lag, per partition.

Lag of a partition = its log end offset - the offset the stream's group
committed there: the records the group has not advanced past (those being
filtered right now included). A partition the group never committed on is
read from its first retained record (the producer's ``auto_offset_reset``
is ``earliest``), so its lag is everything retained.

Every partition of every consumed topic is reported, not only those
assigned to this process: the group's lag is one number per partition
whichever member holds it, so several triggerers report the same values
(aggregate with ``max``, not ``sum``). Lanes are ``topic/partition``, the
kind is ``lag``.

Asked through the producer's own consumer, with read-only calls
(``ListOffsets`` for the end and start offsets, ``OffsetFetch`` for the
commits), which aiokafka allows alongside ``getmany``; nothing here seeks
or commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.producer import BrokerBacklog
from sharedstream.producers._kafka_types import KafkaConsumeError

__all__ = ["group_lag", "lag_by_partition"]

LAG = "lag"
"""The one kind of Kafka's backlog."""


def lag_by_partition(
    ends: dict[tuple[str, int], int], committed: dict[tuple[str, int], int | None],
    starts: dict[tuple[str, int], int],
) -> BrokerBacklog:
    """``{"topic/partition": {"lag": n}}`` from end offsets, commits and start offsets.

    A partition without a commit lags from its start offset; a commit
    past the end (a topic recreated under the group) counts as no lag.
    """
    backlog: dict[str, dict[str, int]] = {}
    for (topic, partition), end in sorted(ends.items()):
        done = committed.get((topic, partition))
        floor = starts.get((topic, partition), 0) if done is None else done
        backlog[f"{topic}/{partition}"] = {LAG: max(0, end - floor)}
    return backlog


async def group_lag(consumer: Any, topics: Sequence[str], sdk: OptionalSdk) -> BrokerBacklog:
    """The group's lag on every partition of ``topics``, asked through ``consumer``.

    ``consumer`` is the producer's started ``AIOKafkaConsumer``, ``sdk`` the
    Kafka module's lazy aiokafka. Raises
    :class:`KafkaConsumeError` (wrapping aiokafka's error) when the broker
    does not answer or a topic's partitions are not known yet; the caller
    bounds the time.
    """
    error = sdk("aiokafka.errors").KafkaError
    topic_partition = sdk("aiokafka.structs").TopicPartition
    partitions = []
    for topic in topics:
        numbers = consumer.partitions_for_topic(topic)
        if not numbers:
            raise KafkaConsumeError(f"the partitions of topic {topic!r} are not known yet")
        partitions += [topic_partition(topic, n) for n in sorted(numbers)]
    try:
        ends = await consumer.end_offsets(partitions)
        commits = await asyncio.gather(*(consumer.committed(tp) for tp in partitions))
        fresh = [tp for tp, done in zip(partitions, commits, strict=True) if done is None]
        starts = await consumer.beginning_offsets(fresh) if fresh else {}
    except error as exc:
        raise KafkaConsumeError(f"reading the group's offsets failed: {exc!r}") from exc
    return lag_by_partition(
        {(tp.topic, tp.partition): offset for tp, offset in ends.items()},
        {(tp.topic, tp.partition): done for tp, done in zip(partitions, commits, strict=True)},
        {(tp.topic, tp.partition): offset for tp, offset in starts.items()},
    )
