"""The SQS module's types: its errors, settings, the message filters receive, the payload.

Everything here is re-exported by :mod:`sharedstream.producers.sqs`; import
it from there. Nothing here imports aiobotocore.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from sharedstream.brokerkit.codecs import DecodeCache
from sharedstream.engine.errors import SharedStreamError

__all__ = [
    "BATCH",
    "DLQ_ATTRIBUTE_DETAIL",
    "DLQ_ATTRIBUTE_MESSAGE_ID",
    "DLQ_ATTRIBUTE_QUEUE",
    "DLQ_ATTRIBUTE_REASON",
    "DLQ_ATTRIBUTE_RECEIVE_COUNT",
    "DLQ_ATTRIBUTE_TRIGGERS",
    "REASON_MAX_REDELIVERIES",
    "REASON_REJECTED",
    "SqsConfigError",
    "SqsDeadLetterError",
    "SqsMessage",
    "SqsPayload",
    "SqsProducerError",
    "SqsRequestError",
    "SqsSettings",
    "queue_name",
]

DLQ_ATTRIBUTE_QUEUE = "sharedstream.source-queue"
DLQ_ATTRIBUTE_MESSAGE_ID = "sharedstream.source-message-id"
DLQ_ATTRIBUTE_REASON = "sharedstream.reason"
DLQ_ATTRIBUTE_RECEIVE_COUNT = "sharedstream.receive-count"
DLQ_ATTRIBUTE_TRIGGERS = "sharedstream.triggers"
DLQ_ATTRIBUTE_DETAIL = "sharedstream.detail"
"""Message attributes added to a dead-lettered copy (String, Number for the count):
the source, the reason, the ids of the triggers that rejected it or kept failing
on it (comma-separated) and what they said."""

REASON_REJECTED = "rejected"
REASON_MAX_REDELIVERIES = "max_redeliveries"

BATCH = 10
"""Entries per SQS batch call (the service's limit)."""


class SqsProducerError(SharedStreamError):
    """Base class of the errors the SQS producer raises."""


class SqsConfigError(SqsProducerError, ValueError):
    """The settings are unusable (no such queue, a bad timeout, no credentials...)."""


class SqsRequestError(SqsProducerError):
    """An SQS call failed after botocore's retries and ours; the poll ends and restarts.

    ``code`` is SQS's error code (empty when the call never got an answer)
    and ``sender_fault`` whether SQS blamed the request itself (too big, an
    invalid parameter): sending the same request again fails the same way.
    """

    retryable = True

    def __init__(self, message: str, *, code: str = "", sender_fault: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.sender_fault = sender_fault


class SqsDeadLetterError(SqsProducerError):
    """A copy could not be sent to the dead-letter queue; the message was kept."""

    retryable = True


def queue_name(queue: str) -> str:
    """The queue's name, from a name or a queue URL (its last path segment)."""
    return queue.rstrip("/").rsplit("/", 1)[-1]


def _fingerprint(values: Mapping[str, Any]) -> str:
    canonical = json.dumps(dict(values), sort_keys=True, default=repr).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


@dataclass(frozen=True)
class SqsSettings:
    """Everything the shared receiver needs; built from a trigger's kwargs."""

    queue: str
    """Queue URL, or name (looked up with ``GetQueueUrl``)."""
    region_name: str = "us-east-1"
    endpoint_url: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)
    """``aws_access_key_id`` / ``aws_secret_access_key`` / ``aws_session_token``;
    empty: botocore's usual chain (environment, profile, instance role)."""
    wait_time_seconds: int = 20
    max_messages: int = BATCH
    receive_concurrency: int = 4
    visibility_timeout: int = 30
    failure_visibility: int = 0
    dead_letter_queue: str | None = None
    max_redeliveries: int = 5
    max_in_flight: int = 500
    """Messages received but not yet advanced before receiving pauses (below the
    subscriber queue size, so prefetch alone never overflows a subscriber)."""
    delete_concurrency: int = 4
    retries: int = 4
    """Attempts per call, by botocore (standard mode), then rounds of ours."""

    def validate(self) -> None:
        """Raise :class:`SqsConfigError` for settings that cannot work.

        Complete for what the producer sends: its client skips botocore's
        own request validation (see ``SqsSharedStreamProducer``).
        """
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if type(value) is not int:
                raise SqsConfigError(
                    f"{name} must be an int, got {type(value).__qualname__} (queue {self.queue!r})"
                )
        texts = {"queue": self.queue, "region_name": self.region_name,
                 "endpoint_url": self.endpoint_url, "dead_letter_queue": self.dead_letter_queue}
        for name, value in texts.items():
            if value is not None and type(value) is not str:
                raise SqsConfigError(
                    f"{name} must be a str, got {type(value).__qualname__} (queue {self.queue!r})"
                )
        checks = [
            (bool(self.queue), "queue (a URL or a name) is required"),
            (0 <= self.wait_time_seconds <= 20, "wait_time_seconds must be within 0..20"),
            (1 <= self.max_messages <= BATCH, "max_messages must be within 1..10"),
            (self.receive_concurrency >= 1, "receive_concurrency must be >= 1"),
            (2 <= self.visibility_timeout <= 43_200, "visibility_timeout must be within 2..43200"),
            (0 <= self.failure_visibility <= 43_200, "failure_visibility must be within 0..43200"),
            (self.max_redeliveries >= 0, "max_redeliveries must be >= 0"),
            (self.max_in_flight >= self.max_messages,
             "max_in_flight must be at least max_messages"),
            (self.delete_concurrency >= 1 and self.retries >= 1,
             "delete_concurrency and retries must be >= 1"),
        ]
        for ok, problem in checks:
            if not ok:
                raise SqsConfigError(f"{problem} (queue {self.queue!r})")
        if self.dead_letter_queue is not None and (
            queue_name(self.dead_letter_queue) == queue_name(self.queue)
        ):
            raise SqsConfigError("dead_letter_queue must not be the consumed queue")
        unknown = set(self.credentials) - {"aws_access_key_id", "aws_secret_access_key",
                                            "aws_session_token"}
        if unknown:
            raise SqsConfigError(f"unknown credential fields {sorted(unknown)}")

    def identity(self) -> tuple[str, str | None, str]:
        """Which queue this is: region, endpoint and queue name."""
        return (self.region_name, self.endpoint_url, queue_name(self.queue))

    def credentials_digest(self) -> str:
        """A short digest of the credentials, safe to log and to put in a key."""
        return _fingerprint(self.credentials) if self.credentials else ""

    def fingerprint(self) -> str:
        """A digest of every setting (secrets included, never shown)."""
        return _fingerprint(asdict(self))


_INT_FIELDS = ("wait_time_seconds", "max_messages", "receive_concurrency", "visibility_timeout",
               "failure_visibility", "max_redeliveries", "max_in_flight", "delete_concurrency",
               "retries")


class SqsMessage(DecodeCache):
    """The raw event every filter of an SQS shared stream receives (read-only, shared).

    ``body`` is the message text; ``attributes`` the message attributes
    (``String``/``Number`` as ``str``, ``Binary`` as ``bytes``);
    ``system_attributes`` what SQS reports (``SentTimestamp``, ...).
    """

    __slots__ = ("_attributes", "body", "group_id", "message_id", "queue", "raw_attributes",
                 "receive_count", "sent_timestamp", "system_attributes")

    def __init__(self, queue: str, raw: Mapping[str, Any]) -> None:
        super().__init__()
        self.queue = queue
        self.message_id: str = raw["MessageId"]
        self.body: str = raw.get("Body", "")
        system: Mapping[str, str] = raw.get("Attributes") or {}
        self.system_attributes = system
        self.receive_count = int(system.get("ApproximateReceiveCount", 1))
        self.sent_timestamp = int(system.get("SentTimestamp", 0))
        self.group_id: str | None = system.get("MessageGroupId")
        self.raw_attributes: Mapping[str, Any] = raw.get("MessageAttributes") or {}
        self._attributes: dict[str, str | bytes] | None = None

    def raw_bytes(self) -> bytes:
        """The body as UTF-8: what :meth:`decoded` decodes (encoded only on a cache miss)."""
        return self.body.encode()

    @property
    def attributes(self) -> dict[str, str | bytes]:
        """Message attributes by name (built on first use, then shared: read-only)."""
        if self._attributes is None:
            self._attributes = {
                name: value["BinaryValue"] if "BinaryValue" in value
                else value.get("StringValue", "")
                for name, value in self.raw_attributes.items()
            }
        return self._attributes

    def __repr__(self) -> str:
        return f"SqsMessage({self.queue!r}, {self.message_id!r}, body={self.body[:40]!r})"


class SqsPayload(NamedTuple):
    """The broker payload: how to delete or re-show the message, and its lane."""

    message_id: str
    receipt_handle: str
    lane: Hashable
    message: SqsMessage
