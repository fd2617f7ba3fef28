"""Kafka asset watchers: many triggers, one consumer-group member per stream.

:class:`KafkaSharedStreamTrigger` runs in ack mode on
:class:`~sharedstream.producers.kafka.KafkaSharedStreamProducer`: every
trigger with the same broker, topics, group and consumer settings shares one
consumer, and an offset is committed only once every trigger is done with the
record and the events it fired are stored.

A trigger decodes each record's value (``payload_format``), applies its
declarative ``match`` and fires one event per matching record::

    KafkaSharedStreamTrigger(
        bootstrap_servers="broker:9092", topics=["orders"], group_id="sharedstream-orders",
        payload_format="json", dead_letter_topic="orders.dlq",
        match={"key": "eu", "headers": {"source": "web"}, "json": {"order.amount": 100}},
    )

A value that does not decode is *rejected*: dead-lettered (or discarded, with
a warning, when no ``dead_letter_topic`` is set), never redelivered.

Decoding, matching, the prefilter, the filter and vouching for payloads come
from :class:`~sharedstream.brokerkit.trigger.BrokerTrigger`; this module says
where a :class:`~sharedstream.producers.kafka.KafkaMessage` keeps its value,
key and headers, what an event's payload is, and which settings make the
shared consumer.

For logic a dict cannot express, subclass and override :meth:`matches`
(called with the decoded value and the raw
:class:`~sharedstream.producers.kafka.KafkaMessage`), or
:meth:`filter_shared_stream` itself::

    class BigOrders(KafkaSharedStreamTrigger):
        def __init__(self, *, min_amount: int, **kwargs):
            super().__init__(payload_format="json", **kwargs)
            self.min_amount = min_amount

        def serialize(self):
            classpath, kwargs = super().serialize()  # classpath names the subclass
            del kwargs["payload_format"]
            return classpath, {**kwargs, "min_amount": self.min_amount}

        def matches(self, value, message):
            return super().matches(value, message) and value.get("amount", 0) >= self.min_amount

The subclass keeps the shared-stream key, so it shares the consumer with
plain ``KafkaSharedStreamTrigger`` watchers of the same stream.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, PayloadFormat
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.kafka import (
    KafkaConfigError,
    KafkaMessage,
    KafkaSettings,
    KafkaSharedStreamProducer,
    security_fingerprint,
)

__all__ = ["PAYLOAD_FORMATS", "KafkaSharedStreamTrigger", "normalize_bootstrap"]

PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "bytes": AS_HELD, "utf-8": UTF8, "json": JSON, "msgpack": MSGPACK}
"""``payload_format`` -> how a record's value is decoded (``bytes``: as is)."""


def normalize_bootstrap(bootstrap_servers: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"b:9092,a:9092"`` and ``["a:9092", "b:9092"]`` name the same cluster."""
    if isinstance(bootstrap_servers, str):
        parts = bootstrap_servers.split(",")
    else:
        parts = list(bootstrap_servers)
    return tuple(sorted({part.strip() for part in parts if part.strip()}))


class KafkaSharedStreamTrigger(BrokerTrigger):
    """Fire for each record of ``topics`` whose decoded value matches ``match``.

    :param bootstrap_servers: ``"host:port,..."`` or a list.
    :param topics: topics consumed by the shared consumer.
    :param group_id: the Kafka consumer group; offsets are committed for it.
        Give each distinct stream (each distinct key) its own group id.
    :param client_id: the consumer's client id (optional).
    :param security: aiokafka security settings passed through
        (``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``, ...).
        Only a digest of them is put in the shared-stream key.
    :param payload_format: ``bytes`` (as is), ``utf-8`` (text), ``json`` or
        ``msgpack``; a value that does not decode is rejected.
    :param dead_letter_topic: where rejected and poison records go; ``None``
        discards them with a warning.
    :param max_redeliveries: failed deliveries of one record tolerated before
        it is dead-lettered instead of held.
    :param match: ``{"key": ..., "headers": {name: value}, "json": {"a.b": value}}``;
        every given condition must hold. ``json`` paths need a ``json`` or
        ``msgpack`` payload format.
    :param consumer_overrides: extra ``AIOKafkaConsumer`` settings
        (``session_timeout_ms``, ...); ``enable_auto_commit=True`` is refused.

    The payload of each event is a dict: ``value`` (decoded), ``topic``,
    ``partition``, ``offset``, ``key`` (bytes or ``None``), ``headers`` (list
    of ``(name, bytes)``) and ``timestamp`` (ms).
    """

    payload_formats: ClassVar[Mapping[str, PayloadFormat]] = PAYLOAD_FORMATS
    match_key_field = "key"
    match_named_field = "headers"

    def __init__(
        self,
        *,
        bootstrap_servers: str | list[str],
        topics: list[str],
        group_id: str,
        client_id: str | None = None,
        security: dict[str, Any] | None = None,
        payload_format: str = "bytes",
        dead_letter_topic: str | None = None,
        max_redeliveries: int = 5,
        match: dict[str, Any] | None = None,
        consumer_overrides: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics)
        self.group_id = group_id
        self.client_id = client_id
        self.security = dict(security or {})
        self.dead_letter_topic = dead_letter_topic
        self.max_redeliveries = max_redeliveries
        self.consumer_overrides = dict(consumer_overrides or {})
        # Refuse lossy or inconsistent settings where the trigger is declared.
        self.settings()

    def consumer_kwargs(self) -> dict[str, Any]:
        """The consumer's constructor kwargs (all but ``payload_format`` and ``match``)."""
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "topics": self.topics,
            "group_id": self.group_id,
            "client_id": self.client_id,
            "security": self.security,
            "dead_letter_topic": self.dead_letter_topic,
            "max_redeliveries": self.max_redeliveries,
            "consumer_overrides": self.consumer_overrides,
        }

    def settings(self) -> KafkaSettings:
        """The shared consumer's settings (validated)."""
        settings = KafkaSettings(
            bootstrap_servers=self.bootstrap_servers,
            topics=tuple(self.topics),
            group_id=self.group_id,
            client_id=self.client_id,
            security=self.security,
            dead_letter_topic=self.dead_letter_topic,
            max_redeliveries=self.max_redeliveries,
            consumer_overrides=self.consumer_overrides,
        )
        settings.validate()
        return settings

    def shared_stream_key(self) -> Hashable:
        """Everything that changes the shared consumer or its producer, nothing per-trigger.

        ``payload_format`` and ``match`` are left out: each trigger decodes and
        filters on its own, so triggers that differ only there share one
        consumer. Security settings enter as a digest, so secrets never reach
        logs or metrics that print the key.
        """
        return (
            "kafka",
            normalize_bootstrap(self.bootstrap_servers),
            tuple(sorted(set(self.topics))),
            self.group_id,
            self.client_id,
            security_fingerprint(self.security),
            self.dead_letter_topic,
            self.max_redeliveries,
            security_fingerprint(self.consumer_overrides),
        )

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet)."""
        return KafkaSharedStreamProducer(cls._settings_from(kwargs))

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> KafkaSettings:
        try:
            return KafkaSettings(
                bootstrap_servers=kwargs["bootstrap_servers"],
                topics=tuple(kwargs["topics"]),
                group_id=kwargs["group_id"],
                client_id=kwargs.get("client_id"),
                security=dict(kwargs.get("security") or {}),
                dead_letter_topic=kwargs.get("dead_letter_topic"),
                max_redeliveries=kwargs.get("max_redeliveries", 5),
                consumer_overrides=dict(kwargs.get("consumer_overrides") or {}),
            )
        except KeyError as exc:
            raise KafkaConfigError(f"missing Kafka trigger setting {exc}") from exc

    # -- what a record holds ---------------------------------------------------------------

    def message_body(self, message: KafkaMessage) -> bytes | None:
        """The record's value."""
        return message.value

    def message_key(self, message: KafkaMessage) -> bytes | None:
        """The record's key."""
        return message.key

    def message_named_values(self, message: KafkaMessage) -> Mapping[str, bytes | None]:
        """The record's headers by name; of a header sent twice, the last one counts."""
        return dict(message.headers)

    def message_fields_native(self, message: KafkaMessage) -> bool:
        """Whether the payload is native apart from its value: headers travel as tuples."""
        return not message.headers

    def describe_message(self, message: KafkaMessage) -> str:
        """``topic/partition/offset``."""
        return f"{message.topic}/{message.partition}/{message.offset}"

    def to_payload(self, value: Any, message: KafkaMessage) -> dict[str, Any]:
        """The event payload for a matching record."""
        return {
            "value": value,
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "key": message.key,
            "headers": [(name, raw) for name, raw in message.headers],
            "timestamp": message.timestamp,
        }
