"""The SQS module's types: errors, settings, the message filters receive, dead-letter entries.

botocore's errors are mapped onto this module's errors here (:func:`sdk_error`).

A dead-lettered copy is encoded here as a ``SendMessageBatch`` entry, and
entries are grouped into batches within the call's limits.

Everything public here is re-exported by :mod:`sharedstream.producers.sqs`;
import it from there. Nothing here imports aiobotocore.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from sharedstream.brokerkit.codecs import DecodeCache
from sharedstream.brokerkit.deadletters import (
    ANNOTATION_DETAIL,
    ANNOTATION_REASON,
    ANNOTATION_TRIGGERS,
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    dead_letter_annotations,
)
from sharedstream.brokerkit.errors import (
    BrokerConfigError,
    BrokerDeadLetterError,
    BrokerError,
    BrokerRequestError,
)
from sharedstream.brokerkit.fingerprints import fingerprint, secret_digest
from sharedstream.brokerkit.retry import RetryPolicy
from sharedstream.brokerkit.settings import check_settings
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import Verdict

__all__ = [
    "BATCH",
    "DLQ_ATTRIBUTE_DETAIL",
    "DLQ_ATTRIBUTE_MESSAGE_ID",
    "DLQ_ATTRIBUTE_QUEUE",
    "DLQ_ATTRIBUTE_REASON",
    "DLQ_ATTRIBUTE_RECEIVE_COUNT",
    "DLQ_ATTRIBUTE_TRIGGERS",
    "MAX_BATCH_BYTES",
    "OPERATIONS",
    "REASON_MAX_REDELIVERIES",
    "REASON_REJECTED",
    "SqsConfigError",
    "SqsDeadLetterError",
    "SqsMessage",
    "SqsPayload",
    "SqsProducerError",
    "SqsRequestError",
    "SqsSettings",
    "dead_letter_entry",
    "queue_name",
    "sdk_error",
    "sized_chunks",
]

log = key_value_logger("sharedstream.producers.sqs")

DLQ_ATTRIBUTE_QUEUE = "sharedstream.source-queue"
DLQ_ATTRIBUTE_MESSAGE_ID = "sharedstream.source-message-id"
DLQ_ATTRIBUTE_REASON = ANNOTATION_REASON
DLQ_ATTRIBUTE_RECEIVE_COUNT = "sharedstream.receive-count"
DLQ_ATTRIBUTE_TRIGGERS = ANNOTATION_TRIGGERS
DLQ_ATTRIBUTE_DETAIL = ANNOTATION_DETAIL
"""Message attributes added to a dead-lettered copy (String, Number for the count):
the source, the reason, the ids of the triggers that rejected it or kept failing
on it (comma-separated) and what they said."""

BATCH = 10
"""Entries per SQS batch call (the service's limit)."""


class SqsProducerError(BrokerError):
    """Base class of the errors the SQS producer raises."""


class SqsConfigError(SqsProducerError, BrokerConfigError):
    """The settings are unusable (no such queue, a bad timeout, no credentials...)."""


class SqsRequestError(SqsProducerError, BrokerRequestError):
    """An SQS call failed after botocore's retries and ours; the poll ends and restarts.

    ``code`` is SQS's error code (empty when the call never got an answer)
    and ``sender_fault`` whether SQS blamed the request itself (too big, an
    invalid parameter): sending the same request again fails the same way.
    """

    def __init__(self, message: str, *, code: str = "", sender_fault: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.sender_fault = sender_fault


class SqsDeadLetterError(SqsProducerError, BrokerDeadLetterError):
    """A copy could not be sent to the dead-letter queue; the message was kept."""


OPERATIONS = {
    "ReceiveMessage": "receive_message",
    "DeleteMessageBatch": "delete_message_batch",
    "ChangeMessageVisibilityBatch": "change_message_visibility_batch",
    "SendMessageBatch": "send_message_batch",
    "GetQueueUrl": "get_queue_url",
    "GetQueueAttributes": "get_queue_attributes",
}
"""The SQS API operations the producer calls, and the SDK client's method for each."""


def sdk_error(operation: str, exc: Exception, exceptions: Any) -> SqsProducerError:
    """What botocore's ``exc``, raised by ``operation``, means: this module's error for it.

    ``exceptions`` is ``botocore.exceptions`` (passed in: nothing here imports
    the SDK). Missing credentials and a missing queue are configuration
    errors; anything else is a request error, with SQS's error code and
    whether it was the sender's fault. The caller raises it ``from exc``.
    """
    if isinstance(exc, exceptions.NoCredentialsError):
        return SqsConfigError(
            f"no AWS credentials for {operation}: set the trigger's credentials or the "
            "usual AWS environment variables"
        )
    if isinstance(exc, exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        if "NonExistentQueue" in code or code == "QueueDoesNotExist":
            return SqsConfigError(f"{operation}: queue does not exist ({exc})")
        return SqsRequestError(f"{operation} failed: {exc}", code=code,
                               sender_fault=error.get("Type") == "Sender")
    return SqsRequestError(f"{operation} failed: {exc}")


def queue_name(queue: str) -> str:
    """The queue's name, from a name or a queue URL (its last path segment)."""
    return queue.rstrip("/").rsplit("/", 1)[-1]


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
    retries: int = 3
    """Retries of a failed call after its first attempt, by botocore (standard mode),
    then as many rounds of ours (a delete some entries of which failed, a receive that
    got no answer)."""
    retry_backoff: float = 0.2
    """Seconds before our first retry round; doubles each round, capped at 2 s."""
    verify: bool | str | None = None
    """TLS verification of the endpoint: ``None`` (botocore's default), ``False``
    (off), or the path of a CA bundle."""
    client_config: Mapping[str, Any] = field(default_factory=dict)
    """Further botocore ``Config`` options (``proxies``, ``connect_timeout``, ...);
    they replace the producer's own values of the same options."""

    def validate(self) -> None:
        """Raise :class:`SqsConfigError` for settings that cannot work.

        Complete for what the producer sends: its client skips botocore's
        own request validation (see ``SqsSharedStreamProducer``).
        """
        check_settings(
            self, error=SqsConfigError, where=f"queue {self.queue!r}", ints=_INT_FIELDS,
            texts=("queue", "region_name", "endpoint_url", "dead_letter_queue"),
            numbers=("retry_backoff",),
            rules=lambda: [
                (bool(self.queue), "queue (a URL or a name) is required"),
                (0 <= self.wait_time_seconds <= 20, "wait_time_seconds must be within 0..20"),
                (1 <= self.max_messages <= BATCH, "max_messages must be within 1..10"),
                (self.receive_concurrency >= 1, "receive_concurrency must be >= 1"),
                (2 <= self.visibility_timeout <= 43_200,
                 "visibility_timeout must be within 2..43200"),
                (0 <= self.failure_visibility <= 43_200,
                 "failure_visibility must be within 0..43200"),
                (self.max_redeliveries >= 0, "max_redeliveries must be >= 0"),
                (self.max_in_flight >= self.max_messages,
                 "max_in_flight must be at least max_messages"),
                (self.delete_concurrency >= 1, "delete_concurrency must be >= 1"),
                (self.retries >= 0 and self.retry_backoff >= 0,
                 "retries and retry_backoff must be >= 0"),
            ])
        if self.dead_letter_queue is not None and (
            queue_name(self.dead_letter_queue) == queue_name(self.queue)
        ):
            raise SqsConfigError("dead_letter_queue must not be the consumed queue")
        if self.verify is not None and type(self.verify) not in (bool, str):
            raise SqsConfigError(f"verify must be a bool or a CA bundle path, got {self.verify!r}")
        unknown = set(self.credentials) - {"aws_access_key_id", "aws_secret_access_key",
                                            "aws_session_token"}
        if unknown:
            raise SqsConfigError(f"unknown credential fields {sorted(unknown)}")

    def identity(self) -> tuple[str, str | None, str]:
        """Which queue this is: region, endpoint and queue name."""
        return (self.region_name, self.endpoint_url, queue_name(self.queue))

    def credentials_digest(self) -> str:
        """A short digest of the credentials, safe to log and to put in a key."""
        return secret_digest(self.credentials)

    def fingerprint(self) -> str:
        """A digest of every setting (secrets included, never shown)."""
        return fingerprint(asdict(self))

    def retry_policy(self) -> RetryPolicy:
        """``retries`` and ``retry_backoff`` as the kit's policy."""
        return RetryPolicy(self.retries, self.retry_backoff)


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


# -- dead-lettered copies ------------------------------------------------------------------

_SQS_MAX_ATTRIBUTES = 10
_OUR_ATTRIBUTES = frozenset({
    DLQ_ATTRIBUTE_QUEUE, DLQ_ATTRIBUTE_MESSAGE_ID, DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_RECEIVE_COUNT, DLQ_ATTRIBUTE_TRIGGERS, DLQ_ATTRIBUTE_DETAIL,
})

MAX_BATCH_BYTES = 1024 * 1024
"""SendMessageBatch's limit on the sum of its entries' bodies and attributes."""


def attribute_bytes(value: Mapping[str, Any]) -> bytes:
    """A message attribute's value as bytes (String and Number as UTF-8, Binary as is)."""
    data = value.get("BinaryValue")
    if isinstance(data, bytes):
        return data
    return str(value.get("StringValue", "")).encode("utf-8", "surrogatepass")


def dead_letter_entry(  # noqa: PLR0917 - one entry's parts
    entry_id: str, payload: SqsPayload, reason: str, verdicts: Sequence[Verdict],
    queue: str, fifo: bool,
) -> dict[str, Any]:
    """The SendMessageBatch entry of ``payload``'s copy for the dead-letter queue.

    The original body and attributes, plus the ``sharedstream.*`` attributes
    (source ``queue``, message id, reason, receive count, triggers, detail);
    originals are dropped, with a warning, past SQS's 10 attributes. ``fifo``:
    the dead-letter queue is FIFO (a group id and a deduplication id are set).
    """
    message = payload.message
    ours = {
        DLQ_ATTRIBUTE_QUEUE: {"DataType": "String", "StringValue": queue},
        DLQ_ATTRIBUTE_MESSAGE_ID: {"DataType": "String", "StringValue": message.message_id},
        DLQ_ATTRIBUTE_RECEIVE_COUNT: {"DataType": "Number",
                                      "StringValue": str(message.receive_count)},
    }
    for name, text in dead_letter_annotations(reason, verdicts).items():
        limited = text[:1024] if name == DLQ_ATTRIBUTE_DETAIL else text
        ours[name] = {"DataType": "String", "StringValue": limited}
    # Ours, even when the sender set them, never travel from the original.
    originals = [(k, v) for k, v in message.raw_attributes.items() if k not in _OUR_ATTRIBUTES]
    room = _SQS_MAX_ATTRIBUTES - len(ours)
    if len(originals) > room:
        log.warning("dead-lettering: dropping the attributes SQS has no room for",
                    message_id=message.message_id, kept=room, attributes=len(originals),
                    limit=_SQS_MAX_ATTRIBUTES)
    entry: dict[str, Any] = {"Id": entry_id, "MessageBody": message.body,
                             "MessageAttributes": {**dict(originals[:room]), **ours}}
    if fifo:
        entry["MessageGroupId"] = message.group_id or "sharedstream-dead-letters"
        entry["MessageDeduplicationId"] = f"{message.message_id}-{reason}"[:128]
    return entry


def _entry_bytes(entry: Mapping[str, Any]) -> int:
    """What one SendMessageBatch entry counts toward ``MAX_BATCH_BYTES``."""
    size = len(entry["MessageBody"].encode("utf-8", "surrogatepass"))
    for name, value in entry.get("MessageAttributes", {}).items():
        data = value.get("StringValue") or value.get("BinaryValue") or ""
        size += len(name) + len(value["DataType"]) + (
            len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass")))
    return size


_Entry = tuple[Any, dict[str, Any]]
"""Something to send, and its SendMessageBatch entry."""


def sized_chunks(pairs: list[_Entry]) -> list[list[_Entry]]:
    """``(item, entry)`` pairs in batches of at most ``BATCH`` entries and ``MAX_BATCH_BYTES``."""
    chunks: list[list[_Entry]] = []
    size = 0
    for pair in pairs:
        grow = _entry_bytes(pair[1])
        if not chunks or len(chunks[-1]) >= BATCH or size + grow > MAX_BATCH_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(pair)
        size += grow
    return chunks
