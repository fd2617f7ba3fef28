"""The Pub/Sub module's types: errors, settings, the message filters receive, dead letters.

google-api-core's errors are mapped onto this module's errors here
(:func:`sdk_error`, :func:`transient`), and the per-ack-id results an
exactly-once subscription reports are read here (:func:`ack_failures`).

Everything public here is re-exported by :mod:`sharedstream.producers.pubsub`;
import it from there. Nothing here imports google-cloud-pubsub: the SDK's
exception module is passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from sharedstream.brokerkit.codecs import DecodeCache
from sharedstream.brokerkit.deadletters import (
    ANNOTATION_DETAIL,
    ANNOTATION_REASON,
    ANNOTATION_TRIGGERS,
    dead_letter_annotations,
)
from sharedstream.brokerkit.errors import (
    BrokerConfigError,
    BrokerDeadLetterError,
    BrokerError,
    BrokerRequestError,
)
from sharedstream.brokerkit.fingerprints import fingerprint
from sharedstream.brokerkit.retry import RetryPolicy
from sharedstream.brokerkit.settings import check_settings
from sharedstream.engine.producer import Verdict

__all__ = [
    "ACK_BATCH",
    "CHANNEL_OPTIONS",
    "DLQ_ATTRIBUTE_DELIVERY_ATTEMPT",
    "DLQ_ATTRIBUTE_DETAIL",
    "DLQ_ATTRIBUTE_MESSAGE_ID",
    "DLQ_ATTRIBUTE_REASON",
    "DLQ_ATTRIBUTE_SUBSCRIPTION",
    "DLQ_ATTRIBUTE_TRIGGERS",
    "PubSubConfigError",
    "PubSubDeadLetterError",
    "PubSubMessage",
    "PubSubPayload",
    "PubSubProducerError",
    "PubSubRequestError",
    "PubSubSettings",
    "ack_failures",
    "dead_letter_attributes",
    "raw_request",
    "resource_path",
    "sdk_error",
    "transient",
]

DLQ_ATTRIBUTE_SUBSCRIPTION = "sharedstream.source-subscription"
DLQ_ATTRIBUTE_MESSAGE_ID = "sharedstream.source-message-id"
DLQ_ATTRIBUTE_DELIVERY_ATTEMPT = "sharedstream.delivery-attempt"
DLQ_ATTRIBUTE_REASON = ANNOTATION_REASON
DLQ_ATTRIBUTE_TRIGGERS = ANNOTATION_TRIGGERS
DLQ_ATTRIBUTE_DETAIL = ANNOTATION_DETAIL
"""Attributes added to a dead-lettered copy: the source subscription and message
id, the delivery attempt (when Pub/Sub reports one), the reason, the ids of the
triggers that rejected it or kept failing on it (comma-separated) and what they said."""

ACK_BATCH = 2500
"""Ack ids per Acknowledge / ModifyAckDeadline call (the service's limit)."""
PUBLISH_BATCH = 1000
"""Messages per Publish call (the service's limit)."""
_MAX_ATTRIBUTE_BYTES = 1024


class PubSubProducerError(BrokerError):
    """Base class of the errors the Pub/Sub producer raises."""


class PubSubConfigError(PubSubProducerError, BrokerConfigError):
    """The settings are unusable: a bad option, no such subscription, no permission."""


class PubSubRequestError(PubSubProducerError, BrokerRequestError):
    """A Pub/Sub call failed after our retries; the poll ends and restarts."""


class PubSubDeadLetterError(PubSubProducerError, BrokerDeadLetterError):
    """A copy could not be published to the dead-letter topic; the message was kept."""


CHANNEL_OPTIONS = (("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", -1))
"""gRPC options of a channel to an emulator host: no message size limit on our side.

gRPC's default receive limit is 4 MiB, and Pub/Sub takes messages of up to
10 MB: a streaming pull response carrying one larger message failed with
``RESOURCE_EXHAUSTED`` on every try, for good. Google's own transports lift
both limits the same way; Pub/Sub (or the emulator) enforces its own.
"""

_TRANSIENT = ("DeadlineExceeded", "ServiceUnavailable", "InternalServerError", "Aborted",
              "TooManyRequests", "ResourceExhausted", "Unknown", "BadGateway", "GatewayTimeout")


def transient(exc: Exception) -> bool:
    """Whether retrying the call that raised google-api-core's ``exc`` can help."""
    return any(kind.__name__ in _TRANSIENT for kind in type(exc).__mro__)


def sdk_error(what: str, exc: Exception, exceptions: Any) -> PubSubProducerError:
    """What google-api-core's ``exc`` means: this module's error, to raise ``from exc``.

    ``exceptions`` is ``google.api_core.exceptions``. A missing resource and
    a refused permission are configuration errors (retrying cannot help, the
    poll ends with one line); anything else is a request error.
    """
    if isinstance(exc, exceptions.NotFound):
        return PubSubConfigError(f"{what}: not found ({exc.message})")
    if isinstance(exc, exceptions.PermissionDenied | exceptions.Unauthenticated):
        return PubSubConfigError(f"{what}: permission denied ({exc.message})")
    return PubSubRequestError(f"{what} failed: {exc}")


def ack_failures(exc: Exception) -> dict[str, str] | None:
    """The per-ack-id failures an exactly-once subscription reported with ``exc``, if any.

    Pub/Sub answers an Acknowledge or ModifyAckDeadline on such a
    subscription with an ``ErrorInfo`` whose metadata maps each failed ack
    id to ``PERMANENT_FAILURE_*`` (the lease is gone: the message will be
    redelivered) or ``TRANSIENT_FAILURE_*`` (try again). ``None`` when
    ``exc`` carries no such map (a plain call failure).
    """
    found = getattr(exc, "metadata", None)  # the ErrorInfo's metadata map, parsed by api-core
    if not found or not hasattr(found, "items"):
        return None
    return {str(ack_id): str(status) for ack_id, status in dict(found).items()}


def raw_request(request_type: Any, **fields: Any) -> Any:
    """A GAPIC request of ``request_type`` built on its protobuf message directly.

    The same request as ``request_type(**fields)``, but the fields are set
    by the protobuf runtime in C: proto-plus would copy a list of ack ids
    into the message one Python call at a time (about 0.2 us per ack id,
    against 0.02 here), and every acknowledged message passes through one.
    """
    return request_type.wrap(request_type.pb()(**fields))


def resource_path(project: str, kind: str, name: str) -> str:
    """``projects/<project>/<kind>/<name>``, or ``name`` when it is already a full path."""
    if name.startswith("projects/"):
        return name
    return f"projects/{project}/{kind}/{name}"


@dataclass(frozen=True)
class PubSubSettings:
    """Everything the shared streaming pull needs; built from a trigger's kwargs."""

    project: str
    subscription: str
    """A subscription id of ``project``, or a full ``projects/p/subscriptions/s`` path."""
    dead_letter_topic: str | None = None
    """A topic id of ``project`` or a full path, for rejected and poison messages."""
    max_redeliveries: int = 5
    max_in_flight: int = 1000
    """Messages received and not yet advanced: the stream's ``max_outstanding_messages``."""
    max_in_flight_bytes: int = 100 * 1024 * 1024
    """The stream's ``max_outstanding_bytes``."""
    ack_deadline: int = 60
    """Seconds of each lease (the stream's ack deadline, renewed while outstanding)."""
    max_lease_duration: int = 3600
    """Seconds after receipt past which a lease is no longer renewed."""
    ack_concurrency: int = 2
    """Concurrent Acknowledge calls."""
    retries: int = 3
    retry_backoff: float = 0.2
    emulator_host: str | None = None
    """``host:port`` of an emulator or test server (plain text, no credentials);
    ``None``: ``PUBSUB_EMULATOR_HOST`` when set, else Google's endpoint."""
    tls_ca_file: str | None = None
    """A PEM file of the certificate authorities to trust: the emulator host
    (``emulator_host`` or ``PUBSUB_EMULATOR_HOST``) is then reached over TLS,
    its certificate verified against this file, still without credentials.
    ``None``: plain text to an emulator host. Not for Google's endpoint."""

    @property
    def subscription_path(self) -> str:
        """The full subscription path."""
        return resource_path(self.project, "subscriptions", self.subscription)

    @property
    def dead_letter_path(self) -> str | None:
        """The full dead-letter topic path, or ``None``."""
        if self.dead_letter_topic is None:
            return None
        return resource_path(self.project, "topics", self.dead_letter_topic)

    def validate(self) -> None:
        """Raise :class:`PubSubConfigError` for settings that cannot work."""
        check_settings(
            self, error=PubSubConfigError, where=f"subscription {self.subscription!r}",
            ints=("max_redeliveries", "max_in_flight", "max_in_flight_bytes", "ack_deadline",
                  "max_lease_duration", "ack_concurrency", "retries"),
            texts=("project", "subscription", "dead_letter_topic", "emulator_host",
                   "tls_ca_file"),
            numbers=("retry_backoff",),
            rules=lambda: [
                (bool(self.project), "project is required"),
                (bool(self.subscription), "subscription is required"),
                (self.max_redeliveries >= 0, "max_redeliveries must be >= 0"),
                (self.max_in_flight >= 1, "max_in_flight must be >= 1"),
                (self.max_in_flight_bytes >= 1, "max_in_flight_bytes must be >= 1"),
                (10 <= self.ack_deadline <= 600, "ack_deadline must be within 10..600"),
                (self.max_lease_duration >= self.ack_deadline,
                 "max_lease_duration must be at least ack_deadline"),
                (self.ack_concurrency >= 1, "ack_concurrency must be >= 1"),
                (self.retries >= 0, "retries must be >= 0"),
                (self.retry_backoff >= 0, "retry_backoff must be a number of seconds >= 0"),
            ])

    def identity(self) -> tuple[str | None, str]:
        """Which subscription this is: the emulator host (if any) and its full path."""
        return (self.emulator_host, self.subscription_path)

    def fingerprint(self) -> str:
        """A digest of every setting."""
        return fingerprint(asdict(self))

    def retry_policy(self) -> RetryPolicy:
        """``retries`` and ``retry_backoff`` as the kit's policy."""
        return RetryPolicy(self.retries, self.retry_backoff)


@lru_cache(maxsize=64)
def _iso_second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat()[:-6]  # without "+00:00"


def iso_utc(seconds: int, nanos: int) -> str:
    """A protobuf ``Timestamp`` as ISO 8601 UTC, to the microsecond (truncated).

    The same text as ``datetime.fromtimestamp(..., tz=UTC).isoformat()``
    for the truncated microsecond. Messages of one stream were mostly
    published within the same few seconds, so formatted seconds are
    cached: most calls only format the microseconds.
    """
    text = _iso_second(seconds)
    micros = nanos // 1000
    return f"{text}.{micros:06d}+00:00" if micros else f"{text}+00:00"


class PubSubMessage(DecodeCache):
    """The raw event every filter of a Pub/Sub shared stream receives (read-only, shared).

    ``data`` is the message body; ``attributes`` its attributes;
    ``ordering_key`` is ``""`` when none was set; ``delivery_attempt`` is
    Pub/Sub's count when the subscription has a dead-letter policy, else
    ``None``; ``publish_time`` is an ISO 8601 UTC timestamp.
    """

    __slots__ = ("attributes", "data", "delivery_attempt", "message_id", "ordering_key",
                 "publish_time", "subscription")

    def __init__(self, subscription: str, received: Any) -> None:
        super().__init__()
        message = received.message
        self.subscription = subscription
        self.message_id: str = message.message_id
        self.data: bytes = message.data
        attributes = message.attributes  # a protobuf map: dict() of an empty one is not free
        self.attributes: dict[str, str] = dict(attributes) if len(attributes) else {}
        self.ordering_key: str = message.ordering_key
        stamp = message.publish_time
        self.publish_time = iso_utc(stamp.seconds, stamp.nanos)
        self.delivery_attempt: int | None = received.delivery_attempt or None

    def raw_bytes(self) -> bytes:
        """The body: what :meth:`decoded` decodes."""
        return self.data

    def __repr__(self) -> str:
        return f"PubSubMessage({self.subscription!r}, {self.message_id!r}, data={self.data[:40]!r})"


class PubSubPayload(NamedTuple):
    """The broker payload: the delivery's ack id, the message's lane, and the message."""

    ack_id: str
    lane: Hashable
    message: PubSubMessage

    @property
    def message_id(self) -> str:
        """The message id (the same for every delivery)."""
        return self.message.message_id


def dead_letter_attributes(payload: PubSubPayload, reason: str,
                           verdicts: Sequence[Verdict]) -> dict[str, str]:
    """The attributes of ``payload``'s dead-lettered copy: the originals plus ours.

    Ours (source subscription, message id, delivery attempt, reason,
    triggers, detail) replace any original of the same name; values are
    cut to Pub/Sub's 1,024 bytes.
    """
    message = payload.message
    ours = {DLQ_ATTRIBUTE_SUBSCRIPTION: message.subscription,
            DLQ_ATTRIBUTE_MESSAGE_ID: message.message_id}
    if message.delivery_attempt is not None:
        ours[DLQ_ATTRIBUTE_DELIVERY_ATTEMPT] = str(message.delivery_attempt)
    ours.update(dead_letter_annotations(reason, verdicts))
    attributes: Mapping[str, str] = {**message.attributes, **ours}
    return {name: _cut(value) for name, value in attributes.items()}


def _cut(value: str) -> str:
    data = value.encode("utf-8", "surrogatepass")
    if len(data) <= _MAX_ATTRIBUTE_BYTES:
        return value
    return data[:_MAX_ATTRIBUTE_BYTES].decode("utf-8", "ignore")
