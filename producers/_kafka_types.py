"""The Kafka module's types: its errors, the record filters receive, its settings.

Everything here is re-exported by :mod:`sharedstream.producers.kafka`;
import it from there. Nothing here imports aiokafka.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sharedstream.brokerkit.codecs import DecodeCache
from sharedstream.brokerkit.errors import (
    BrokerConfigError,
    BrokerConnectError,
    BrokerDeadLetterError,
    BrokerError,
    BrokerRequestError,
)
from sharedstream.brokerkit.fingerprints import secret_digest
from sharedstream.brokerkit.retry import RetryPolicy

__all__ = [
    "KafkaCommitError",
    "KafkaConfigError",
    "KafkaConnectError",
    "KafkaConsumeError",
    "KafkaDeadLetterError",
    "KafkaMessage",
    "KafkaPayload",
    "KafkaProducerError",
    "KafkaSettings",
    "message_of",
    "security_fingerprint",
    "sending_config",
]

_OWNED_CONSUMER_SETTINGS = frozenset(
    {"bootstrap_servers", "group_id", "client_id", "enable_auto_commit", "key_deserializer",
     "value_deserializer"}
)


class KafkaProducerError(BrokerError):
    """Base class of the errors the Kafka producer raises."""


class KafkaConfigError(KafkaProducerError, BrokerConfigError):
    """The settings are unusable (a lossy setting, a missing topic list, ...); fix the config."""


class KafkaConnectError(KafkaProducerError, BrokerConnectError):
    """The consumer or dead-letter producer could not connect to the brokers."""


class KafkaConsumeError(KafkaProducerError, BrokerRequestError):
    """Fetching records failed with an error that retrying in place did not fix."""


class KafkaCommitError(KafkaProducerError, BrokerRequestError):
    """Committing offsets failed after bounded retries; the group ends, nothing is skipped."""


class KafkaDeadLetterError(KafkaProducerError, BrokerDeadLetterError):
    """Publishing to the dead-letter topic failed; the record was not committed past."""


class KafkaMessage(DecodeCache):
    """The raw event every filter of a Kafka shared stream receives.

    One instance is shared by all the filters of a stream, so it carries a
    cache of decoded values (``decoded``): each format is decoded once per
    record, not once per subscriber. Treat the record and what is decoded
    from it as read-only.
    """

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(  # noqa: PLR0917 - built once per record; mirrors the record's fields
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        timestamp: int,
    ) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.key, self.value, self.headers = key, value, headers
        self.timestamp = timestamp
        """Milliseconds since the epoch (the record's timestamp)."""
        super().__init__()

    def raw_bytes(self) -> bytes | None:
        """The record's value: what :meth:`decoded` decodes."""
        return self.value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KafkaMessage):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def _fields(self) -> tuple[Any, ...]:
        return (self.topic, self.partition, self.offset, self.key, self.value, self.headers,
                self.timestamp)

    def __repr__(self) -> str:
        return (f"KafkaMessage({self.topic!r}, {self.partition}, {self.offset}, key={self.key!r}, "
                f"value={self.value!r})")


def message_of(record: Any) -> KafkaMessage:
    """The :class:`KafkaMessage` of an aiokafka ``ConsumerRecord`` (live and replayed alike)."""
    headers = record.headers
    return KafkaMessage(record.topic, record.partition, record.offset, record.key, record.value,
                        tuple(headers) if headers else (), record.timestamp)


class KafkaPayload(NamedTuple):
    """The broker payload: where the record is, and the record only when a DLQ needs it."""

    topic: str
    partition: int
    offset: int
    epoch: int
    """The assignment the record was read under; stale after a rebalance."""
    message: KafkaMessage | None


def security_fingerprint(security: Mapping[str, Any] | None) -> str:
    """A short stable digest of security settings, safe to log and to put in a key."""
    return secret_digest(security)


@dataclass(frozen=True)
class KafkaSettings:
    """Everything the shared consumer needs; built from a trigger's kwargs."""

    bootstrap_servers: str | Sequence[str]
    topics: Sequence[str]
    group_id: str
    client_id: str | None = None
    security: Mapping[str, Any] = field(default_factory=dict)
    """Passed as-is to aiokafka (``security_protocol``, ``sasl_mechanism``, ...)."""
    dead_letter_topic: str | None = None
    max_redeliveries: int = 5
    consumer_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``AIOKafkaConsumer`` keyword arguments (``session_timeout_ms``, ...)."""
    poll_timeout_ms: int = 500
    max_records: int = 500
    max_in_flight: int = 4000
    """Records yielded but not yet advanced before the poll waits (bounded prefetch)."""
    retries: int = 5
    """Retries of a failed broker call after its first attempt."""
    retry_backoff: float = 0.1
    """First retry delay in seconds; doubles each attempt, capped at 2 s."""
    commit_timeout: float = 30.0
    """Seconds one commit attempt, a revocation's commit or the final commit may take."""

    def retry_policy(self) -> RetryPolicy:
        """``retries`` and ``retry_backoff`` as the kit's policy."""
        return RetryPolicy(self.retries, self.retry_backoff)

    def validate(self) -> None:
        """Raise :class:`KafkaConfigError` for settings that cannot work or would lose data."""
        if self.consumer_overrides.get("enable_auto_commit"):
            raise KafkaConfigError(
                "enable_auto_commit=True is refused: auto-commit commits records before every "
                "subscriber finished them and their events were stored (data loss on a crash); "
                "the producer commits itself"
            )
        owned = sorted(_OWNED_CONSUMER_SETTINGS & set(self.consumer_overrides) - {
            "enable_auto_commit"})
        if owned:
            raise KafkaConfigError(
                f"consumer_overrides may not set {', '.join(owned)}: use the dedicated settings"
            )
        if isinstance(self.topics, str) or not self.topics:
            raise KafkaConfigError("topics must be a non-empty list of topic names")
        if not self.group_id:
            raise KafkaConfigError("group_id is required: offsets are committed for a group")
        if self.max_redeliveries < 0:
            raise KafkaConfigError(f"max_redeliveries must be >= 0, got {self.max_redeliveries}")
        if self.dead_letter_topic is not None and self.dead_letter_topic in self.topics:
            raise KafkaConfigError("dead_letter_topic must not be one of the consumed topics")
        if self.max_in_flight < 1 or self.max_records < 1:
            raise KafkaConfigError("max_in_flight and max_records must be >= 1")
        if self.retries < 0 or self.retry_backoff < 0:
            raise KafkaConfigError("retries and retry_backoff must be >= 0")
        if self.commit_timeout <= 0:
            raise KafkaConfigError(f"commit_timeout must be > 0, got {self.commit_timeout}")


def sending_config(settings: KafkaSettings, role: str) -> dict[str, Any]:
    """The keyword arguments of an ``AIOKafkaProducer`` sending for a stream.

    ``role`` is ``dlq`` (dead letters) or ``redrive`` (re-drives): every
    replica acknowledges, no idempotence, the stream's own security
    settings, its ``client_id`` suffixed with ``-<role>``.
    """
    config: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "enable_idempotence": False,
        "acks": "all",
        **dict(settings.security),
    }
    if settings.client_id is not None:
        config["client_id"] = f"{settings.client_id}-{role}"
    return config
