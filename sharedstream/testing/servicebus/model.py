"""The Service Bus test server's vocabulary: messages, filters, entity settings, deliveries.

Plain, immutable records shared by :mod:`.state` (which keeps them) and
:mod:`.service` (which turns them into AMQP). Nothing here imports proton.

A :class:`Message` is what a sender sent, kept as its encoded AMQP bytes
(never re-encoded, so every section the client wrote comes back as written)
plus the few facts the broker acts on: its session id, and the system and
application properties a :class:`CorrelationFilter` compares.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "ARGUMENT_ERROR",
    "DEFAULT_KEY",
    "MESSAGE_LOCK_LOST",
    "MESSAGE_NOT_FOUND",
    "MESSAGE_SIZE_EXCEEDED",
    "NEXT_SESSION",
    "NEXT_SESSION_WAIT",
    "NOT_ALLOWED",
    "NOT_FOUND",
    "SESSION_CANNOT_BE_LOCKED",
    "SESSION_LOCK_LOST",
    "STANDARD_MAX_MESSAGE_SIZE",
    "UNAUTHORIZED",
    "AccessKey",
    "CorrelationFilter",
    "Delivery",
    "EntitySettings",
    "Message",
    "MessageState",
    "Namespace",
    "NextSession",
    "Outcome",
    "Refused",
    "Right",
]

NOT_FOUND: Final = "amqp:not-found"
NOT_ALLOWED: Final = "amqp:not-allowed"
ARGUMENT_ERROR: Final = "com.microsoft:argument-error"
MESSAGE_LOCK_LOST: Final = "com.microsoft:message-lock-lost"
MESSAGE_NOT_FOUND: Final = "com.microsoft:message-not-found"
SESSION_LOCK_LOST: Final = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED: Final = "com.microsoft:session-cannot-be-locked"
UNAUTHORIZED: Final = "amqp:unauthorized-access"
MESSAGE_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"

STANDARD_MAX_MESSAGE_SIZE: Final = 256 * 1024
"""Bytes: the largest message a Standard namespace takes (Premium: up to 100 MB)."""

class Refused(Exception):
    """The broker refuses an operation; ``condition`` is the AMQP error condition to report.

    One of the module's condition constants: the service puts it on the
    link detach, the settlement echo or the management response, and the
    SDK maps it to its own exception (``amqp:not-found`` to
    ``MessagingEntityNotFoundError``, ``com.microsoft:message-lock-lost`` to
    ``MessageLockLostError``, and so on).
    """

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


class NextSession(enum.Enum):
    """The type of :data:`NEXT_SESSION`."""

    NEXT = "next available session"


NEXT_SESSION: Final = NextSession.NEXT
"""Asks :meth:`.state.ServiceBusState.open_receiver` for any session that has messages."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message as sent: its encoded bytes and what the broker reads from them."""

    encoded: bytes
    """The AMQP sections exactly as the sender wrote them."""
    session_id: str | None = None
    """The ``group-id`` property: the session the message belongs to."""
    properties: Mapping[str, object] = field(default_factory=dict)
    """System properties by filter name: ``message_id``, ``correlation_id``, ``to``,
    ``reply_to``, ``subject``, ``content_type``, ``session_id``, ``reply_to_session_id``
    (only those set)."""
    application_properties: Mapping[str, object] = field(default_factory=dict)
    time_to_live: float | None = None
    """Seconds from its enqueue time after which it expires (the header's ``ttl``)."""
    scheduled_enqueue_time: float | None = None
    """Epoch seconds before which it is not delivered (``x-opt-scheduled-enqueue-time``)."""


@dataclass(frozen=True, slots=True)
class CorrelationFilter:
    """A subscription rule: a message matches when every field given equals the message's.

    ``properties`` compares application properties (each must be present and
    equal). A filter with nothing set matches every message (Service Bus's
    ``TrueFilter``, the ``$Default`` rule).
    """

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: Mapping[str, object] = field(default_factory=dict)

    def matches(self, message: Message) -> bool:
        """Whether ``message`` passes this filter (pure)."""
        for name in ("correlation_id", "message_id", "to", "reply_to", "subject",
                     "session_id", "reply_to_session_id", "content_type"):
            wanted = getattr(self, name)
            if wanted is not None and message.properties.get(name) != wanted:
                return False
        missing = object()
        return all(message.application_properties.get(key, missing) == value
                   for key, value in self.properties.items())


@dataclass(frozen=True, slots=True)
class EntitySettings:
    """What a queue or a subscription does; Service Bus's defaults unless said."""

    lock_duration: float = 60.0
    """Seconds a peek-lock delivery (or a session) stays locked without a renewal."""
    max_delivery_count: int = 10
    """Failed deliveries (abandon, lock expiry) after which a message is dead-lettered."""
    requires_session: bool = False
    """Messages must carry a session id and are received through session receivers only."""
    dead_lettering_on_message_expiration: bool = False
    """An expired message goes to the dead-letter sub-queue (reason ``TTLExpiredException``)
    instead of being dropped."""
    duplicate_detection_window: float | None = None
    """Seconds a queue remembers message ids: a message whose id it saw within them is
    accepted and dropped (``None``: no duplicate detection). Queues only."""

    def __post_init__(self) -> None:
        if self.lock_duration <= 0:
            raise ValueError(f"lock_duration must be positive, not {self.lock_duration}")
        if self.max_delivery_count < 1:
            raise ValueError(f"max_delivery_count must be at least 1, not "
                             f"{self.max_delivery_count}")
        if self.duplicate_detection_window is not None and self.duplicate_detection_window <= 0:
            raise ValueError(f"duplicate_detection_window must be positive, not "
                             f"{self.duplicate_detection_window}")


class Outcome(enum.Enum):
    """How a receiver settles a peek-locked delivery."""

    COMPLETE = "complete"
    """Removed for good (AMQP ``accepted``)."""
    ABANDON = "abandon"
    """Available again, its delivery count one higher (``modified``, delivery failed)."""
    RELEASE = "release"
    """Available again, not counted (``released``: the SDK hands back prefetched messages)."""
    DEFER = "defer"
    """Kept aside, never delivered again by a receive (``modified``, undeliverable here)."""
    DEAD_LETTER = "dead-letter"
    """Moved to the entity's dead-letter sub-queue (``rejected``)."""


class MessageState(enum.IntEnum):
    """Where a delivered or peeked message stood (the ``x-opt-message-state`` annotation)."""

    ACTIVE = 0
    DEFERRED = 1
    """Settled with defer: received only by its sequence number."""
    SCHEDULED = 2
    """Its scheduled enqueue time has not come yet."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to a receiver (or shown by a peek), with the broker's facts."""

    message: Message
    sequence_number: int
    enqueued_time: float
    """Epoch seconds when the entity accepted it."""
    delivery_count: int
    """Failed deliveries before this one (the AMQP header's ``delivery-count``)."""
    lock_token: uuid.UUID | None
    """``None`` when settled on delivery (receive-and-delete) or peeked."""
    locked_until: float | None
    """Epoch seconds the message lock lasts; ``None`` for sessions, peeks and
    receive-and-delete (a session receiver's lock is the session's)."""
    extra_properties: Mapping[str, str] = field(default_factory=dict)
    """Application properties the broker added (``DeadLetterReason``,
    ``DeadLetterErrorDescription``)."""
    state: MessageState = MessageState.ACTIVE


class Right(enum.Enum):
    """What a key allows."""

    LISTEN = "Listen"
    SEND = "Send"
    MANAGE = "Manage"


@dataclass(frozen=True, slots=True)
class AccessKey:
    """One shared access policy of the namespace."""

    name: str
    secret: str
    rights: frozenset[Right] = frozenset(Right)

    def allows(self, right: Right) -> bool:
        """Whether the key has ``right`` (``Manage`` includes ``Listen`` and ``Send``)."""
        return right in self.rights or Right.MANAGE in self.rights


NEXT_SESSION_WAIT: Final = 65.0
"""Seconds Service Bus holds a next-available-session attach without a client timeout
(its refusal reads "did not complete within the allotted timeout of 00:01:05")."""

DEFAULT_KEY: Final = AccessKey("k", "v")
"""The key of a namespace that names none: what the kit's connection strings carry."""


@dataclass(frozen=True, slots=True)
class Namespace:
    """What the whole namespace does: its keys, its message size limit, its next-session wait."""

    keys: tuple[AccessKey, ...] = (DEFAULT_KEY,)
    """The shared access policies a token may be signed with (at least one)."""
    max_message_size: int = STANDARD_MAX_MESSAGE_SIZE
    """Bytes of one transfer (a batch counts as a whole), advertised on every link as its
    ``max-message-size``; a larger transfer is refused."""
    next_session_wait: float = NEXT_SESSION_WAIT
    """Seconds a next-available-session attach that gives no ``com.microsoft:timeout`` waits
    for a session to become free before it is refused with ``com.microsoft:timeout``."""

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a namespace needs at least one key")
        if self.max_message_size < 1:
            raise ValueError(f"max_message_size must be positive, not {self.max_message_size}")
        if not 0 < self.next_session_wait < float("inf"):
            raise ValueError(f"next_session_wait must be positive seconds, not "
                             f"{self.next_session_wait}")
