"""Kafka asset watchers: many triggers, one consumer-group member per stream.

:class:`KafkaSharedStreamTrigger` runs in ack mode on
:class:`~sharedstream.producers.kafka.KafkaSharedStreamProducer`: every
trigger with the same broker, topics, group and consumer settings shares one
consumer, and an offset is committed only once every trigger is done with the
record and the events it fired are stored.

A trigger decodes each record's value (``value_format``), applies its
declarative ``match`` and fires one event per matching record::

    KafkaSharedStreamTrigger(
        bootstrap_servers="broker:9092", topics=["orders"], group_id="sharedstream-orders",
        value_format="json", dead_letter_topic="orders.dlq",
        match={"key": "eu", "headers": {"source": "web"}, "json": {"order.amount": 100}},
    )

A value that does not decode is *rejected*: dead-lettered (or discarded, with
a warning, when no ``dead_letter_topic`` is set), never redelivered.

For logic a dict cannot express, subclass and override :meth:`matches`
(called with the decoded value and the raw
:class:`~sharedstream.producers.kafka.KafkaMessage`), or
:meth:`filter_shared_stream` itself::

    class BigOrders(KafkaSharedStreamTrigger):
        def __init__(self, *, min_amount: int, **kwargs):
            super().__init__(value_format="json", **kwargs)
            self.min_amount = min_amount

        def serialize(self):
            classpath, kwargs = super().serialize()  # classpath names the subclass
            del kwargs["value_format"]
            return classpath, {**kwargs, "min_amount": self.min_amount}

        def matches(self, value, message):
            return super().matches(value, message) and value.get("amount", 0) >= self.min_amount

The subclass keeps the shared-stream key, so it shares the consumer with
plain ``KafkaSharedStreamTrigger`` watchers of the same stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any

from sharedstream.brokerkit.codecs import (
    DECODERS,
    MISSING,
    as_text,
    lookup,
    match_prefilter,
    shared_prefilter,
)
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.producers.kafka import (
    KafkaConfigError,
    KafkaMessage,
    KafkaSettings,
    KafkaSharedStreamProducer,
    security_fingerprint,
)
from sharedstream.runtime.serde import MAX_DEPTH

__all__ = ["VALUE_FORMATS", "KafkaSharedStreamTrigger", "normalize_bootstrap"]

_MAX_JSON_BRACKETS = MAX_DEPTH - 3  # the payload and the stored kwargs add two levels


def _shallow(document: bytes | None) -> bool:
    """Whether a JSON document surely nests fewer than ``_MAX_JSON_BRACKETS`` deep."""
    return document is None or len(document) < _MAX_JSON_BRACKETS or (
        document.count(b"[") + document.count(b"{") < _MAX_JSON_BRACKETS)

VALUE_FORMATS = ("bytes", "utf-8", "json", "msgpack")
_MATCH_FIELDS = frozenset({"key", "headers", "json"})


def normalize_bootstrap(bootstrap_servers: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"b:9092,a:9092"`` and ``["a:9092", "b:9092"]`` name the same cluster."""
    if isinstance(bootstrap_servers, str):
        parts = bootstrap_servers.split(",")
    else:
        parts = list(bootstrap_servers)
    return tuple(sorted({part.strip() for part in parts if part.strip()}))


class KafkaSharedStreamTrigger(BaseEventTrigger):
    """Fire for each record of ``topics`` whose decoded value matches ``match``.

    :param bootstrap_servers: ``"host:port,..."`` or a list.
    :param topics: topics consumed by the shared consumer.
    :param group_id: the Kafka consumer group; offsets are committed for it.
        Give each distinct stream (each distinct key) its own group id.
    :param client_id: the consumer's client id (optional).
    :param security: aiokafka security settings passed through
        (``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``, ...).
        Only a digest of them is put in the shared-stream key.
    :param value_format: ``bytes`` (as is), ``utf-8`` (text), ``json`` or
        ``msgpack``; a value that does not decode is rejected.
    :param dead_letter_topic: where rejected and poison records go; ``None``
        discards them with a warning.
    :param max_redeliveries: failed deliveries of one record tolerated before
        it is dead-lettered instead of held.
    :param match: ``{"key": ..., "headers": {name: value}, "json": {"a.b": value}}``;
        every given condition must hold. ``json`` paths need a ``json`` or
        ``msgpack`` value format.
    :param consumer_overrides: extra ``AIOKafkaConsumer`` settings
        (``session_timeout_ms``, ...); ``enable_auto_commit=True`` is refused.

    The payload of each event is a dict: ``value`` (decoded), ``topic``,
    ``partition``, ``offset``, ``key`` (bytes or ``None``), ``headers`` (list
    of ``(name, bytes)``) and ``timestamp`` (ms).
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | list[str],
        topics: list[str],
        group_id: str,
        client_id: str | None = None,
        security: dict[str, Any] | None = None,
        value_format: str = "bytes",
        dead_letter_topic: str | None = None,
        max_redeliveries: int = 5,
        match: dict[str, Any] | None = None,
        consumer_overrides: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {VALUE_FORMATS}, got {value_format!r}")
        match = dict(match or {})
        unknown = set(match) - _MATCH_FIELDS
        if unknown:
            raise ValueError(f"unknown match fields {sorted(unknown)}; use {sorted(_MATCH_FIELDS)}")
        if "json" in match and value_format not in ("json", "msgpack"):
            raise ValueError("match['json'] needs value_format 'json' or 'msgpack'")
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics)
        self.group_id = group_id
        self.client_id = client_id
        self.security = dict(security or {})
        self.value_format = value_format
        self.dead_letter_topic = dead_letter_topic
        self.max_redeliveries = max_redeliveries
        self.match = match
        self.consumer_overrides = dict(consumer_overrides or {})
        # Refuse lossy or inconsistent settings where the trigger is declared.
        self.settings()
        # ``match`` compiled once: it is checked for every record and every trigger.
        self._decoder = DECODERS.get(value_format)
        self._key = as_text(match["key"]) if "key" in match else MISSING
        self._headers = tuple((name, as_text(wanted))
                              for name, wanted in match.get("headers", {}).items())
        self._paths = tuple((tuple(path.split(".")), wanted)
                            for path, wanted in match.get("json", {}).items())
        self._native_event: TriggerEvent | None = None  # see payload_is_native

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``; rebuilt as ``cls(**kwargs)`` by the triggerer."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "bootstrap_servers": self.bootstrap_servers,
                "topics": self.topics,
                "group_id": self.group_id,
                "client_id": self.client_id,
                "security": self.security,
                "value_format": self.value_format,
                "dead_letter_topic": self.dead_letter_topic,
                "max_redeliveries": self.max_redeliveries,
                "match": self.match,
                "consumer_overrides": self.consumer_overrides,
            },
        )

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

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: this trigger always runs on its shared stream."""
        raise NotImplementedError("KafkaSharedStreamTrigger runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def shared_stream_key(self) -> Hashable:
        """Everything that changes the shared consumer or its producer, nothing per-trigger.

        ``value_format`` and ``match`` are left out: each trigger decodes and
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

    # -- filtering -----------------------------------------------------------------------

    def decode(self, message: KafkaMessage) -> Any:
        """Decode the record's value per ``value_format``; raise ``ValueError`` if it cannot."""
        decoder = self._decoder
        if decoder is None or message.value is None:
            return message.value
        return message.decoded(self.value_format, decoder)

    def matches(self, value: Any, message: KafkaMessage) -> bool:
        """Whether the record passes ``match``; override for custom filters.

        ``match`` is compiled when the trigger is built: change it by
        building a new trigger, not by assigning to ``self.match``.
        """
        if self._key is not MISSING and as_text(message.key) != self._key:
            return False
        if self._headers:
            headers = {name: as_text(raw) for name, raw in message.headers}
            for name, wanted in self._headers:
                if headers.get(name, MISSING) != wanted:
                    return False
        paths = self._paths
        if len(paths) == 1:  # the usual case, without a generator
            parts, wanted = paths[0]
            return bool(lookup(value, parts) == wanted)
        return all(lookup(value, parts) == wanted for parts, wanted in paths)

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

    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        """Skip, at fan-out, each record that decodes but does not match.

        An undecodable record still reaches the filter, which rejects it; see
        :func:`~sharedstream.brokerkit.codecs.match_prefilter` for when there is no
        test. ``decode`` and ``matches`` then also run in the poll's task:
        keep them free of side effects.
        """
        return match_prefilter(self, KafkaSharedStreamTrigger, declared=bool(self.match),
                               shared=self._shared_prefilter)

    def _shared_prefilter(self) -> Callable[[Any], bool]:
        # The declarative match alone: one selection per record for every trigger
        # whose match has the same shape (typically: the same JSON path).
        header_names = tuple(name for name, _ in self._headers)
        parts = tuple(path for path, _ in self._paths)
        has_key = self._key is not MISSING
        decode = self.decode
        select: Callable[[KafkaMessage], tuple[Any, ...]]
        if not has_key and not header_names and len(parts) == 1:
            (path,) = parts  # the usual watcher: one JSON field

            def select_one(message: KafkaMessage) -> tuple[Any, ...]:
                return (lookup(decode(message), path),)

            select = select_one
        else:
            select = self._select_all(has_key, header_names, parts)
        wanted = (*((self._key,) if has_key else ()), *(w for _, w in self._headers),
                  *(w for _, w in self._paths))
        shape = ("kafka", self.value_format, has_key, header_names, parts)
        return shared_prefilter(shape, select, wanted)

    def _select_all(
        self, has_key: bool, header_names: tuple[str, ...], parts: tuple[tuple[str, ...], ...]
    ) -> Callable[[KafkaMessage], tuple[Any, ...]]:
        decode = self.decode

        def select(message: KafkaMessage) -> tuple[Any, ...]:
            value = decode(message)
            selected: list[Any] = [as_text(message.key)] if has_key else []
            if header_names:
                headers = {name: as_text(raw) for name, raw in message.headers}
                selected.extend(headers.get(name, MISSING) for name in header_names)
            selected.extend(lookup(value, path) for path in parts)
            return tuple(selected)

        return select

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Decode, reject what does not decode, fire for what matches."""
        decode, matches = self.decode, self.matches  # bound once: this runs per record
        vouch = self._builds_native_payloads()
        json = self.value_format == "json"
        async for message in shared_stream:
            try:
                value = decode(message)
            except ValueError as exc:
                self.log.warning("rejecting %s/%d/%d: %s", message.topic, message.partition,
                                 message.offset, exc)
                reject_shared_stream_event(str(exc))
                continue
            if matches(value, message):
                event = TriggerEvent(self.to_payload(value, message))
                # Headers travel as tuples (not native); JSON may nest too deep.
                if vouch and not message.headers and (not json or _shallow(message.value)):
                    self._native_event = event
                yield event

    def payload_is_native(self, event: TriggerEvent) -> bool:
        """True for the events this class built from a ``bytes``, text or JSON value.

        Such a payload is made of the record's fields and a decoded value
        whose types JSON cannot go beyond (a JSON document with too many
        brackets, a record with headers, a subclass that overrides
        ``decode``, ``to_payload`` or ``filter_shared_stream`` are not vouched for).
        """
        return event is self._native_event

    def _builds_native_payloads(self) -> bool:
        cls, base = type(self), KafkaSharedStreamTrigger
        return (self.value_format != "msgpack"  # msgpack values may hold ext types
                and cls.decode is base.decode and cls.to_payload is base.to_payload
                and cls.filter_shared_stream is base.filter_shared_stream)
