"""RFC 6455 as the Service Bus test server speaks it: ``sharedstream.testing.servicebus.websocket``.

Pure: no socket, no proton. The frames are written out byte by byte here
(several are RFC 6455's own examples, section 5.7), not made with the
encoder under test, except where a test says it round-trips.
"""

from __future__ import annotations

import base64
import struct

import pytest

from sharedstream.testing.servicebus.websocket import (
    PATH,
    SUBPROTOCOL,
    CloseCode,
    Frame,
    FrameDecoder,
    Opcode,
    UpgradeRefused,
    WebSocketProtocolError,
    accept_key,
    close_payload,
    encode_frame,
    parse_close,
    parse_upgrade,
    refusal,
)

MASK = bytes([0x37, 0xFA, 0x21, 0x3D])
"""RFC 6455 section 5.7's masking key."""
MASKED_HELLO = bytes([0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
"""RFC 6455 section 5.7: a single-frame masked text message, "Hello"."""


def masked(first: int, payload: bytes, mask: bytes = MASK) -> bytes:
    """A client frame written out by hand: ``first`` byte, 7-bit length, the mask, the XOR."""
    assert len(payload) < 126
    return bytes([first, 0x80 | len(payload)]) + mask + bytes(
        byte ^ mask[index % 4] for index, byte in enumerate(payload))


def request(**overrides: str | None) -> bytes:
    """The SDK's upgrade request (as websocket-client writes it), with headers changed."""
    headers: dict[str, str | None] = {
        "Upgrade": "websocket", "Host": "localhost", "Origin": "https://localhost",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13",
        "Connection": "Upgrade", "Sec-WebSocket-Protocol": SUBPROTOCOL}
    target = overrides.pop("target", None) or PATH
    headers.update(overrides)
    lines = [f"GET {target} HTTP/1.1",
             *(f"{name}: {value}" for name, value in headers.items()
               if value is not None)]
    return "\r\n".join([*lines, "", ""]).encode("ascii")


# -- the upgrade (invariant 1) -----------------------------------------------------------------


def test_the_accept_key_is_rfc_6455_s_example() -> None:
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_the_sdk_s_request_is_switched_to_the_amqp_subprotocol() -> None:
    answer = parse_upgrade(request()).decode("ascii")
    status, *lines = answer.split("\r\n")
    headers = {name.lower(): value for name, _, value in
               (line.partition(": ") for line in lines if line)}
    assert status == "HTTP/1.1 101 Switching Protocols"
    assert answer.endswith("\r\n\r\n")
    assert headers == {"upgrade": "websocket", "connection": "Upgrade",
                       "sec-websocket-accept": "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=",
                       "sec-websocket-protocol": SUBPROTOCOL}


def test_header_names_and_tokens_are_case_insensitive_and_lists_are_read() -> None:
    head = request(Connection="keep-alive, upgrade", Upgrade="WebSocket",
                   **{"Sec-WebSocket-Protocol": "other, amqpwsb10"})
    assert parse_upgrade(head.replace(b"Sec-WebSocket-Key", b"sec-websocket-key")).startswith(
        b"HTTP/1.1 101 ")


@pytest.mark.parametrize(("changes", "status", "words"), [
    ({"target": "/other"}, 404, "/$servicebus/websocket"),
    ({"Sec-WebSocket-Protocol": None}, 400, SUBPROTOCOL),
    ({"Sec-WebSocket-Protocol": "mqtt"}, 400, SUBPROTOCOL),
    ({"Sec-WebSocket-Version": "8"}, 426, "13"),
    ({"Upgrade": None}, 400, "Upgrade: websocket"),
    ({"Connection": "keep-alive"}, 400, "Connection: Upgrade"),
    ({"Sec-WebSocket-Key": "c2hvcnQ="}, 400, "16 bytes"),
    ({"Sec-WebSocket-Key": None}, 400, "16 bytes"),
], ids=["path", "no-subprotocol", "other-subprotocol", "version", "no-upgrade",
        "no-connection-upgrade", "short-key", "no-key"])
def test_a_request_service_bus_would_not_take_is_refused_with_its_status(
        changes: dict[str, str | None], status: int, words: str) -> None:
    with pytest.raises(UpgradeRefused) as refused:
        parse_upgrade(request(**changes))
    assert refused.value.status == status
    assert words in refused.value.reason


def test_a_post_or_http_1_0_is_not_an_upgrade() -> None:
    for head in (request().replace(b"GET ", b"POST ", 1),
                 request().replace(b"HTTP/1.1", b"HTTP/1.0", 1), b"\r\n\r\n"):
        with pytest.raises(UpgradeRefused) as refused:
            parse_upgrade(head)
        assert refused.value.status == 400


def test_a_refusal_is_a_complete_http_answer() -> None:
    answer = refusal(426, "WebSocket version 13 only", ("Sec-WebSocket-Version: 13",))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 426 Upgrade Required"
    assert b"Sec-WebSocket-Version: 13" in head
    assert b"Connection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert body == b"WebSocket version 13 only\n"


# -- frames from the client (invariant 2) ------------------------------------------------------


def test_rfc_6455_s_masked_frame_is_unmasked() -> None:
    assert FrameDecoder().feed(MASKED_HELLO) == [Frame(Opcode.TEXT, b"Hello")]


def test_frames_fed_a_byte_at_a_time_come_out_whole_and_in_order() -> None:
    stream = masked(0x82, b"\x00SASL") + masked(0x89, b"ping!") + masked(0x82, b"AMQP")
    decoder = FrameDecoder()
    frames = [frame for byte in stream for frame in decoder.feed(bytes([byte]))]
    assert frames == [Frame(Opcode.BINARY, b"\x00SASL"), Frame(Opcode.PING, b"ping!"),
                      Frame(Opcode.BINARY, b"AMQP")]


def test_a_fragmented_message_comes_as_its_fragments_with_a_control_frame_between() -> None:
    # binary "AM" (FIN 0), ping, continuation "Q" (FIN 0), continuation "P" (FIN 1)
    stream = (masked(0x02, b"AM") + masked(0x89, b"") + masked(0x00, b"Q")
              + masked(0x80, b"P") + masked(0x82, b"next"))
    assert FrameDecoder().feed(stream) == [
        Frame(Opcode.BINARY, b"AM", final=False), Frame(Opcode.PING, b""),
        Frame(Opcode.BINARY, b"Q", final=False), Frame(Opcode.BINARY, b"P"),
        Frame(Opcode.BINARY, b"next")]


@pytest.mark.parametrize("size", [126, 65535, 65536, 300_000])
def test_16_and_64_bit_lengths(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    length = (struct.pack("!BH", 0x80 | 126, size) if size < 65536
              else struct.pack("!BQ", 0x80 | 127, size))
    mask = b"\x01\x02\x03\x04"
    body = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    stream = b"\x82" + length + mask + body
    decoder = FrameDecoder()
    assert decoder.feed(stream[:-1]) == []
    assert decoder.feed(stream[-1:]) == [Frame(Opcode.BINARY, payload)]


# -- what a client must not send (invariant 3) -------------------------------------------------


@pytest.mark.parametrize(("stream", "code", "words"), [
    (b"\x82\x04AMQP", CloseCode.PROTOCOL_ERROR, "masked"),
    (masked(0xC2, b"x"), CloseCode.PROTOCOL_ERROR, "reserved bits"),
    (masked(0x83, b"x"), CloseCode.PROTOCOL_ERROR, "opcode 0x3"),
    (masked(0x09, b"x"), CloseCode.PROTOCOL_ERROR, "control frame"),
    (b"\x89\xfe\x00\x7e" + MASK + bytes(126), CloseCode.PROTOCOL_ERROR, "control frame"),
    (masked(0x80, b"x"), CloseCode.PROTOCOL_ERROR, "continuation frame outside"),
    (masked(0x02, b"x") + masked(0x82, b"y"), CloseCode.PROTOCOL_ERROR, "new message"),
    (b"\x82\xff" + struct.pack("!Q", 1 << 63) + MASK, CloseCode.PROTOCOL_ERROR, "2**63"),
], ids=["unmasked", "rsv", "opcode", "fragmented-ping", "long-ping", "stray-continuation",
        "interleaved-message", "64-bit-msb"])
def test_a_frame_rfc_6455_forbids_is_a_protocol_error(
        stream: bytes, code: CloseCode, words: str) -> None:
    with pytest.raises(WebSocketProtocolError) as error:
        FrameDecoder().feed(stream)
    assert error.value.code == code
    assert words in error.value.reason


def test_a_frame_over_the_bound_is_refused_before_its_payload_arrives() -> None:
    header = b"\x82\xfe" + struct.pack("!H", 1001) + MASK
    with pytest.raises(WebSocketProtocolError) as error:
        FrameDecoder(max_payload=1000).feed(header)
    assert error.value.code == CloseCode.TOO_BIG


# -- frames to the client, close payloads ------------------------------------------------------


def test_server_frames_are_unmasked_as_rfc_6455_s_examples() -> None:
    assert encode_frame(Opcode.PING, b"Hello") == bytes([0x89, 0x05]) + b"Hello"
    assert encode_frame(Opcode.TEXT, b"Hel", final=False) == b"\x01\x03Hel"
    assert encode_frame(Opcode.CONTINUATION, b"lo") == b"\x80\x02lo"
    assert encode_frame(Opcode.BINARY, bytes(256))[:4] == b"\x82\x7e\x01\x00"
    assert encode_frame(Opcode.BINARY, bytes(65536))[:10] == (
        b"\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00")


def test_a_masked_frame_is_rfc_6455_s_example_and_round_trips() -> None:
    assert encode_frame(Opcode.TEXT, b"Hello", mask=MASK) == MASKED_HELLO
    payload = bytes(range(256)) * 5
    assert FrameDecoder().feed(encode_frame(Opcode.BINARY, payload, mask=MASK)) == [
        Frame(Opcode.BINARY, payload)]


def test_close_payloads() -> None:
    assert close_payload(CloseCode.NORMAL, "bye") == b"\x03\xe8bye"
    assert len(close_payload(CloseCode.NORMAL, "x" * 200)) == 125
    assert parse_close(b"") == (CloseCode.NO_STATUS, "")
    assert parse_close(b"\x0f\xa0app") == (4000, "app")
    for bad in (b"\x03", struct.pack("!H", 1005), struct.pack("!H", 999), b"\x03\xe8\xff"):
        with pytest.raises(WebSocketProtocolError):
            parse_close(bad)


def test_a_key_must_be_base64() -> None:
    with pytest.raises(UpgradeRefused, match="16 bytes"):
        parse_upgrade(request(**{"Sec-WebSocket-Key": "not base64!"}))
    sixteen = base64.b64encode(bytes(16)).decode()
    assert parse_upgrade(request(**{"Sec-WebSocket-Key": sixteen})).startswith(b"HTTP/1.1 101")
