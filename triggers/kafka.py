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

With ``conn_id="kafka_default"`` the broker settings not given inline come
from that Airflow-style connection (see :mod:`sharedstream.connections`),
read in the triggerer when the producer is built: its extra is the
librdkafka configuration Airflow's Kafka connection holds
(``bootstrap.servers``, ``group.id``, ``security.protocol``, ``sasl.*``,
``ssl.*``...), mapped by :func:`kafka_settings_from_connection`.
"""

from __future__ import annotations

import ssl
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, PayloadFormat
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.connections import Connection
from sharedstream.connections.settings import ConnectionReader, resolve_inline
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.kafka import (
    KafkaConfigError,
    KafkaMessage,
    KafkaSettings,
    KafkaSharedStreamProducer,
    security_fingerprint,
)

__all__ = ["PAYLOAD_FORMATS", "KafkaSharedStreamTrigger", "kafka_settings_from_connection",
           "normalize_bootstrap"]

PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "bytes": AS_HELD, "utf-8": UTF8, "json": JSON, "msgpack": MSGPACK}
"""``payload_format`` -> how a record's value is decoded (``bytes``: as is)."""


_KAFKA_TUNING: Mapping[str, tuple[str, type]] = {  # librdkafka name -> aiokafka name, type
    "session.timeout.ms": ("session_timeout_ms", int),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", int),
    "max.poll.interval.ms": ("max_poll_interval_ms", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "fetch.wait.max.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "isolation.level": ("isolation_level", str),
    "check.crcs": ("check_crcs", bool),
}
_OFFSET_RESET = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
                 "latest": "latest", "largest": "latest", "end": "latest", "error": "none"}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SSL_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
              "ssl.key.password")
_SECURITY_PREFIXES = ("ssl.", "sasl.", "security.", "enable.ssl.")
_KAFKA_KEYS = ("bootstrap.servers", "group.id", "client.id", "enable.auto.commit",
               "auto.offset.reset", "security.protocol", "sasl.mechanism", "sasl.mechanisms",
               "sasl.username", "sasl.password", "ssl.endpoint.identification.algorithm",
               "enable.ssl.certificate.verification", *_SSL_FILES, *_KAFKA_TUNING)


def kafka_settings_from_connection(conn: Connection) -> dict[str, Any]:
    """The Kafka trigger settings an Airflow ``kafka`` connection gives (``docs/connections.md``).

    The extra is the confluent-kafka (librdkafka) configuration Airflow's
    Kafka provider keeps there: ``bootstrap.servers``, ``group.id`` and
    ``client.id`` (each may be given inline instead), ``security.protocol``,
    ``sasl.mechanism(s)`` (PLAIN or SCRAM) with ``sasl.username`` and
    ``sasl.password``, the ``ssl.*`` files, ``auto.offset.reset`` and the
    consumer tuning keys aiokafka has (``session.timeout.ms``...).
    ``enable.auto.commit=true`` is passed on, so the settings refuse it as
    lossy. Any other security key (``ssl.*``, ``sasl.*``, ``security.*``),
    and the login, password, host, port or schema, raise
    :class:`~sharedstream.connections.InvalidConnection` naming it; any
    other key is ignored, with one warning.
    """
    read = ConnectionReader(conn, broker="the Kafka trigger", conn_types=("kafka",))
    read.refuse(("login", "password"), "give extra sasl.username and sasl.password")
    read.refuse(("host", "port"), "give extra bootstrap.servers, as Airflow's Kafka connection "
                                  "does")
    found: dict[str, Any] = {"bootstrap_servers": read.text("bootstrap.servers"),
                             "group_id": read.text("group.id"),
                             "client_id": read.text("client.id"),
                             "security": _kafka_security(read),
                             "consumer_overrides": _consumer_overrides(read)}
    read.finish(_KAFKA_KEYS, refuse=lambda key: key.startswith(_SECURITY_PREFIXES))
    return found


def _consumer_overrides(read: ConnectionReader) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for name, (setting, kind) in _KAFKA_TUNING.items():
        value = read.integer(name) if kind is int else (
            read.flag(name) if kind is bool else read.text(name))
        if value is not None:
            overrides[setting] = value
    auto_commit = read.flag("enable.auto.commit")
    if auto_commit is not None:  # True is refused by KafkaSettings.validate, as inline
        overrides["enable_auto_commit"] = auto_commit
    reset = read.text("auto.offset.reset")
    if reset is not None:
        if reset.lower() not in _OFFSET_RESET:
            raise read.error(f"auto.offset.reset must be one of {', '.join(_OFFSET_RESET)}",
                             key="auto.offset.reset")
        overrides["auto_offset_reset"] = _OFFSET_RESET[reset.lower()]
    return overrides


def _kafka_security(read: ConnectionReader) -> dict[str, Any]:
    """The aiokafka security settings: the protocol, SASL, an SSL context (none: nothing set)."""
    protocol = read.text("security.protocol")
    mechanism = read.text("sasl.mechanism", "sasl.mechanisms")
    username, password = read.text("sasl.username"), read.text("sasl.password")
    files = {name: read.text(name) for name in _SSL_FILES}
    algorithm = read.text("ssl.endpoint.identification.algorithm")
    verify = read.flag("enable.ssl.certificate.verification")
    if protocol is None:
        if mechanism or username or password or algorithm or verify is not None or any(
                files.values()):
            raise read.error("sasl.* or ssl.* settings without security.protocol",
                             key="security.protocol")
        return {}
    protocol = protocol.upper()
    if protocol not in _PROTOCOLS:
        raise read.error(f"security.protocol must be one of {', '.join(_PROTOCOLS)}",
                         key="security.protocol")
    security: dict[str, Any] = {"security_protocol": protocol}
    if protocol.startswith("SASL_"):
        mechanism = (mechanism or "PLAIN").upper()
        if mechanism not in _MECHANISMS:
            raise read.error(f"sasl.mechanism {mechanism} is not supported (aiokafka, without "
                             f"a token callback or Kerberos set-up): use {', '.join(_MECHANISMS)}",
                             key="sasl.mechanism")
        if username is None or password is None:
            raise read.error(f"{protocol} with {mechanism} needs sasl.username and sasl.password",
                             key="sasl.username")
        security.update(sasl_mechanism=mechanism, sasl_plain_username=username,
                        sasl_plain_password=password)
    elif mechanism or username or password:
        raise read.error(f"sasl.* settings with security.protocol {protocol}: use SASL_PLAINTEXT "
                         "or SASL_SSL", key="security.protocol")
    if protocol.endswith("SSL"):
        security["ssl_context"] = _ssl_context(read, files, algorithm, verify)
    elif algorithm or verify is not None or any(files.values()):
        raise read.error(f"ssl.* settings with security.protocol {protocol}: use SSL or SASL_SSL",
                         key="security.protocol")
    return security


def _ssl_context(
    read: ConnectionReader, files: Mapping[str, str | None], algorithm: str | None,
    verify: bool | None,
) -> ssl.SSLContext:
    """The SSL context librdkafka's ``ssl.*`` settings describe (standard library only)."""
    if (algorithm or "https").lower() not in ("https", "none"):
        raise read.error("ssl.endpoint.identification.algorithm must be https or none",
                         key="ssl.endpoint.identification.algorithm")
    certificate, key = files["ssl.certificate.location"], files["ssl.key.location"]
    if key is not None and certificate is None:
        raise read.error("ssl.key.location needs ssl.certificate.location",
                         key="ssl.key.location")
    try:
        context = ssl.create_default_context(cafile=files["ssl.ca.location"])
        if certificate is not None:
            context.load_cert_chain(certificate, key, files["ssl.key.password"])
    except (OSError, ssl.SSLError) as exc:  # which file and why, never a password
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "unreadable"
        raise read.error(f"cannot load its ssl.* files: {reason}") from None
    verify_peer = True if verify is None else verify
    context.check_hostname = verify_peer and (algorithm or "https").lower() == "https"
    if not verify_peer:
        context.verify_mode = ssl.CERT_NONE
    return context


def normalize_bootstrap(
    bootstrap_servers: str | list[str] | tuple[str, ...] | None,
) -> tuple[str, ...]:
    """``"b:9092,a:9092"`` and ``["a:9092", "b:9092"]`` name the same cluster."""
    if bootstrap_servers is None:
        return ()
    if isinstance(bootstrap_servers, str):
        parts = bootstrap_servers.split(",")
    else:
        parts = list(bootstrap_servers)
    return tuple(sorted({part.strip() for part in parts if part.strip()}))


class KafkaSharedStreamTrigger(BrokerTrigger):
    """Fire for each record of ``topics`` whose decoded value matches ``match``.

    :param bootstrap_servers: ``"host:port,..."`` or a list (required unless
        the connection gives it).
    :param topics: topics consumed by the shared consumer.
    :param group_id: the Kafka consumer group; offsets are committed for it.
        Give each distinct stream (each distinct key) its own group id
        (required unless the connection gives it).
    :param conn_id: an Airflow-style ``kafka`` connection supplying the
        settings not given inline (bootstrap servers, group, security...),
        resolved in the triggerer when the consumer is built; only the id is
        stored and put in the shared-stream key.
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
        bootstrap_servers: str | list[str] | None = None,
        topics: list[str],
        group_id: str | None = None,
        client_id: str | None = None,
        security: dict[str, Any] | None = None,
        payload_format: str = "bytes",
        dead_letter_topic: str | None = None,
        max_redeliveries: int = 5,
        match: dict[str, Any] | None = None,
        consumer_overrides: dict[str, Any] | None = None,
        conn_id: str | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.conn_id = conn_id
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics)
        self.group_id = group_id
        self.client_id = client_id
        self.security = dict(security or {})
        self.dead_letter_topic = dead_letter_topic
        self.max_redeliveries = max_redeliveries
        self.consumer_overrides = dict(consumer_overrides or {})
        # Refuse lossy or inconsistent settings where the trigger is declared; with a
        # connection, what it will give is checked when the consumer is built.
        if conn_id is None:
            self.settings()
        else:
            self._settings_from({**self.consumer_kwargs(), "bootstrap_servers": "-",
                                 "group_id": self.group_id or "-"}).validate()

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
        } | ({} if self.conn_id is None else {"conn_id": self.conn_id})

    def settings(self) -> KafkaSettings:
        """The shared consumer's settings (validated), the connection's included if any.

        With a ``conn_id`` this reads the connection (in the triggerer, when
        the consumer is built; raises ``ConnectionNotFound`` if it is missing).
        """
        settings = self._settings_from(
            resolve_inline(self.consumer_kwargs(), kafka_settings_from_connection,
                           mappings=("security", "consumer_overrides")))
        settings.validate()
        return settings

    def shared_stream_name(self) -> str:
        """``kafka orders (group sharedstream-orders)``: the topics and the consumer group.

        A group the connection gives is named by the connection
        (``kafka orders (connection kafka_default)``); brokers and security
        settings never appear (see :mod:`sharedstream.engine.names`).
        """
        topics = ",".join(sorted(set(self.topics)))
        if self.group_id is None:
            return f"kafka {topics} (connection {self.conn_id})"
        return f"kafka {topics} (group {self.group_id})"

    def shared_stream_key(self) -> Hashable:
        """Everything that changes the shared consumer or its producer, nothing per-trigger.

        ``payload_format`` and ``match`` are left out: each trigger decodes and
        filters on its own, so triggers that differ only there share one
        consumer. Security settings enter as a digest, so secrets never reach
        logs or metrics that print the key.
        """
        key = (
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
        # The connection by id (never resolved here): one connection, one consumer.
        return key if self.conn_id is None else (*key, ("conn_id", self.conn_id))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet).

        A ``conn_id`` among them is resolved now, in the triggerer: the
        connection gives the settings not given inline. ``ConnectionNotFound``
        or ``InvalidConnection`` (broker configuration errors) if it cannot.
        """
        resolved = resolve_inline(kwargs, kafka_settings_from_connection,
                                  mappings=("security", "consumer_overrides"))
        return KafkaSharedStreamProducer(cls._settings_from(resolved))

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> KafkaSettings:
        for name in ("bootstrap_servers", "group_id"):
            if kwargs.get(name) is None:
                where = (f"nor by connection {kwargs['conn_id']!r}" if kwargs.get("conn_id")
                         else "and no conn_id names a connection giving it")
                raise KafkaConfigError(f"{name} is required: not given inline {where}")
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
