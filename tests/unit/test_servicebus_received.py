"""What a received Service Bus message becomes: each AMQP body kind, and the SDK's guarded decoder.

Messages go through the SDK's own AMQP encoder and decoder (no broker), so
bodies arrive as the SDK hands them over: strings as bytes, maps with bytes
keys, a sequence as its sections.
"""

from __future__ import annotations

import json
import re
import types
import uuid
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")

from azure.servicebus._pyamqp import _decode, _encode
from azure.servicebus._pyamqp.aio import _receiver_async
from azure.servicebus._pyamqp.message import Message
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType

from sharedstream.producers._servicebus_received import (
    MAX_DEPTH,
    UndecodableBody,
    UndecodableBodyError,
    body_bytes,
    guard_sdk_decoder,
    read_message,
)

SEQUENCE_NUMBER = b"x-opt-sequence-number"


def wire(message: Message) -> memoryview:
    """``message`` encoded as the SDK sends it."""
    return memoryview(_encode.encode_payload(bytearray(), message))


def received(**sections: Any) -> AmqpAnnotatedMessage:
    """A message with ``sections`` as the SDK's receive link hands it over (encoded, decoded)."""
    return AmqpAnnotatedMessage(message=_decode.decode_payload(wire(Message(**sections))))


def as_received(annotated: AmqpAnnotatedMessage) -> types.SimpleNamespace:
    """The attributes :func:`read_message` reads of a ``ServiceBusReceivedMessage``."""
    annotations = annotated.annotations or {}
    return types.SimpleNamespace(
        body_type=annotated.body_type, body=annotated.body,
        sequence_number=annotations.get(SEQUENCE_NUMBER), message_id=None,
        application_properties=annotated.application_properties, delivery_count=0,
        session_id=None, enqueued_time_utc=None, correlation_id=None, subject=None,
        content_type=None)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"id": 1}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(("sections", "expected"), [
    ({"data": [b'{"id": ', b"1}"]}, b'{"id": 1}'),
    ({"value": b"\xff\x00 binary"}, b"\xff\x00 binary"),
    ({"value": "text"}, b"text"),
    ({"value": None}, b"null"),
    ({"value": 5}, b"5"),
    ({"value": {"id": 1, "kind": "order", "tags": ["a", "b"], "ok": True, "price": 1.5}},
     b'{"id":1,"kind":"order","tags":["a","b"],"ok":true,"price":1.5}'),
    ({"value": {1: "one", "nested": {"empty": {}, "none": None}}},
     b'{"1":"one","nested":{"empty":{},"none":null}}'),
    ({"value": uuid.UUID(int=7)}, b'"00000000-0000-0000-0000-000000000007"'),
    ({"sequence": [[1, "two"], [{"three": 3}]]}, b'[1,"two",{"three":3}]'),
], ids=["data", "binary", "text", "null", "int", "map", "map-int-key", "uuid", "sequence"])
def test_each_body_kind_becomes_the_bytes_the_docs_say(sections: dict[str, Any],
                                                       expected: bytes) -> None:
    assert body_bytes(received(**sections), AmqpMessageBodyType) == expected


def test_a_map_body_decodes_as_json_to_the_map_sent() -> None:
    sent = {"id": 7, "kind": "order", "lines": [{"sku": "a", "qty": 2}], "note": "é ✓"}
    assert json.loads(body_bytes(received(value=sent), AmqpMessageBodyType)) == sent


@pytest.mark.parametrize(("body", "problem"), [
    ({"blob": b"\xff\xfe"}, "binary that is not UTF-8"),
    ({b"1": "text key", 1: "int key"}, "keys collide as text"),
    (nested(MAX_DEPTH + 1), f"nests deeper than {MAX_DEPTH} levels"),
    ({"when": object()}, "holds a object"),
    (UndecodableBody("ValueError: too deep"), "the SDK could not decode the message "
                                              "(ValueError: too deep)"),
], ids=["binary", "collision", "depth", "object", "marker"])
def test_a_value_json_cannot_hold_is_undecodable_naming_why(body: Any, problem: str) -> None:
    message = types.SimpleNamespace(**{**vars(as_received(received(value=None))),
                                       "body": body, "sequence_number": 12,
                                       "application_properties": {b"region": b"eu"}})
    with pytest.raises(UndecodableBodyError, match=re.escape(problem)) as caught:
        read_message("orders", message, AmqpMessageBodyType)
    # The rest of the message is read, so that one message can be dead-lettered and named.
    assert (caught.value.message.sequence_number, caught.value.message.body) == (12, b"")
    assert caught.value.message.properties == {"region": "eu"}


def test_the_sdk_refuses_a_value_nested_past_64_levels() -> None:
    """Why the guard exists: the SDK's decoder raises for the whole message."""
    with pytest.raises(ValueError, match="nesting exceeds maximum depth of 64"):
        _decode.decode_payload(wire(Message(value=nested(80))))


def test_the_guard_hands_over_a_message_the_sdk_cannot_decode_with_its_facts() -> None:
    original = _decode.decode_payload
    module = types.SimpleNamespace(decode_payload=original)
    assert guard_sdk_decoder(module)
    encoded = wire(Message(
        message_annotations={SEQUENCE_NUMBER: 41},
        application_properties={b"region": b"eu"},
        value=nested(80), footer={b"f": 1}))
    decoded = module.decode_payload(encoded)
    assert isinstance(decoded.value, UndecodableBody)
    assert "nesting exceeds maximum depth of 64" in decoded.value.reason
    assert decoded.message_annotations == {SEQUENCE_NUMBER: 41}
    assert decoded.application_properties == {b"region": b"eu"}
    assert decoded.footer == {b"f": 1}  # sections after the body are kept too
    with pytest.raises(UndecodableBodyError, match="could not decode") as caught:
        read_message("orders", as_received(AmqpAnnotatedMessage(message=decoded)),
                     AmqpMessageBodyType)
    assert caught.value.message.sequence_number == 41
    assert caught.value.message.properties == {"region": "eu"}


def test_a_value_type_the_sdk_has_no_decoder_for_arrives_undecodable() -> None:
    """A decimal32 value (AMQP 0x74, which Java and .NET clients can send): the SDK raises
    ``TypeError``, which would end the receive and come back after every lock lapse."""
    encoded = bytes(wire(Message(message_annotations={SEQUENCE_NUMBER: 5}, value=1)))
    value_section = encoded.index(bytes([0x00, 0x53, 0x77]))
    decimal32 = encoded[:value_section] + bytes([0x00, 0x53, 0x77, 0x74, 1, 2, 3, 4])
    with pytest.raises(TypeError):
        _decode.decode_payload(memoryview(decimal32))
    module = types.SimpleNamespace(decode_payload=_decode.decode_payload)
    guard_sdk_decoder(module)
    decoded = module.decode_payload(memoryview(decimal32))
    assert decoded.message_annotations == {SEQUENCE_NUMBER: 5}
    assert isinstance(decoded.value, UndecodableBody)
    assert decoded.value.reason.startswith("TypeError: ")


def test_the_guard_changes_nothing_the_sdk_decodes_and_is_installed_once() -> None:
    module = types.SimpleNamespace(decode_payload=_decode.decode_payload)
    assert guard_sdk_decoder(module)
    guarded = module.decode_payload
    assert guard_sdk_decoder(module)
    assert module.decode_payload is guarded
    encoded = wire(Message(message_annotations={SEQUENCE_NUMBER: 3}, value={"id": 3}))
    assert guarded(encoded) == _decode.decode_payload(encoded)
    assert not guard_sdk_decoder(types.SimpleNamespace())  # another SDK layout: no seam


def test_bytes_the_guard_cannot_even_delimit_still_arrive_as_one_undecodable_message() -> None:
    module = types.SimpleNamespace(decode_payload=_decode.decode_payload)
    guard_sdk_decoder(module)
    encoded = bytes(wire(Message(message_annotations={SEQUENCE_NUMBER: 9},
                                 value=nested(80))))
    for garbage in (encoded[:-30], b"\x00\x53\x77\xfe\x01", b"\xff" * 8):
        decoded = module.decode_payload(memoryview(garbage))
        assert isinstance(decoded.value, UndecodableBody), garbage


def test_the_sdk_still_decodes_through_the_name_the_guard_wraps() -> None:
    """The seam: the async receive link looks ``decode_payload`` up in its module at each call."""
    assert callable(vars(_receiver_async)["decode_payload"])
    assert "decode_payload" in _receiver_async.ReceiverLink._incoming_transfer.__code__.co_names
