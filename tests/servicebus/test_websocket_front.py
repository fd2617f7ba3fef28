"""The WebSocket front of the Service Bus test server, over real sockets, in front of an echo.

:class:`~sharedstream.testing.servicebus.websocket_front.WebSocketFront`
relays frames to a TCP port and back; here the port is an echo server of the
test's own (no AMQP, no proton), so what comes back is exactly what the
front passed on. The client's frames are written out by hand, masked.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from sharedstream.testing.brokers.process import free_port
from sharedstream.testing.servicebus.websocket import PATH, SUBPROTOCOL
from sharedstream.testing.servicebus.websocket_front import WebSocketFront

MASK = b"\x0b\xad\xf0\x0d"
UPGRADE = (f"GET {PATH} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n")


def masked(first: int, payload: bytes) -> bytes:
    """A client frame: ``first`` byte (FIN, opcode), then the masked length and payload."""
    size = len(payload)
    length = (bytes([0x80 | size]) if size < 126 else struct.pack("!BH", 0xFE, size)
              if size < 1 << 16 else struct.pack("!BQ", 0xFF, size))
    return bytes([first]) + length + MASK + bytes(
        byte ^ MASK[index % 4] for index, byte in enumerate(payload))


@dataclass
class Echo:
    """The AMQP port's stand-in: echoes what it gets; ``b"bye"`` makes it hang up."""

    port: int = 0
    received: bytearray = field(default_factory=bytearray)
    connections: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while data := await reader.read(65536):
            self.received += data
            if data == b"bye":
                break
            writer.write(data)
            await writer.drain()
        writer.close()
        self.ended.set()


@dataclass
class Client:
    """A WebSocket client written out by hand, reading the front's frames."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def upgrade(self, head: str = UPGRADE) -> str:
        self.writer.write(head.encode("ascii"))
        answer = await self.reader.readuntil(b"\r\n\r\n")
        return answer.decode("ascii")

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    async def frame(self) -> tuple[int, bytes]:
        """The next frame's first byte and payload; a server's frames are never masked."""
        first, second = await self.reader.readexactly(2)
        assert not second & 0x80, "a server's frame is masked"
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return first, await self.reader.readexactly(size)

    async def binary(self, size: int) -> bytes:
        """``size`` bytes from binary frames (the front cuts a stream where it reads it)."""
        data = b""
        while len(data) < size:
            first, payload = await asyncio.wait_for(self.frame(), 10)
            assert first == 0x82, f"not a final binary frame: {first:#x}"
            data += payload
        return data

    async def ended(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 10) == b""


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    stand_in = Echo()
    server = await asyncio.start_server(stand_in.serve, "127.0.0.1", 0)
    stand_in.port = server.sockets[0].getsockname()[1]
    async with server:
        yield stand_in


@pytest.fixture
async def front(echo: Echo) -> AsyncIterator[WebSocketFront]:
    relay = WebSocketFront(socket.create_server(("127.0.0.1", 0)), "127.0.0.1", echo.port)
    relay.start()
    try:
        yield relay
    finally:
        await asyncio.to_thread(relay.stop)


@pytest.fixture
async def client(front: WebSocketFront) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
    try:
        yield Client(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.timeout(30)
async def test_fragments_reach_the_port_as_bytes_and_its_answer_comes_back_as_binary_frames(
        echo: Echo, client: Client) -> None:
    assert (await client.upgrade()).startswith("HTTP/1.1 101 Switching Protocols\r\n")
    # "AMQP" in three fragments, a ping between two of them
    client.send(masked(0x02, b"AM"), masked(0x00, b"Q"), masked(0x89, b"are you there"),
                masked(0x80, b"P\x00\x01\x00\x00"))
    assert await client.frame() == (0x8A, b"are you there")  # the pong, as soon as read
    assert await client.binary(8) == b"AMQP\x00\x01\x00\x00"
    large = bytes(range(256)) * 1200  # 300 KB in one frame, back in the front's chunks
    client.send(masked(0x82, large))
    assert await client.binary(len(large)) == large
    assert bytes(echo.received) == b"AMQP\x00\x01\x00\x00" + large


@pytest.mark.timeout(30)
async def test_a_close_is_answered_with_its_code_and_ends_both_connections(
        echo: Echo, client: Client) -> None:
    await client.upgrade()
    client.send(masked(0x82, b"AMQP"))
    assert await client.binary(4) == b"AMQP"
    client.send(masked(0x88, struct.pack("!H", 4000) + b"done"))
    assert await client.frame() == (0x88, struct.pack("!H", 4000))
    assert await client.ended()
    await asyncio.wait_for(echo.ended.wait(), 10)


@pytest.mark.timeout(30)
async def test_when_the_port_hangs_up_the_client_gets_close_1000_and_its_answer_ends_it(
        client: Client) -> None:
    await client.upgrade()
    client.send(masked(0x82, b"bye"))
    first, payload = await asyncio.wait_for(client.frame(), 10)
    assert (first, payload[:2]) == (0x88, struct.pack("!H", 1000))
    client.send(masked(0x88, payload[:2]))
    assert await client.ended()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("frame", "code"), [
    (masked(0x81, b"text"), 1003), (b"\x82\x04AMQP", 1002), (masked(0x80, b"x"), 1002)],
    ids=["text", "unmasked", "stray-continuation"])
async def test_a_frame_the_front_cannot_take_is_closed_with_its_code(
        echo: Echo, client: Client, frame: bytes, code: int) -> None:
    await client.upgrade()
    client.send(frame)
    first, payload = await asyncio.wait_for(client.frame(), 10)
    assert (first, payload[:2]) == (0x88, struct.pack("!H", code))
    assert await client.ended()
    assert echo.received == b""


@pytest.mark.timeout(30)
async def test_a_request_for_another_path_is_refused_before_the_port_is_dialled(
        echo: Echo, client: Client) -> None:
    answer = await client.upgrade(UPGRADE.replace(PATH, "/"))
    assert answer.startswith("HTTP/1.1 404 Not Found\r\n")
    assert await client.reader.read() == f"no WebSocket endpoint at '/' (only {PATH})\n".encode()
    assert echo.connections == 0


@pytest.mark.timeout(30)
async def test_an_amqp_port_that_does_not_answer_is_a_503_not_an_upgrade() -> None:
    relay = WebSocketFront(socket.create_server(("127.0.0.1", 0)), "127.0.0.1", free_port())
    relay.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        try:
            answer = await Client(reader, writer).upgrade()
            assert answer.startswith("HTTP/1.1 503 Service Unavailable\r\n")
        finally:
            writer.close()
            await writer.wait_closed()
    finally:
        await asyncio.to_thread(relay.stop)


@pytest.mark.timeout(30)
async def test_stop_ends_an_open_connection_at_once(echo: Echo) -> None:
    relay = WebSocketFront(socket.create_server(("127.0.0.1", 0)), "127.0.0.1", echo.port)
    relay.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    try:
        client = Client(reader, writer)
        await client.upgrade()
        client.send(masked(0x82, b"AMQP"))
        assert await client.binary(4) == b"AMQP"
        started = time.monotonic()
        await asyncio.to_thread(relay.stop)
        assert time.monotonic() - started < 2
        assert await client.ended()
        await asyncio.wait_for(echo.ended.wait(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
