"""Encoded AMQP 1.0 messages, as the test server reads and rewrites them (needs proton).

A message on the wire is a run of described sections (header, delivery and
message annotations, properties, application properties, a body, a
footer). The server keeps what a sender sent as those bytes and only
*rewrites* sections on the way out: the header (its ``delivery-count``),
the message annotations (the broker's ``x-opt-*`` facts), the delivery
annotations (the sender's, with the broker's ``x-opt-lock-token`` added,
moved to where AMQP puts them: azure-servicebus writes them last) and,
for a dead-lettered message, the application properties. Every other
section leaves byte for byte as it came in.

Batches: the SDK sends ``ServiceBusMessageBatch`` as one transfer of
message format ``0x80013700`` whose data sections each hold a whole
encoded message. Proton does not expose a transfer's message format, so
:func:`unpack` recognises a batch by its shape instead: no body but data
sections, no application properties, and every data section a complete
encoded message. A single message whose only payload is itself an encoded
AMQP message would be taken for a batch; nothing sharedstream sends is.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from proton import Array, Data, DataException, Described, symbol, timestamp, uint, ulong

from sharedstream.testing.servicebus.model import (
    ARGUMENT_ERROR,
    Delivery,
    Message,
    MessageState,
    Refused,
)

__all__ = ["Section", "delivery_bytes", "integers", "lock_tokens", "message_facts", "sections",
           "unpack"]

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
PROPERTIES, APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = range(0x73, 0x79)
_BODIES = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
_SYMBOLIC = {
    "amqp:header:list": HEADER, "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS, "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES, "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE, "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
_PROPERTY_FIELDS = {0: "message_id", 2: "to", 3: "subject", 4: "reply_to", 5: "correlation_id",
                    6: "content_type", 10: "session_id", 12: "reply_to_session_id"}

Section = tuple[int, Any, bytes]
"""``(section code, decoded value, encoded bytes)``; a data section's value is ``bytes``, an
AMQP value or sequence section's ``None`` (never read)."""


def sections(encoded: bytes) -> list[Section]:
    """Every section of an encoded message, in order; ``ValueError`` if it is not one.

    An AMQP value or sequence body is delimited, never read into Python
    (its value is ``None``): the server carries it as bytes, as Service Bus
    does, however deep it nests (proton's reader recurses once per level).
    """
    found: list[Section] = []
    position, view = 0, memoryview(encoded)
    while position < len(view):
        data = Data()
        try:
            size = data.decode(bytes(view[position:]))
        except DataException as exc:
            raise ValueError(f"not an AMQP message: {exc}") from exc
        data.rewind()
        if data.next() != Data.DESCRIBED or size <= 0:
            raise ValueError("not an AMQP message: a section is not a described value")
        data.enter()
        data.next()
        descriptor = data.get_object()
        code = descriptor if isinstance(descriptor, int) else _SYMBOLIC.get(str(descriptor), -1)
        if code not in range(HEADER, FOOTER + 1):
            raise ValueError(f"not an AMQP message: unknown section {descriptor!r}")
        data.next()
        body = None if code in (AMQP_SEQUENCE, AMQP_VALUE) else _owned(data.get_object())
        found.append((int(code), body, bytes(view[position:position + size])))
        position += size
    return found


def _owned(value: Any) -> Any:
    """``value`` with every binary copied out of proton's buffer, which dies with its ``Data``.

    Binaries inside maps and lists too: a sender's annotation of binary
    value went out as zeros before.
    """
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {_owned(key): _owned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_owned(item) for item in value]
    return value


def _in_order(codes: list[int]) -> bool:
    """Whether ``codes`` are sections in AMQP's order, delivery annotations anywhere.

    azure-servicebus's encoder writes a message's delivery annotations
    *last*, after the body and footer (its comment: Event Hubs ignored them
    in second place); Service Bus takes them there, so the server does too.
    """
    others = [code for code in codes if code != DELIVERY_ANNOTATIONS]
    return len(codes) - len(others) <= 1 and others == sorted(others)


def _is_message(payload: bytes) -> bool:
    try:
        found = sections(payload)
    except ValueError:
        return False
    codes = [code for code, _, _ in found]
    return any(code in _BODIES for code in codes) and _in_order(codes)


def unpack(encoded: bytes) -> list[bytes]:
    """The messages of one transfer: those of a batch (see the module docstring), or itself."""
    found = sections(encoded)
    codes = {code for code, _, _ in found}
    payloads = [value for code, value, _ in found if code == DATA]
    if (payloads and not codes & {AMQP_SEQUENCE, AMQP_VALUE, APPLICATION_PROPERTIES}
            and all(_is_message(payload) for payload in payloads)):
        return payloads
    return [encoded]


def _text(value: object) -> object:
    return str(value) if isinstance(value, uuid.UUID | int) and not isinstance(value, bool) \
        else value


SCHEDULED_ENQUEUE_TIME = symbol("x-opt-scheduled-enqueue-time")
LOCK_TOKEN = symbol("x-opt-lock-token")


def _seconds(value: object) -> float | None:
    """Seconds of a millisecond count or timestamp (``None`` stays ``None``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value / 1000
    if hasattr(value, "timestamp"):  # a datetime, should proton give one
        return float(value.timestamp())
    return None


def message_facts(encoded: bytes) -> Message:
    """A :class:`~.model.Message` of ``encoded``: its session id, filterable properties, times.

    The times are the header's ``ttl`` and the ``x-opt-scheduled-enqueue-time``
    message annotation, in seconds.
    """
    properties: dict[str, object] = {}
    application: dict[str, object] = {}
    ttl = scheduled = None
    for code, value, _ in sections(encoded):
        if code == HEADER and isinstance(value, list) and len(value) > 2:
            ttl = _seconds(value[2])
        elif code == MESSAGE_ANNOTATIONS and isinstance(value, dict):
            scheduled = _seconds(value.get(SCHEDULED_ENQUEUE_TIME))
        if code == PROPERTIES and isinstance(value, list):
            for index, name in _PROPERTY_FIELDS.items():
                if index < len(value) and value[index] is not None:
                    field = value[index]
                    properties[name] = field.decode() if isinstance(field, bytes) else _text(field)
        elif code == APPLICATION_PROPERTIES and isinstance(value, dict):
            application = {str(key): item for key, item in value.items()}
    session = properties.get("session_id")
    return Message(encoded, None if session is None else str(session), properties, application,
                   ttl, scheduled)


def _encode(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())


def delivery_bytes(delivery: Delivery) -> bytes:
    """The message of ``delivery`` as it goes out: the sent bytes with the broker's facts.

    Sets the header's ``delivery-count``; adds ``x-opt-sequence-number``,
    ``x-opt-enqueued-time``, (peek-lock outside sessions)
    ``x-opt-locked-until`` and (a deferred or scheduled message)
    ``x-opt-message-state`` to the message annotations; merges
    ``extra_properties`` into the application properties; adds
    ``x-opt-lock-token`` (peek-lock) to the sender's delivery annotations,
    which go out second, where AMQP puts them, wherever the sender wrote
    them, and always (an empty map when there is nothing to carry, as
    Service Bus sends in receive-and-delete). Every other section is kept
    as sent.
    """
    found = sections(delivery.message.encoded)
    by_code = {code: value for code, value, _ in found}
    header = list(by_code.get(HEADER) or [])
    header += [None] * (5 - len(header))
    header[4] = uint(delivery.delivery_count)
    annotations: dict[Any, Any] = dict(by_code.get(MESSAGE_ANNOTATIONS) or {})
    annotations[symbol("x-opt-sequence-number")] = delivery.sequence_number
    annotations[symbol("x-opt-enqueued-time")] = timestamp(int(delivery.enqueued_time * 1000))
    if delivery.locked_until is not None:
        annotations[symbol("x-opt-locked-until")] = timestamp(int(delivery.locked_until * 1000))
    if delivery.state is not MessageState.ACTIVE:
        annotations[symbol("x-opt-message-state")] = int(delivery.state)
    kept = [(code, raw) for code, _, raw in found
            if code not in (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS)]
    if delivery.extra_properties:
        merged = dict(by_code.get(APPLICATION_PROPERTIES) or {})
        merged.update(delivery.extra_properties)
        kept = [(code, raw) for code, raw in kept if code != APPLICATION_PROPERTIES]
        kept.append((APPLICATION_PROPERTIES, _encode(APPLICATION_PROPERTIES, merged)))
        kept.sort(key=lambda item: item[0])  # stable: sections keep the order AMQP requires
    delivery_annotations = [raw for code, _, raw in found if code == DELIVERY_ANNOTATIONS]
    if delivery.lock_token is not None or not delivery_annotations:
        carried: dict[Any, Any] = dict(by_code.get(DELIVERY_ANNOTATIONS) or {})
        if delivery.lock_token is not None:
            carried[LOCK_TOKEN] = delivery.lock_token
        delivery_annotations = [_encode(DELIVERY_ANNOTATIONS, carried)]
    return b"".join([_encode(HEADER, header), *delivery_annotations,
                     _encode(MESSAGE_ANNOTATIONS, annotations), *(raw for _, raw in kept)])


def integers(value: object) -> list[int]:
    """The numbers of a management request's array (``sequence-numbers``: AMQP longs).

    ``Refused`` with ``com.microsoft:argument-error`` if an item is not an integer.
    """
    items: Iterable[object] = value.elements if isinstance(value, Array) else (
        value if isinstance(value, list | tuple) else [])
    numbers = []
    for item in items:
        if not isinstance(item, int) or isinstance(item, bool):
            raise Refused(ARGUMENT_ERROR, f"not a sequence number: {item!r}")
        numbers.append(int(item))
    return numbers


def lock_tokens(value: object) -> list[uuid.UUID]:
    """The lock tokens of a management request's ``lock-tokens`` (an AMQP array of uuids)."""
    items: Iterable[object] = value.elements if isinstance(value, Array) else (
        value if isinstance(value, list | tuple) else [])
    tokens = []
    for item in items:
        if isinstance(item, uuid.UUID):
            tokens.append(item)
        elif isinstance(item, bytes) and len(item) == 16:
            tokens.append(uuid.UUID(bytes=item))
        else:
            tokens.append(uuid.UUID(str(item)))
    return tokens
