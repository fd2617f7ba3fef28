"""The server side of WebSocket (RFC 6455) for AMQP over WebSockets, without I/O.

Service Bus takes AMQP over WebSockets on port 443 (what the SDK's
``TransportType.AmqpOverWebsocket`` and an ``http_proxy`` use): an HTTP/1.1
upgrade ``GET /$servicebus/websocket`` with the subprotocol ``AMQPWSB10``,
then the AMQP bytes, SASL header first, in binary messages, each way. This
module is the protocol, as pure functions and one decoder object; the relay
that serves it (:mod:`.websocket_front`) does the sockets.

* :func:`parse_upgrade` reads a request head and returns the
  ``101 Switching Protocols`` answer, or raises :class:`UpgradeRefused`
  with the HTTP status and reason (:func:`refusal` encodes it);
* :class:`FrameDecoder` turns the client's bytes, fed in any pieces, into
  :class:`Frame` values, unmasked;
* :func:`encode_frame` encodes one frame (unmasked, as a server sends; a
  ``mask`` makes a client's frame, for tests and tools).

Invariants (each checked in ``tests/servicebus/test_websocket_protocol.py``):

1. A request is accepted only as Service Bus's endpoint: ``GET`` of
   :data:`PATH`, ``Upgrade: websocket``, ``Connection: upgrade``,
   version 13, a key of 16 bytes, and :data:`SUBPROTOCOL` among the offered
   subprotocols (the answer names it; the SDK's sync client refuses an
   answer without it). No extension is negotiated.
2. The decoder yields frames in the order received, each frame's payload
   whole, a fragmented message as its fragments (``final`` on the last,
   continuations carrying the message's opcode): AMQP is a byte stream, so
   the relay need not join them. Control frames (ping, pong, close) may
   arrive between fragments.
3. Anything RFC 6455 forbids a client raises :class:`WebSocketProtocolError`
   with the close code to send (1002, or 1009 for a frame larger than the
   decoder's bound, which it refuses before buffering it): an unmasked
   frame, reserved bits, an unknown opcode, a fragmented or oversized
   control frame, a continuation outside a message, a data frame inside
   one, a malformed close payload. The decoder is unusable after raising.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import struct
from dataclasses import dataclass

__all__ = [
    "MAX_FRAME_PAYLOAD",
    "PATH",
    "SUBPROTOCOL",
    "CloseCode",
    "Frame",
    "FrameDecoder",
    "Opcode",
    "UpgradeRefused",
    "WebSocketProtocolError",
    "accept_key",
    "close_payload",
    "encode_frame",
    "parse_close",
    "parse_upgrade",
    "refusal",
]

PATH = "/$servicebus/websocket"
"""The resource the SDK asks for (``<namespace>/$servicebus/websocket``)."""
SUBPROTOCOL = "AMQPWSB10"
"""AMQP 1.0 over WebSocket's subprotocol name, as the SDK offers it."""
MAX_FRAME_PAYLOAD = 16 * 1024 * 1024
"""The largest frame payload accepted (the SDK sends one AMQP frame per
message, at most its 1 MB ``max-frame-size``): a larger one is closed 1009."""
MAX_HEAD = 64 * 1024
"""The largest upgrade request head read before it is refused."""
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3


class Opcode(enum.IntEnum):
    """A frame's kind (RFC 6455 section 5.2)."""

    CONTINUATION = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA

    @property
    def is_control(self) -> bool:
        """Close, ping and pong: never fragmented, at most 125 bytes."""
        return self >= Opcode.CLOSE


class CloseCode(enum.IntEnum):
    """The close status codes this server sends (RFC 6455 section 7.4.1)."""

    NORMAL = 1000
    PROTOCOL_ERROR = 1002
    UNSUPPORTED_DATA = 1003
    NO_STATUS = 1005
    """Received only: a close frame without a code."""
    TOO_BIG = 1009


class WebSocketProtocolError(Exception):
    """The client broke RFC 6455: close the connection with ``code`` and ``reason``."""

    def __init__(self, code: CloseCode, reason: str) -> None:
        super().__init__(f"{int(code)} {reason}")
        self.code, self.reason = code, reason


class UpgradeRefused(Exception):
    """The upgrade request is not one Service Bus takes: answer ``status`` (:func:`refusal`)."""

    def __init__(self, status: int, reason: str, *, headers: tuple[str, ...] = ()) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.headers = status, reason, headers


@dataclass(frozen=True)
class Frame:
    """One frame from the client, unmasked.

    ``opcode`` is the message's for a continuation (binary or text);
    ``final`` is false on every fragment but a message's last.
    """

    opcode: Opcode
    payload: bytes
    final: bool = True


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for the client's ``Sec-WebSocket-Key`` (RFC 6455 section 4.2.2)."""
    digest = hashlib.sha1(f"{key}{_GUID}".encode("ascii"), usedforsecurity=False).digest()
    return base64.b64encode(digest).decode("ascii")


def _headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name.strip() or name != name.strip():
            raise UpgradeRefused(400, f"malformed header line {line!r}")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return headers


def _tokens(value: str) -> list[str]:
    return [token.strip().lower() for token in value.split(",") if token.strip()]


def parse_upgrade(head: bytes) -> bytes:
    """The ``101`` answer to the upgrade request ``head`` (up to and with its blank line).

    Raises :class:`UpgradeRefused` with the status to answer when the
    request is not Service Bus's WebSocket endpoint (invariant 1): 404 for
    another path, 426 for another WebSocket version, 400 for anything
    else missing or malformed (a subprotocol other than
    :data:`SUBPROTOCOL` too).
    """
    lines = [line for line in head.decode("iso-8859-1").split("\r\n") if line]
    if not lines:
        raise UpgradeRefused(400, "an empty request")
    request_line, *lines = lines
    method, _, rest = request_line.partition(" ")
    target, _, version = rest.partition(" ")
    if method != "GET" or version != "HTTP/1.1":
        raise UpgradeRefused(400, f"not a WebSocket upgrade: {request_line!r}")
    if target.split("?", 1)[0] != PATH:
        raise UpgradeRefused(404, f"no WebSocket endpoint at {target!r} (only {PATH})")
    headers = _headers(lines)
    if "websocket" not in _tokens(headers.get("upgrade", "")) or "upgrade" not in _tokens(
            headers.get("connection", "")):
        raise UpgradeRefused(400, "an upgrade to websocket needs 'Upgrade: websocket' and "
                                  "'Connection: Upgrade'")
    if headers.get("sec-websocket-version") != "13":
        raise UpgradeRefused(426, "WebSocket version 13 only",
                             headers=("Sec-WebSocket-Version: 13",))
    key = headers.get("sec-websocket-key", "")
    try:
        nonce = base64.b64decode(key, validate=True)
    except binascii.Error:
        nonce = b""
    if len(nonce) != 16:
        raise UpgradeRefused(400, f"Sec-WebSocket-Key {key!r} is not 16 bytes in base64")
    offered = _tokens(headers.get("sec-websocket-protocol", ""))
    if SUBPROTOCOL.lower() not in offered:
        raise UpgradeRefused(400, f"subprotocol {SUBPROTOCOL} not offered "
                                  f"(Sec-WebSocket-Protocol: {offered or 'none'})")
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(key)}\r\n"
            f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n").encode("ascii")


_REASONS = {400: "Bad Request", 404: "Not Found", 426: "Upgrade Required",
            503: "Service Unavailable"}


def refusal(status: int, reason: str, headers: tuple[str, ...] = ()) -> bytes:
    """An HTTP answer refusing the upgrade with ``status``, ``reason`` as its text body."""
    body = f"{reason}\n".encode()
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", "Connection: close",
             "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
             *headers]
    return "\r\n".join([*lines, "", ""]).encode("utf-8") + body


def encode_frame(opcode: Opcode, payload: bytes = b"", *, final: bool = True,
                 mask: bytes | None = None) -> bytes:
    """One frame: unmasked as a server sends it, or masked with the 4-byte ``mask`` (a client's)."""
    first = (0x80 if final else 0) | int(opcode)
    size = len(payload)
    masked = 0x80 if mask is not None else 0
    if size < 126:
        header = struct.pack("!BB", first, masked | size)
    elif size < 1 << 16:
        header = struct.pack("!BBH", first, masked | 126, size)
    else:
        header = struct.pack("!BBQ", first, masked | 127, size)
    if mask is None:
        return header + payload
    if len(mask) != 4:
        raise ValueError("a frame's mask is 4 bytes")
    return header + mask + _unmask(payload, mask)


def _unmask(payload: bytes, mask: bytes) -> bytes:
    """``payload`` XOR the repeated ``mask`` (its own inverse), a machine word at a time."""
    if not payload:
        return b""
    repeated = (mask * (len(payload) // 4 + 1))[:len(payload)]
    value = int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")
    return value.to_bytes(len(payload), "big")


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload: the code, then the reason in UTF-8 (cut to fit 125 bytes)."""
    return struct.pack("!H", int(code)) + reason.encode("utf-8")[:123]


def parse_close(payload: bytes) -> tuple[int, str]:
    """A close frame's code and reason; :attr:`CloseCode.NO_STATUS` for an empty payload.

    Raises :class:`WebSocketProtocolError` for a 1-byte payload, a code no
    endpoint may send, or a reason that is not UTF-8.
    """
    if not payload:
        return CloseCode.NO_STATUS, ""
    if len(payload) == 1:
        raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR, "a close payload of one byte")
    (code,) = struct.unpack("!H", payload[:2])
    if code < 1000 or code in (1004, 1005, 1006, 1015) or 1016 <= code < 3000 or code >= 5000:
        raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR, f"close code {code} is not sent")
    try:
        return code, payload[2:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR,
                                     "a close reason that is not UTF-8") from exc


class FrameDecoder:
    """The client's frames from its bytes, in any pieces (invariants 2 and 3).

    Not thread-safe: one connection's reader feeds it.
    """

    def __init__(self, max_payload: int = MAX_FRAME_PAYLOAD) -> None:
        self._buffer = bytearray()
        self._max_payload = max_payload
        self._message: Opcode | None = None  # the data opcode of a fragmented message under way

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes, in order; an incomplete one waits for more bytes."""
        self._buffer += data
        frames: list[Frame] = []
        while (frame := self._next()) is not None:
            frames.append(frame)
        return frames

    def _next(self) -> Frame | None:
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        first, second = buffer[0], buffer[1]
        if first & 0x70:
            raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR,
                                         "reserved bits set (no extension was negotiated)")
        if not second & 0x80:
            raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR, "a client frame is masked")
        try:
            opcode = Opcode(first & 0x0F)
        except ValueError as exc:
            raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR,
                                         f"unknown opcode {first & 0x0F:#x}") from exc
        final = bool(first & 0x80)
        size, offset = second & 0x7F, 2
        if opcode.is_control and (size > 125 or not final):
            raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR,
                                         "a control frame is unfragmented and at most 125 bytes")
        if size == 126:
            if len(buffer) < 4:
                return None
            (size,), offset = struct.unpack_from("!H", buffer, 2), 4
        elif size == 127:
            if len(buffer) < 10:
                return None
            (size,), offset = struct.unpack_from("!Q", buffer, 2), 10
            if size >> 63:
                raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR, "a 64-bit length >= 2**63")
        if size > self._max_payload:
            raise WebSocketProtocolError(
                CloseCode.TOO_BIG, f"a frame of {size} bytes (at most {self._max_payload})")
        if len(buffer) < offset + 4 + size:
            return None
        mask = bytes(buffer[offset:offset + 4])
        payload = _unmask(bytes(buffer[offset + 4:offset + 4 + size]), mask)
        del buffer[:offset + 4 + size]
        return Frame(self._message_opcode(opcode, final), payload, final)

    def _message_opcode(self, opcode: Opcode, final: bool) -> Opcode:
        """The opcode to report, keeping track of a fragmented message."""
        if opcode.is_control:
            return opcode
        if opcode is Opcode.CONTINUATION:
            if self._message is None:
                raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR,
                                             "a continuation frame outside a message")
            message = self._message
        else:
            if self._message is not None:
                raise WebSocketProtocolError(CloseCode.PROTOCOL_ERROR,
                                             "a new message before the last one's final frame")
            message = opcode
        self._message = None if final else message
        return message
