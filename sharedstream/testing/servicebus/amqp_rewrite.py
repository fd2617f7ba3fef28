"""Renumbering a client's AMQP deliveries for proton, without I/O: what Service Bus tolerates.

azure-servicebus 7.15 (pyamqp) reads its session's next delivery-id before
a send and raises it after, so the management requests it sends at once
(its ``AutoLockRenewer``, peeks from several threads or tasks on one
receiver) carry the same delivery-id. Service Bus takes them; proton closes
the connection ("sequencing error"), with no lenient mode. The relay in
front of proton (:mod:`.amqp_front`) passes every byte through a
:class:`DeliveryRenumbering`, which gives the client's deliveries proton's
numbering and maps proton's answers back.

Terms: a *client id* is the delivery-id the client wrote on a transfer; a
*relay id* the one proton sees. Per session (a client's ``begin`` channel),
relay ids are sequential from the ``begin``'s ``next-outgoing-id``: a
transfer starts a new delivery, and takes the next relay id, unless its
link handle has a delivery in progress (``more``) whose id it repeats or
omits.

Invariants (each checked in ``tests/servicebus/test_amqp_rewrite.py``):

1. Bytes go out in the order they came, each frame whole; only four things
   change: the ``delivery-id`` of the client's transfers (to the relay id),
   ``first``/``last`` of proton's dispositions with role receiver (settling
   the client's deliveries: mapped back to client ids, one disposition per
   run of deliveries whose relay ids and client ids both follow on), and
   of the client's dispositions with role sender (to relay ids, one per
   run of relay ids), and a frame's size when its performative changed
   (re-encoded with ``uint`` fields as ``0x70``, the list as ``list32``).
   A client that never repeats an id sees every byte unchanged.
2. Transfer-ids (a flow's ``next-incoming-id``/``next-outgoing-id``) are
   not delivery-ids: they count transfer *frames*, which the relay neither
   adds nor drops, so flows pass unchanged and stay right on both sides
   (mapping them through the delivery table would put pyamqp's window
   calculation off by the repeats, since its counter itself is right).
3. Framing is followed exactly: protocol headers (``AMQP`` and a protocol
   id: 3 SASL, 0 AMQP), SASL frames (type 1) and empty frames (heartbeats)
   pass through, as does everything after a first header that is not one
   (proton answers that). Bytes may arrive in pieces of any size.
4. Bounded: a performative the relay reads (``begin``, ``transfer``,
   ``disposition``, ``detach``, ``end``) is held whole, up to
   :data:`MAX_PERFORMATIVE` bytes; a transfer's payload and every other
   frame stream through without being held. The delivery table holds the
   unsettled deliveries the client sent, dropped when either side settles
   them, when their link detaches or their session ends. A frame the
   framing rules refuse raises :class:`AmqpFramingError`; the renumbering
   is then unusable (the relay ends the connection).

A disposition for a relay id the table does not hold (already settled, or
sent settled) passes unchanged: the client forgot that delivery too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["MAX_PERFORMATIVE", "AmqpFramingError", "DeliveryRenumbering"]

MAX_PERFORMATIVE = 1024 * 1024
"""The largest performative held to be read (those of module docstring invariant 4)."""

_HEADER = b"AMQP"
_SASL_PROTOCOL, _AMQP_PROTOCOL = 3, 0
_AMQP_FRAME = 0
_BEGIN, _TRANSFER, _DISPOSITION, _DETACH, _END = 0x11, 0x14, 0x15, 0x16, 0x17
_READ = frozenset({_BEGIN, _TRANSFER, _DISPOSITION, _DETACH, _END})
_MASK = 0xFFFFFFFF
# The bytes after a constructor, by its high nibble (AMQP 1.0 section 1.6): fixed widths...
_FIXED = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
# ... or a size of this many bytes, then that many (variable, compound and array types).
_SIZED = {0xA: 1, 0xC: 1, 0xE: 1, 0xB: 4, 0xD: 4, 0xF: 4}


class AmqpFramingError(ValueError):
    """Bytes that are not AMQP framing: a frame size or offset out of range, a bad encoding."""


# -- the encoding: just enough to read and rewrite a performative's fields -----------------


def _skip(data: bytes, at: int, end: int) -> int:
    """Where the encoded value at ``at`` ends (``AmqpFramingError`` past ``end``)."""
    if at >= end:
        raise AmqpFramingError("a value runs past its performative")
    constructor = data[at]
    if constructor == 0x00:  # described: a descriptor, then the value
        return _skip(data, _skip(data, at + 1, end), end)
    kind = constructor >> 4
    if kind in _FIXED:
        after = at + 1 + _FIXED[kind]
    elif kind in _SIZED:
        width = _SIZED[kind]
        if at + 1 + width > end:
            raise AmqpFramingError("a value's size runs past its performative")
        after = at + 1 + width + int.from_bytes(data[at + 1:at + 1 + width], "big")
    else:
        raise AmqpFramingError(f"no AMQP type has constructor 0x{constructor:02x}")
    if after > end:
        raise AmqpFramingError("a value runs past its performative")
    return after


def _uint(field_bytes: bytes) -> int | None:
    """A ``uint`` field's value (``None`` when null or absent; ``AmqpFramingError`` if no uint)."""
    if not field_bytes or field_bytes[0] == 0x40:
        return None
    constructor = field_bytes[0]
    if constructor == 0x43:
        return 0
    if constructor == 0x52 and len(field_bytes) == 2:
        return field_bytes[1]
    if constructor == 0x70 and len(field_bytes) == 5:
        value: int = struct.unpack(">I", field_bytes[1:])[0]
        return value
    raise AmqpFramingError(f"a uint field encoded as 0x{constructor:02x}")


def _flag(field_bytes: bytes) -> bool:
    """A ``boolean`` field's value (``False`` when null or absent)."""
    if not field_bytes:
        return False
    if field_bytes[0] == 0x56 and len(field_bytes) == 2:
        return field_bytes[1] != 0
    return field_bytes[0] == 0x41


def _encode_uint(value: int) -> bytes:
    return b"\x70" + struct.pack(">I", value & _MASK)


@dataclass
class _Performative:
    """A performative split into its descriptor's bytes and each list field's bytes."""

    code: int
    descriptor: bytes
    fields: list[bytes]

    @classmethod
    def parse(cls, data: bytes, code: int, descriptor_end: int) -> _Performative:
        """``data``: exactly the performative (described list) whose descriptor ends there."""
        end, at = len(data), descriptor_end
        constructor = data[at]
        if constructor == 0x45:
            return cls(code, data[:at], [])
        if constructor == 0xC0:
            count, at = data[at + 2], at + 3
        else:  # 0xd0, as _extent checked
            count, at = struct.unpack(">I", data[at + 5:at + 9])[0], at + 9
        fields = []
        for _ in range(count):
            after = _skip(data, at, end)
            fields.append(data[at:after])
            at = after
        if at != end:
            raise AmqpFramingError("a performative's list holds more than its count")
        return cls(code, data[:descriptor_end], fields)

    def get(self, index: int) -> bytes:
        """Field ``index``'s bytes (empty when the list stops before it)."""
        return self.fields[index] if index < len(self.fields) else b""

    def with_uints(self, values: dict[int, int]) -> bytes:
        """The performative encoded again with these fields set to these ``uint`` values."""
        fields = list(self.fields)
        fields += [b"\x40"] * (max(values) + 1 - len(fields))
        for index, value in values.items():
            fields[index] = _encode_uint(value)
        body = b"".join(fields)
        return self.descriptor + b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body


class _Incomplete(Exception):
    """More bytes are needed to tell."""


_NOT_READ = (None, 0, 0)
_DESCRIPTOR_WIDTHS = {0x53: 1, 0x80: 8, 0x44: 0}  # smallulong, ulong, ulong0
_LIST_SIZE_WIDTHS = {0xC0: 1, 0xD0: 4}  # list8, list32


def _extent(data: bytes | bytearray, at: int, end: int) -> tuple[int | None, int, int]:
    """The performative at ``at`` of a frame ending at ``end``: code, descriptor end, length.

    Raises :class:`_Incomplete` when more bytes are needed to tell. The
    code is ``None`` for a performative the relay does not read (a symbolic
    descriptor, a body that is not a described list: proton judges those).
    """

    def number(offset: int, width: int) -> int:
        if at + offset + width > end:
            raise AmqpFramingError("a performative runs past its frame")
        if at + offset + width > len(data):
            raise _Incomplete
        return int.from_bytes(data[at + offset:at + offset + width], "big")

    if number(0, 1) != 0x00:
        return _NOT_READ
    width = _DESCRIPTOR_WIDTHS.get(number(1, 1))
    if width is None:
        return _NOT_READ
    code = number(2, width) if width else 0
    list_offset = 2 + width
    constructor = number(list_offset, 1)
    if constructor == 0x45:  # list0
        return (code, at + list_offset, list_offset + 1)
    size_width = _LIST_SIZE_WIDTHS.get(constructor)
    if size_width is None:
        return _NOT_READ
    size = number(list_offset + 1, size_width)
    if size < size_width:
        raise AmqpFramingError("a performative's list is shorter than its count")
    return (code, at + list_offset, list_offset + 1 + size_width + size)


# -- the delivery table --------------------------------------------------------------------


@dataclass
class _Session:
    """One session's numbering, from the client's ``begin``."""

    next_relay_id: int
    client_ids: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Relay id -> (client id, client handle), for each unsettled delivery the client sent."""
    in_progress: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Client handle -> (client id, relay id) of its delivery with ``more`` frames to come."""
    client_ended: bool = False
    server_ended: bool = False

    def transfer(self, handle: int, client_id: int | None, *, more: bool,
                 settled: bool) -> int | None:
        """The relay id of this transfer frame (``None``: no id, and none to give it)."""
        ongoing = self.in_progress.pop(handle, None)
        if ongoing is not None and client_id in (None, ongoing[0]):
            relay_id = ongoing[1]
            client_id = ongoing[0]
        elif client_id is None:
            return None  # a first frame without an id: proton refuses it as sent
        else:
            relay_id, self.next_relay_id = self.next_relay_id, (self.next_relay_id + 1) & _MASK
            self.client_ids[relay_id] = (client_id, handle)
        if settled:
            self.client_ids.pop(relay_id, None)
        if more:
            self.in_progress[handle] = (client_id, relay_id)
        return relay_id

    def detached(self, handle: int) -> None:
        """The client detached ``handle``: nothing more will settle its deliveries."""
        self.in_progress.pop(handle, None)
        self.client_ids = {relay: entry for relay, entry in self.client_ids.items()
                           if entry[1] != handle}

    def to_client(self, first: int, last: int, *, settled: bool) -> list[tuple[int, int]] | None:
        """Client id ranges for a relay id range (``None``: none of them is in the table)."""
        runs: list[tuple[int, int]] = []
        previous: tuple[int, int] | None = None
        for relay_id in _held(self.client_ids, first, last):
            client_id = self.client_ids[relay_id][0]
            if previous is not None and relay_id == (previous[0] + 1) & _MASK \
                    and client_id == (previous[1] + 1) & _MASK:
                runs[-1] = (runs[-1][0], client_id)
            else:
                runs.append((client_id, client_id))
            previous = (relay_id, client_id)
            if settled:
                del self.client_ids[relay_id]
        return runs or None

    def to_relay(self, first: int, last: int, *, settled: bool) -> list[tuple[int, int]] | None:
        """Relay id ranges for a client id range (``None``: none of them is in the table)."""
        relay_ids = [relay_id for relay_id, (client_id, _) in self.client_ids.items()
                     if _within(client_id, first, last)]
        runs: list[tuple[int, int]] = []
        for relay_id in relay_ids:  # the table is in relay id order
            if runs and relay_id == (runs[-1][1] + 1) & _MASK:
                runs[-1] = (runs[-1][0], relay_id)
            else:
                runs.append((relay_id, relay_id))
            if settled:
                del self.client_ids[relay_id]
        return runs or None


def _within(value: int, first: int, last: int) -> bool:
    """Whether ``value`` is in ``first..last``, in serial number arithmetic (RFC 1982)."""
    return (value - first) & _MASK <= (last - first) & _MASK


def _held(table: dict[int, tuple[int, int]], first: int, last: int) -> list[int]:
    """The relay ids of ``table`` in ``first..last``, in order, without walking a huge range."""
    span = ((last - first) & _MASK) + 1
    if span <= len(table):
        candidates: Iterator[int] = ((first + step) & _MASK for step in range(span))
        return [relay_id for relay_id in candidates if relay_id in table]
    return [relay_id for relay_id in table if _within(relay_id, first, last)]


# -- the two byte streams ------------------------------------------------------------------


_Rewrite = Callable[[int, _Performative], list[bytes] | None]
"""Called with a read performative and its frame's channel: its replacements (``None``: keep)."""


class _Stream:
    """One direction's bytes: framing followed, performatives read, payloads streamed."""

    def __init__(self, rewrite: _Rewrite) -> None:
        self._rewrite = rewrite
        self._buffer = bytearray()
        self._passing = 0  # bytes of the current frame still to pass on as they come
        self._started = False  # the first protocol header was read
        self._sasl = False
        self._opaque = False  # not AMQP: everything passes

    def feed(self, data: bytes) -> bytes:
        """The bytes to send on for ``data`` (maybe fewer, held until a frame is whole)."""
        if self._opaque:
            return data
        self._buffer += data
        out = bytearray()
        while self._step(out):
            pass
        return bytes(out)

    def _step(self, out: bytearray) -> bool:
        """Move what the buffer allows to ``out``; whether to go on."""
        buffer = self._buffer
        if self._passing:
            count = min(self._passing, len(buffer))
            out += buffer[:count]
            del buffer[:count]
            self._passing -= count
            return bool(buffer)
        if not self._started or (self._sasl and buffer[:4] == _HEADER[:len(buffer[:4])]):
            return self._protocol_header(out)
        if len(buffer) < 8:
            return False
        try:
            return self._frame(out)
        except _Incomplete:
            return False

    def _frame(self, out: bytearray) -> bool:
        """A frame starts the buffer: pass it, or read its performative and rewrite it."""
        buffer = self._buffer
        size, offset, kind, channel = struct.unpack(">IBBH", buffer[:8])
        body_at = offset * 4
        if offset < 2 or size < body_at:
            raise AmqpFramingError(f"a frame of {size} bytes with data offset {offset}")
        code, descriptor_end, length = (
            _NOT_READ if kind != _AMQP_FRAME or self._sasl or size == body_at  # SASL, heartbeat
            else _extent(buffer, body_at, size))
        if code not in _READ:
            self._passing = size
            return True
        if length > MAX_PERFORMATIVE or body_at + length > size:
            raise AmqpFramingError(f"a performative of {length} bytes in a {size}-byte frame")
        if len(buffer) < body_at + length:
            return False
        performative = bytes(buffer[body_at:body_at + length])
        payload = size - body_at - length
        replacements = self._rewrite(channel, _Performative.parse(
            performative, code, descriptor_end - body_at))
        if replacements is None:
            self._passing = size
            return True
        if payload and len(replacements) != 1:
            raise AssertionError("only a frame without payload is split")
        head = bytes(buffer[4:body_at])  # offset, type, channel, extended header
        for replacement in replacements:
            out += struct.pack(">I", body_at + len(replacement) + payload) + head + replacement
        del buffer[:body_at + length]
        self._passing = payload
        return bool(buffer)

    def _protocol_header(self, out: bytearray) -> bool:
        buffer = self._buffer
        if len(buffer) < 8:
            return False
        header = bytes(buffer[:8])
        del buffer[:8]
        out += header
        self._started = True
        if header[:4] != _HEADER or header[4] not in (_SASL_PROTOCOL, _AMQP_PROTOCOL):
            self._opaque = True  # not a header this relay follows: proton answers it
            out += buffer
            buffer.clear()
            return False
        self._sasl = header[4] == _SASL_PROTOCOL
        return bool(buffer)


class DeliveryRenumbering:
    """One connection's renumbering (the module docstring): feed each side's bytes in order.

    :meth:`from_client` and :meth:`from_server` take the bytes read from
    that side, in any pieces, and return the bytes to write to the other
    (possibly fewer: a performative the renumbering reads is held until
    whole). Not thread-safe: one relay task per direction on one loop.
    Either raises :class:`AmqpFramingError` on bytes that break the framing
    rules; the object is then unusable.
    """

    def __init__(self) -> None:
        self._sessions: dict[int, _Session] = {}  # by the client's channel
        self._client_channel: dict[int, int] = {}  # the server's channel -> the client's
        self._from_client = _Stream(self._client_performative)
        self._from_server = _Stream(self._server_performative)

    def from_client(self, data: bytes) -> bytes:
        """The bytes for the server, for ``data`` read from the client."""
        return self._from_client.feed(data)

    def from_server(self, data: bytes) -> bytes:
        """The bytes for the client, for ``data`` read from the server."""
        return self._from_server.feed(data)

    @property
    def unsettled(self) -> int:
        """How many of the client's deliveries the table holds (for tests of its bound)."""
        return sum(len(session.client_ids) for session in self._sessions.values())

    def _client_performative(self, channel: int, performative: _Performative) -> list[bytes] | None:
        code = performative.code
        if code == _BEGIN:
            next_id = _uint(performative.get(1))
            self._sessions[channel] = _Session(0 if next_id is None else next_id)
            server_channel = _ushort(performative.get(0))
            if server_channel is not None:  # answering the server's begin
                self._client_channel[server_channel] = channel
            return None
        session = self._sessions.get(channel)
        if session is None:
            return None  # no begin on that channel: proton refuses the frame as sent
        if code == _TRANSFER:
            client_id = _uint(performative.get(1))
            relay_id = session.transfer(
                _uint(performative.get(0)) or 0, client_id,
                more=_flag(performative.get(5)) and not _flag(performative.get(9)),
                settled=_flag(performative.get(4)) or _flag(performative.get(9)))
            if client_id is None or relay_id is None or relay_id == client_id:
                return None
            return [performative.with_uints({1: relay_id})]
        if code == _DISPOSITION and not _flag(performative.get(0)):  # role sender
            return _renumbered(performative, session.to_relay)
        if code == _DETACH:
            session.detached(_uint(performative.get(0)) or 0)
        elif code == _END:
            session.client_ended = True
            self._forget_if_ended(channel, session)
        return None

    def _server_performative(self, channel: int, performative: _Performative) -> list[bytes] | None:
        code = performative.code
        if code == _BEGIN:
            client_channel = _ushort(performative.get(0))
            if client_channel is not None:  # answering the client's begin
                self._client_channel[channel] = client_channel
            return None
        client_channel = self._client_channel.get(channel)
        session = None if client_channel is None else self._sessions.get(client_channel)
        if session is None or client_channel is None:
            return None
        if code == _DISPOSITION and _flag(performative.get(0)):  # role receiver
            return _renumbered(performative, session.to_client)
        if code == _END:
            del self._client_channel[channel]
            session.server_ended = True
            self._forget_if_ended(client_channel, session)
        return None

    def _forget_if_ended(self, channel: int, session: _Session) -> None:
        if session.client_ended and session.server_ended and self._sessions.get(channel) is session:
            del self._sessions[channel]


def _ushort(field_bytes: bytes) -> int | None:
    if len(field_bytes) == 3 and field_bytes[0] == 0x60:
        value: int = struct.unpack(">H", field_bytes[1:])[0]
        return value
    return None


def _renumbered(performative: _Performative,
                mapping: Callable[..., list[tuple[int, int]] | None]) -> list[bytes] | None:
    """A disposition with its range mapped, split where the mapped ids do not follow on."""
    first = _uint(performative.get(1))
    if first is None:
        return None  # a disposition without first: proton refuses it as sent
    last = _uint(performative.get(2))
    last = first if last is None else last
    runs = mapping(first, last, settled=_flag(performative.get(3)))
    if runs is None or runs == [(first, last)]:
        return None
    return [performative.with_uints({1: start, 2: end}) for start, end in runs]
