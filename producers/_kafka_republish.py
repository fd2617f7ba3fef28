"""Kafka: dead letters kept in the store, produced again to their topics (``republish``).

What :meth:`KafkaSharedStreamProducer.republish
<sharedstream.producers.kafka.KafkaSharedStreamProducer.republish>` does, on a
producer of its own (``enable_idempotence=False``: Tansu cannot do it;
``acks="all"``):

* a letter's ``source`` is ``topic/partition/offset`` (what the Kafka producer
  keeps); the topic must be one the stream consumes, else nothing is sent;
* each letter becomes one new record of that topic, in the given order, with
  the kept value and headers, on the partition it came from while the topic
  has it (otherwise wherever the default partitioner puts it);
* the record has no key: the Kafka producer keeps the value and headers of a
  record, not its key. A consumer that reads the key sees ``None``; pinning
  the partition keeps the record beside its key's records all the same;
* each send waits for the broker's acknowledgement before the next, so the
  order holds within a partition; a failure after bounded retries raises
  :class:`KafkaRepublishError` (the letters before it are published).

Nothing here imports aiokafka: the producer hands its SDK loader in.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from sharedstream.brokerkit.errors import BrokerRequestError
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._kafka_types import (
    KafkaConfigError,
    KafkaConnectError,
    KafkaProducerError,
    KafkaSettings,
    sending_config,
)

__all__ = ["KafkaRepublishError", "republish_records"]

log = key_value_logger("sharedstream.producers.kafka")

Retrying = Callable[[str, Callable[[], Awaitable[Any]], type[KafkaProducerError]], Awaitable[Any]]
"""The producer's bounded retry of one broker call: ``(what, call, error to wrap in)``."""


class KafkaRepublishError(KafkaProducerError, BrokerRequestError):
    """Producing dead letters again failed, or a letter names no topic of this stream.

    The letters before the one that failed are published. ``retryable`` is
    ``False`` when the letters themselves were refused (nothing was sent).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class _Record(NamedTuple):
    topic: str
    partition: int
    letter: DeadLetter


def _records(settings: KafkaSettings, letters: Sequence[DeadLetter]) -> list[_Record]:
    """Where each letter goes; raises (nothing sent yet) when one names no topic of ours."""
    records = []
    for letter in letters:
        topic, _, rest = letter.source.rpartition("/")
        topic, _, partition = topic.rpartition("/")
        if not (topic and partition.isdigit() and rest.isdigit()):
            raise KafkaRepublishError(
                f"dead letter {letter.source!r} does not name a record as topic/partition/offset",
                retryable=False)
        if topic not in settings.topics:
            raise KafkaRepublishError(
                f"dead letter {letter.source!r} is of topic {topic!r}, which this stream does "
                f"not consume ({', '.join(settings.topics)})", retryable=False)
        records.append(_Record(topic, int(partition), letter))
    return records


async def republish_records(
    settings: KafkaSettings, letters: Sequence[DeadLetter], *, sdk: OptionalSdk,
    retrying: Retrying,
) -> None:
    """Produce ``letters`` again; see the module docstring. Returns once all are acknowledged.

    ``sdk`` loads aiokafka; ``retrying`` is the producer's bounded retry.
    Raises :class:`KafkaRepublishError` for a refused letter (before
    connecting) or a failed send, :class:`KafkaConnectError` when the
    brokers cannot be reached, :class:`KafkaConfigError` for unusable
    settings. The producer is stopped either way.
    """
    records = _records(settings, letters)
    if not records:
        return
    aiokafka = sdk()
    try:
        producer = aiokafka.AIOKafkaProducer(**sending_config(settings, "redrive"))
    except (TypeError, ValueError, sdk("aiokafka.errors").KafkaError) as exc:
        raise KafkaConfigError(f"invalid re-drive producer settings: {exc}") from exc
    try:
        await retrying("connecting the re-drive producer", producer.start, KafkaConnectError)
        partitions: dict[str, set[int]] = {}
        for topic, partition, letter in records:
            if topic not in partitions:
                partitions[topic] = set(await retrying(
                    f"reading the partitions of {topic}",
                    functools.partial(producer.partitions_for, topic), KafkaRepublishError))
            pinned = partition if partition in partitions[topic] else None
            if pinned is None:
                log.warning("re-driving to another partition: the topic no longer has the "
                            "one the record came from", source=letter.source)
            await retrying(
                f"re-driving {letter.source} to {topic}",
                functools.partial(producer.send_and_wait, topic, value=letter.payload,
                                  partition=pinned, headers=list(letter.headers)),
                KafkaRepublishError)
    finally:
        await producer.stop()
    log.info("re-drove dead letters", count=len(records),
             topics=sorted({record.topic for record in records}))
