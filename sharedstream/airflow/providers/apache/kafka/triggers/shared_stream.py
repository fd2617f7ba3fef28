"""Mirror of ``airflow.providers.apache.kafka.triggers.shared_stream``: its Kafka watcher.

``from airflow.providers.apache.kafka.triggers.shared_stream import
KafkaSharedStreamTrigger`` ports as ``from
sharedstream.airflow.providers.apache.kafka.triggers.shared_stream import
KafkaSharedStreamTrigger``, with the provider's constructor, ``serialize``
kwargs, shared-stream key, event payload and filter hook::

    KafkaSharedStreamTrigger(topics=["orders"], kafka_config_id="kafka_default",
                             poll_timeout=1.0, dlq_topic="orders.dlq")

The shared stream's items are the records' raw values (``bytes``, or
``None`` for a tombstone), as the provider hands them to
:meth:`~KafkaSharedStreamTrigger.filter_shared_stream`; the default filter
fires ``TriggerEvent(value decoded as UTF-8)`` for every record. Subclass
and override ``filter_shared_stream`` to filter or transform.

Underneath it is :class:`sharedstream.producers.kafka.KafkaSharedStreamProducer`
- commit floors per ``(topic, partition)``, the dead-letter topic (here
``dlq_topic``), the redelivery limit for poison records, the persistence
gate - configured from the Airflow connection ``kafka_config_id``, whose
``extra`` is a confluent-kafka config dict, translated as for our own
trigger (:func:`sharedstream.triggers.kafka.kafka_settings_from_connection`
says what is honoured, refused and ignored); here the connection must also
name ``bootstrap.servers`` and ``group.id``, and ``enable.auto.commit`` true
is refused as a connection error. The connection is looked up through
:func:`sharedstream.connections.get_connection` when the stream opens in the
triggerer (as the provider's producer does when it connects), never when the
definitions file is loaded or the producer is built: no broker address or
secret is in the trigger's kwargs.

Differences from the provider are listed in ``docs/airflow.md``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from sharedstream.airflow.providers._lazy_producer import LazyProducer
from sharedstream.connections import InvalidConnection, get_connection
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.producers import kafka as _ours
from sharedstream.triggers.kafka import kafka_settings_from_connection

__all__ = ["KafkaBrokerPayload", "KafkaSharedStreamProducer", "KafkaSharedStreamTrigger"]

KafkaBrokerPayload = _ours.KafkaPayload
"""The broker payload: ``topic``, ``partition``, ``offset`` as in the provider.

It is our producer's payload, so the record's ``value`` and ``key`` are on
its ``message`` (and ``epoch`` names the assignment it was read under).
"""

STREAM_KIND = "kafka-shared-stream"
"""The first element of every shared-stream key of this trigger."""


def _check(topics: Sequence[str], poll_timeout: float, dlq_topic: str | None) -> list[str]:
    """The topics, sorted; ``KafkaConfigError`` for arguments no stream can run with."""
    if isinstance(topics, str) or not topics or not all(
            isinstance(t, str) and t for t in topics):
        raise _ours.KafkaConfigError(f"topics must be a non-empty list of topic names, "
                                     f"got {topics!r}")
    if not isinstance(poll_timeout, int | float) or poll_timeout <= 0:
        raise _ours.KafkaConfigError(f"poll_timeout must be a positive number of seconds, "
                                     f"got {poll_timeout!r}")
    if dlq_topic is not None and dlq_topic in topics:
        raise _ours.KafkaConfigError("dlq_topic must not be one of the consumed topics")
    return sorted(topics)


def _consumer_settings(kafka_config_id: str) -> dict[str, Any]:
    """The consumer settings connection ``kafka_config_id`` gives, as the provider requires them.

    :func:`~sharedstream.triggers.kafka.kafka_settings_from_connection`'s
    translation, with the provider's requirements on top: ``bootstrap.servers``
    and ``group.id`` must be in the extra, and ``enable.auto.commit`` true is
    an :class:`InvalidConnection` saying it "must set enable.auto.commit=false"
    (a connection error: only this stream fails). Raises
    :class:`~sharedstream.connections.ConnectionNotFound` for a missing one.
    """
    connection = get_connection(kafka_config_id)
    found = kafka_settings_from_connection(connection)

    def invalid(problem: str, key: str) -> InvalidConnection:
        return InvalidConnection(connection.conn_id, connection.source, problem, key=key)

    if found["consumer_overrides"].get("enable_auto_commit"):
        raise invalid("enable.auto.commit=true is refused: it commits records before their "
                      "events are stored (data loss on a crash); must set "
                      "enable.auto.commit=false", "enable.auto.commit")
    for setting, key in (("bootstrap_servers", "bootstrap.servers"), ("group_id", "group.id")):
        if not found[setting]:
            raise invalid(f"{key} is required in the connection's extra (its confluent-kafka "
                          "config)", key)
    return found


def _producer(topics: Sequence[str], kafka_config_id: str, poll_timeout: float,
              dlq_topic: str | None) -> _ours.KafkaSharedStreamProducer:
    """Our producer, configured from connection ``kafka_config_id`` (read now)."""
    found = _consumer_settings(kafka_config_id)
    return _ours.KafkaSharedStreamProducer(_ours.KafkaSettings(
        bootstrap_servers=found["bootstrap_servers"],
        topics=tuple(topics),
        group_id=found["group_id"],
        client_id=found["client_id"],
        security=found["security"],
        dead_letter_topic=dlq_topic,
        consumer_overrides=found["consumer_overrides"],
        poll_timeout_ms=max(1, round(poll_timeout * 1000)),
    ))


class KafkaSharedStreamProducer(LazyProducer[_ours.KafkaSharedStreamProducer]):
    """Our Kafka producer, configured from an Airflow connection, yielding raw values.

    Built by :meth:`KafkaSharedStreamTrigger.create_shared_stream_producer`
    in the triggerer; building it checks the arguments and reads nothing.
    The stream, when it opens, looks up ``kafka_config_id`` and translates
    its confluent-kafka config (:meth:`resolve` does it at once): a missing
    connection (:class:`~sharedstream.connections.ConnectionNotFound`) or a
    refused setting (:class:`~sharedstream.connections.InvalidConnection`)
    is a one-line error of that stream's poll, restarted with backoff like a
    broker that cannot be reached, while other streams run on. Keys without
    effect here are named in one warning per connection. Everything else -
    the outcome policy, commits, dead letters - is
    :class:`sharedstream.producers.kafka.KafkaSharedStreamProducer`'s.
    """

    def __init__(
        self,
        *,
        topics: Sequence[str],
        kafka_config_id: str = "kafka_default",
        poll_timeout: float = 1.0,
        dlq_topic: str | None = None,
    ) -> None:
        sorted_topics = _check(topics, poll_timeout, dlq_topic)
        super().__init__(
            functools.partial(_producer, sorted_topics, kafka_config_id, poll_timeout, dlq_topic),
            attributes={"messaging.system": "kafka",
                        "messaging.destination.name": ",".join(sorted_topics)},
            together=_ours.KafkaSharedStreamProducer.advances_lanes_together)

    def unwrap(self, message: Any) -> Any:
        """The record's raw value (``bytes``; ``None``: a tombstone), as the provider gives it."""
        return message.value


class KafkaSharedStreamTrigger(BaseEventTrigger):
    """Fire for every record of ``topics``: the provider's shared-stream Kafka watcher.

    :param topics: the topics the shared consumer reads (sorted here).
    :param kafka_config_id: the Airflow connection whose ``extra`` is the
        confluent-kafka consumer config; it must name ``bootstrap.servers``
        and ``group.id``, and must not set ``enable.auto.commit`` true.
    :param poll_timeout: seconds one fetch waits for records.
    :param dlq_topic: where rejected records go (value and key, plus
        ``sharedstream.*`` headers); ``None``: the triggerer's dead-letter
        table, or dropped with a warning.

    Triggers with the same topics and connection share one consumer; the
    first subscriber's ``poll_timeout`` and ``dlq_topic`` configure it.
    """

    def __init__(
        self,
        *,
        topics: Sequence[str],
        kafka_config_id: str = "kafka_default",
        poll_timeout: float = 1.0,
        dlq_topic: str | None = None,
    ) -> None:
        super().__init__()
        self.topics = _check(topics, poll_timeout, dlq_topic)
        self.kafka_config_id = kafka_config_id
        self.poll_timeout = poll_timeout
        self.dlq_topic = dlq_topic

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``; the classpath names the class, a subclass included."""
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "topics": list(self.topics),
            "kafka_config_id": self.kafka_config_id,
            "poll_timeout": self.poll_timeout,
            "dlq_topic": self.dlq_topic,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: this trigger runs on its shared stream only."""
        raise NotImplementedError(f"{type(self).__qualname__} runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def shared_stream_name(self) -> str:
        """``kafka orders (connection kafka_default)``: the topics and the connection."""
        return f"kafka {','.join(self.topics)} (connection {self.kafka_config_id})"

    def shared_stream_key(self) -> Hashable:
        """``("kafka-shared-stream", topics, kafka_config_id)``, as the provider's."""
        return (STREAM_KIND, tuple(self.topics), self.kafka_config_id)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs; reads the connection."""
        return KafkaSharedStreamProducer(
            topics=kwargs["topics"], kafka_config_id=kwargs.get("kafka_config_id", "kafka_default"),
            poll_timeout=kwargs.get("poll_timeout", 1.0), dlq_topic=kwargs.get("dlq_topic"),
        )

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Fire ``TriggerEvent(value)`` per record, a ``bytes`` value decoded as UTF-8.

        The items are raw record values. A value that is not UTF-8 is
        rejected (dead-lettered), where the provider's filter would raise.
        Override to filter or transform; the items stay the raw values.
        """
        async for value in shared_stream:
            if not isinstance(value, bytes):
                yield TriggerEvent(value)
                continue
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                reject_shared_stream_event(f"the record's value is not UTF-8: {exc}")
                continue
            yield TriggerEvent(text)
