"""What a received Service Bus message becomes: the filters' message, its body as bytes.

Private to :mod:`sharedstream.producers.servicebus`. :func:`read_message`
reads the SDK's ``ServiceBusReceivedMessage`` into the
:class:`~sharedstream.producers._servicebus_types.ServiceBusMessage` every
filter gets; :func:`body_bytes` turns each AMQP body kind into the bytes
``payload_format`` decodes; :func:`guard_sdk_decoder` keeps one message
the SDK cannot decode from shutting its receive link down.

Body kinds (an AMQP message has exactly one):

* **data** (what ``ServiceBusMessage(b"...")`` sends): its sections joined,
  byte for byte;
* **value** (``AmqpAnnotatedMessage(value_body=...)``, a JMS ``MapMessage``
  or ``TextMessage`` from other clients): a string or binary value is its
  bytes; any other value is JSON text (UTF-8), with its strings, symbols
  and binaries as JSON strings (the SDK hands all three over as bytes, so
  they must be UTF-8), maps as objects (keys as text), lists and arrays as
  arrays, UUIDs and decimals as their text, timestamps as their
  milliseconds since the epoch (the SDK gives a number);
* **sequence** (``sequence_body=[...]``): the items of its sections, in
  order, as one JSON array, converted as a value's are.

Invariants:

1. Reading a message never raises for its body alone: a body that has no
   bytes by the rules above (binary that is not UTF-8 inside a value, a map
   key that is a list, keys that collide as text, nesting deeper than
   :data:`MAX_DEPTH`, a body the SDK could not decode) raises
   :class:`UndecodableBodyError`, which carries the rest of the message
   read, so the caller rejects that one message and no other.
2. Converting a body takes time linear in its size and recursion bounded
   by :data:`MAX_DEPTH`: nothing a message holds can stall the event loop
   here.
3. The guarded SDK decoder returns what the SDK's own returns for every
   message the SDK decodes; only a message it raises for changes fate
   (see :func:`guard_sdk_decoder`).

Nothing here imports azure-servicebus: the SDK's modules are passed in.
"""

from __future__ import annotations

import decimal
import functools
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from sharedstream.producers._servicebus_types import (
    Property,
    ServiceBusMessage,
    ServiceBusProducerError,
    first_line,
)

__all__ = [
    "MAX_DEPTH",
    "UndecodableBody",
    "UndecodableBodyError",
    "body_bytes",
    "guard_sdk_decoder",
    "property_value",
    "read_message",
]

MAX_DEPTH = 64
"""Levels of maps and lists a value or sequence body may nest (the SDK's own decoder,
like the .NET client's, refuses deeper AMQP values)."""

_BODY_SECTIONS = (0x75, 0x76, 0x77)
"""The descriptor codes of AMQP's data, amqp-sequence and amqp-value sections."""
_SYMBOLIC = {b"amqp:data:binary": 0x75, b"amqp:amqp-sequence:list": 0x76,
             b"amqp:amqp-value:*": 0x77}
_GUARD_MARK = "_sharedstream_guarded"


class UndecodableBody:
    """The body of a message the SDK could not decode, put in its place by the guard.

    ``reason`` is the decoder's error, one line (``"ValueError: AMQP value
    nesting exceeds maximum depth of 64"``).
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"UndecodableBody({self.reason!r})"


class UndecodableBodyError(ServiceBusProducerError, ValueError):
    """A received message's body has no bytes by this module's rules; reject that message.

    ``message`` is the message read without its body (``body`` empty), so
    it can be dead-lettered and logged. Never raised out of the producer;
    not retryable: the same body fails the same way.
    """

    retryable = False

    def __init__(self, reason: str, message: ServiceBusMessage) -> None:
        super().__init__(reason)
        self.message = message


class _NoBytes(ValueError):
    """A body has no bytes by the module's rules (raised inside, before the message exists)."""


def read_message(entity: str, received: Any, body_types: Any) -> ServiceBusMessage:
    """The SDK's ``ServiceBusReceivedMessage`` as the message filters get.

    ``body_types`` is ``azure.servicebus.amqp.AmqpMessageBodyType``. Raises
    :class:`UndecodableBodyError` (with the message read, its body empty)
    when the body has no bytes (see the module docstring); nothing else
    about one message's body raises.
    """
    try:
        body, problem = body_bytes(received, body_types), None
    except _NoBytes as exc:
        body, problem = b"", str(exc)
    message = ServiceBusMessage(
        entity,
        # A message the guard rebuilt without its annotations has no number: 0, dead-lettered.
        sequence_number=int(received.sequence_number or 0),
        body=body,
        message_id=_text(received.message_id),
        properties={_key(name): property_value(value)
                    for name, value in (received.application_properties or {}).items()},
        delivery_count=int(received.delivery_count or 0),
        session_id=_text(received.session_id),
        enqueued_time=_iso(received.enqueued_time_utc),
        correlation_id=_text(received.correlation_id),
        subject=_text(received.subject),
        content_type=_text(received.content_type),
    )
    if problem is not None:
        raise UndecodableBodyError(problem, message)
    return message


def body_bytes(received: Any, body_types: Any) -> bytes:
    """The bytes of the received message's body, per its kind (see the module docstring).

    Raises ``ValueError`` (a private subclass, turned into
    :class:`UndecodableBodyError` by :func:`read_message`) when it has none.
    """
    kind, body = received.body_type, received.body
    if kind == body_types.DATA:
        return body if isinstance(body, bytes) else b"".join(body)
    if kind == body_types.VALUE:
        if isinstance(body, UndecodableBody):
            raise _NoBytes(f"the SDK could not decode the message ({body.reason})")
        if isinstance(body, bytes):
            return bytes(body)  # a described binary is a bytes subclass
        if isinstance(body, str):
            return body.encode("utf-8", "surrogatepass")
        return _json(body)
    if kind == body_types.SEQUENCE:
        return _json([item for section in body for item in section])
    raise _NoBytes(f"an AMQP body of unknown kind {kind!r}")


def _json(value: Any) -> bytes:
    plain = _plain(value, 0)
    return json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode()


def _plain(value: Any, depth: int) -> Any:
    """``value`` (as the SDK decoded it) made of JSON's types only; ``_NoBytes`` if it cannot be.

    Checks ``depth`` before descending, so recursion never passes :data:`MAX_DEPTH`.
    """
    if not isinstance(value, Mapping | list | tuple):
        return _plain_scalar(value)
    if depth >= MAX_DEPTH:
        raise _NoBytes(f"the value nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        plain = {_plain_key(key): _plain(item, depth + 1) for key, item in value.items()}
        if len(plain) < len(value):
            raise _NoBytes("the value is a map whose keys collide as text")
        return plain
    return [_plain(item, depth + 1) for item in value]


def _plain_scalar(value: Any) -> Any:
    # Described ints, floats and binaries are subclasses json.dumps writes as their base;
    # a timestamp arrives as its milliseconds.
    if value is None or isinstance(value, bool | str | int | float):
        return value
    if isinstance(value, bytes):
        return _utf8(value)
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    raise _NoBytes(f"the value holds a {type(value).__name__}, which JSON cannot hold")


def _plain_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return _utf8(key)
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)  # as json.dumps writes such a key: "null", "true", "1", "1.5"
    if isinstance(key, uuid.UUID | decimal.Decimal):
        return str(key)
    raise _NoBytes(f"the value is a map with a {type(key).__name__} key, which JSON cannot hold")


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _NoBytes("the value holds binary that is not UTF-8 text, "
                       "which JSON cannot hold") from None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _key(name: Any) -> str:
    return name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else str(name)


def property_value(value: Any) -> Property:
    """A property value filters and payloads can hold: text, bytes, a number, a bool."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes):
        try:  # the SDK hands received text as bytes
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    if isinstance(value, datetime):
        return _iso(value)
    return str(value)  # a UUID, a decimal...


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat()


# -- the SDK's decoder, guarded ---------------------------------------------------------------


def guard_sdk_decoder(receiver_module: Any) -> bool:
    """Make the SDK's async receive link hand over a message it cannot decode, not die of it.

    ``receiver_module`` is ``azure.servicebus._pyamqp.aio._receiver_async``,
    whose receive link decodes each incoming message with its module-level
    ``decode_payload``. azure-servicebus 7.15 refuses an AMQP value nested
    more than 64 deep there (``ValueError``) and its client takes that
    ``ValueError`` for the end of the link: the receiver shuts down, every
    later receive returns nothing at once, and the messages behind the
    poison one stay locked until their locks lapse. The guard wraps that
    name: a message the SDK decodes is returned unchanged; for one it raises
    on, the other sections are decoded one by one (any that fail are left
    out) and the body becomes an :class:`UndecodableBody` naming the error,
    so the message arrives (its lock token, sequence number and properties
    intact) and is dead-lettered alone.

    Process-wide (the SDK has no per-receiver seam) and idempotent; called
    by the producer before it opens a receiver. Returns whether the guard
    is in place: ``False`` when the SDK has no such name (another version
    or transport), and then the producer's hollow-receive check ends a poll
    whose link shut down instead.
    """
    original = getattr(receiver_module, "decode_payload", None)
    if not callable(original):
        return False
    if getattr(original, _GUARD_MARK, False):
        return True
    guarded = _guarded(original)
    setattr(guarded, _GUARD_MARK, True)
    receiver_module.decode_payload = guarded
    return True


def _guarded(decode: Callable[[memoryview], Any]) -> Callable[[memoryview], Any]:
    @functools.wraps(decode)
    def decode_payload(buffer: memoryview) -> Any:
        try:
            return decode(buffer)
        # Whatever the SDK's decoder raises on these bytes is about this message alone
        # (depth and count limits, a truncated or unknown encoding); re-raised, it would shut
        # the link down. The message comes through marked undecodable instead and is
        # dead-lettered with the reason: never lost silently, never blocking the others.
        except Exception as exc:  # noqa: BLE001
            reason = f"{type(exc).__name__}: {first_line(exc, 200)}"
        return _without_body(decode, memoryview(buffer), reason)

    return decode_payload


def _without_body(decode: Callable[[memoryview], Any], buffer: memoryview, reason: str) -> Any:
    """The SDK's message of ``buffer`` with every section that decodes, the body as a marker."""
    fields: dict[str, Any] = {}
    for start, end, code in _sections(buffer):
        if code in _BODY_SECTIONS:
            continue
        try:
            part = decode(buffer[start:end])
        except Exception:  # noqa: BLE001, S112 - a section that fails too is left out (see caller)
            continue
        fields.update((name, value) for name, value in part._asdict().items()
                      if value is not None)
    empty = decode(memoryview(b""))  # the SDK's Message, every section None
    return empty._replace(**fields, value=UndecodableBody(reason))


def _sections(buffer: memoryview) -> list[tuple[int, int, int]]:
    """``(start, end, descriptor code)`` of each section, read from sizes alone, never decoded.

    Stops at the first section it cannot delimit (an encoding it does not
    know, a size past the end): what comes after it is left out.
    """
    found = []
    position = 0
    while position < len(buffer):
        if buffer[position] != 0x00:  # every section is a described value
            break
        code, value_at = _descriptor(buffer, position + 1)
        end = _skip(buffer, value_at) if value_at is not None else None
        if end is None:
            break
        found.append((position, end, code))
        position = end
    return found


def _descriptor(buffer: memoryview, at: int) -> tuple[int, int | None]:
    """A section descriptor's code and where its value starts (``None``: not delimitable)."""
    if at >= len(buffer):
        return -1, None
    constructor = buffer[at]
    if constructor == 0x53 and at + 1 < len(buffer):  # smallulong
        return buffer[at + 1], at + 2
    if constructor == 0x80 and at + 9 <= len(buffer):  # ulong
        return int.from_bytes(buffer[at + 1:at + 9], "big"), at + 9
    end = _skip(buffer, at)  # a symbolic descriptor
    if end is None:
        return -1, None
    name = bytes(buffer[at + (2 if constructor == 0xA3 else 5):end])
    return _SYMBOLIC.get(name, -1), end


_FIXED = {**dict.fromkeys(range(0x40, 0x46), 0), **dict.fromkeys(range(0x50, 0x57), 1),
          0x60: 2, 0x61: 2, **dict.fromkeys(range(0x70, 0x75), 4),
          **dict.fromkeys(range(0x80, 0x85), 8), 0x94: 16, 0x98: 16}
"""Width after the constructor of each fixed-width AMQP encoding."""
_SIZED_1 = frozenset((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0))
_SIZED_4 = frozenset((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0))


def _skip(buffer: memoryview, at: int, described: int = 0) -> int | None:
    """Where the value encoded at ``at`` ends, from its constructor and size; ``None`` if unknown.

    A compound value is skipped by its size, never entered; a described
    value's descriptor and value are skipped in turn (a few levels at most).
    """
    if at >= len(buffer):
        return None
    constructor, at = buffer[at], at + 1
    if constructor == 0x00:
        if described >= 4:
            return None
        after = _skip(buffer, at, described + 1)
        return None if after is None else _skip(buffer, after, described + 1)
    if constructor in _FIXED:
        end = at + _FIXED[constructor]
    elif constructor in _SIZED_1 and at < len(buffer):
        end = at + 1 + buffer[at]
    elif constructor in _SIZED_4 and at + 4 <= len(buffer):
        end = at + 4 + int.from_bytes(buffer[at:at + 4], "big")
    else:
        return None
    return end if end <= len(buffer) else None
