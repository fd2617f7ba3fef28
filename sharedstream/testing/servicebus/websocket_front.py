"""AMQP over WebSockets for the Service Bus test server: a relay in front of its AMQP port.

:class:`WebSocketFront` listens on a port of its own (Service Bus's is 443),
completes the WebSocket upgrade (:func:`.websocket.parse_upgrade`), opens a
connection to the server's AMQP port as any client would (that port is
the AMQP front, :mod:`.amqp_front`, so these clients' deliveries are
renumbered as theirs are), and relays: the payload of every binary frame
the client sends goes to the AMQP port, and every chunk the AMQP port
sends back goes to the client as one binary frame. Everything AMQP (SASL,
CBS, links, limits, the log) stays the server's own, unchanged; this front
knows nothing of AMQP. It is a :class:`~.front.RelayFront`: an asyncio
loop on a thread of its own, beside the proton container's.

Invariants:

1. The front serves ``wss`` exactly when the AMQP port serves ``amqps``,
   with the same certificate (a client trusts the same ``ca.pem``), and
   then reaches the AMQP port over TLS too, trusting that CA; else ``ws``
   and plain AMQP.
2. The AMQP connection is opened before the ``101`` answer: an AMQP port
   that does not answer is a ``503``, never a WebSocket that closes at once.
   A refused upgrade is answered with its HTTP status and one log line.
3. A ping is answered with a pong of the same payload. A close from the
   client is answered with a close of its code (1000 when it gave none) and
   ends both connections; when the AMQP side ends first, the front sends
   close 1000 and waits up to :data:`.front.CLOSE_TIMEOUT` for the client's. A
   protocol error is closed with its code (1002; 1003 for a text message,
   AMQP being binary; 1009 for an oversized frame), then both end. No data
   frame follows a close the front sent.
4. Bounded: the request head (:data:`.websocket.MAX_HEAD`), the upgrade
   and the AMQP connect (:data:`.front.HANDSHAKE_TIMEOUT` each, TLS included), a
   frame (:data:`.websocket.MAX_FRAME_PAYLOAD`); each write waits for its
   peer to drain, so a slow side slows the other instead of filling memory.
5. :meth:`WebSocketFront.stop` ends every connection and the thread.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.testing.servicebus import websocket
from sharedstream.testing.servicebus.front import (
    CHUNK,
    CLOSE_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    RelayFront,
    Upstream,
    dial_host,
    end,
    served_tls,
)
from sharedstream.testing.servicebus.websocket import CloseCode, Frame, Opcode
from sharedstream.testing.tls import ServerCertificates

__all__ = ["WebSocketFront"]

_log = key_value_logger(__name__)


class WebSocketFront(RelayFront):
    """The relay of the module docstring, serving an already listening socket.

    ``listening``: bound and listening (the server binds it before its AMQP
    port, so a client that reaches the AMQP port finds this one too); the
    front closes it when it stops. ``amqp_host``/``amqp_port``: the
    server's AMQP port. ``certificates``: the AMQP port's, when it serves
    TLS (invariant 1). :meth:`start` and :meth:`stop`
    (:class:`~.front.RelayFront`'s) are called from any one thread; all
    else runs on the front's own.
    """

    def __init__(self, listening: socket.socket, amqp_host: str, amqp_port: int,
                 certificates: ServerCertificates | None = None) -> None:
        super().__init__(listening, served_tls(certificates), name="servicebus-websocket-front",
                         limit=websocket.MAX_HEAD)
        upstream_tls = None
        if certificates is not None:
            upstream_tls = ssl.create_default_context(cafile=certificates.ca_file)
        self._upstream = Upstream(dial_host(amqp_host), amqp_port, upstream_tls)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the upgrade, then relay until either side ends (module docstring)."""
        peer = writer.get_extra_info("peername")
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANDSHAKE_TIMEOUT)
            answer = websocket.parse_upgrade(head)
        except (asyncio.IncompleteReadError, TimeoutError, OSError):
            return  # gone, silent or broken before asking anything: nothing to answer
        except asyncio.LimitOverrunError:
            await _refuse(writer, peer, websocket.UpgradeRefused(
                400, f"a request head over {websocket.MAX_HEAD} bytes"))
            return
        except websocket.UpgradeRefused as refused:
            await _refuse(writer, peer, refused)
            return
        try:
            amqp_reader, amqp_writer = await self._upstream.connect()
        except (OSError, TimeoutError) as exc:
            await _refuse(writer, peer, websocket.UpgradeRefused(
                503, f"the AMQP port {self._upstream.port} does not answer: {exc!r}"))
            return
        try:
            writer.write(answer)
            await _Relay(reader, writer, amqp_reader, amqp_writer).run()
        finally:
            await end(amqp_writer)


async def _refuse(writer: asyncio.StreamWriter, peer: object,
                  refused: websocket.UpgradeRefused) -> None:
    _log.warning("WebSocket upgrade refused", peer=peer, reason=str(refused))
    writer.write(websocket.refusal(refused.status, refused.reason, refused.headers))
    try:
        await writer.drain()
    except OSError:
        _log.debug("the refused client left before the answer", peer=peer)


class _Relay:
    """One upgraded connection: the client's frames to AMQP, AMQP's bytes to the client."""

    def __init__(self, client_reader: asyncio.StreamReader,
                 client_writer: asyncio.StreamWriter, amqp_reader: asyncio.StreamReader,
                 amqp_writer: asyncio.StreamWriter) -> None:
        self._client_reader, self._client_writer = client_reader, client_writer
        self._amqp_reader, self._amqp_writer = amqp_reader, amqp_writer
        self._close_sent = False

    async def run(self) -> None:
        """Relay until the client's side ends (its close, its disconnect, a protocol error).

        The AMQP side ending sends the client a close (invariant 3) and ends
        the relay when the client answers it or :data:`CLOSE_TIMEOUT` passes.
        """
        async with asyncio.TaskGroup() as tasks:
            to_client = tasks.create_task(self._to_client(), name="websocket-to-client")
            try:
                await self._from_client()
            finally:
                to_client.cancel()

    async def _from_client(self) -> None:
        decoder = websocket.FrameDecoder()
        try:
            while data := await self._client_reader.read(CHUNK):
                try:
                    for frame in decoder.feed(data):
                        if not await self._on_frame(frame):
                            return
                except websocket.WebSocketProtocolError as error:
                    _log.warning("closing a WebSocket", error=str(error))
                    await self._send_close(error.code, error.reason)
                    return
        except OSError:  # the client's connection broke: the AMQP connection drops with it
            _log.debug("a WebSocket client's connection broke", exc_info=True)

    async def _on_frame(self, frame: Frame) -> bool:
        """Act on one frame of the client's; whether the relay goes on."""
        if frame.opcode is Opcode.BINARY:
            self._amqp_writer.write(frame.payload)
            await self._amqp_writer.drain()
        elif frame.opcode is Opcode.TEXT:
            await self._send_close(CloseCode.UNSUPPORTED_DATA, "AMQP over WebSocket is binary")
            return False
        elif frame.opcode is Opcode.PING:
            await self._send(Opcode.PONG, frame.payload)
        elif frame.opcode is Opcode.CLOSE:
            code, _ = websocket.parse_close(frame.payload)
            await self._send_close(CloseCode.NORMAL if code == CloseCode.NO_STATUS else code)
            return False
        return True  # a pong: nothing to do

    async def _to_client(self) -> None:
        try:
            while data := await self._amqp_reader.read(CHUNK):
                await self._send(Opcode.BINARY, data)
            await self._send_close(CloseCode.NORMAL, "the AMQP connection ended")
            await asyncio.sleep(CLOSE_TIMEOUT)  # the client's close ends the relay before this
            _log.info("a WebSocket client did not answer the close", timeout_s=CLOSE_TIMEOUT)
        except OSError:  # either connection broke: ending the client's ends the relay
            _log.debug("a WebSocket relay's connection broke", exc_info=True)
        self._client_writer.close()  # _from_client then reads the end

    async def _send(self, opcode: Opcode, payload: bytes) -> None:
        if self._close_sent:
            return  # nothing follows a close (invariant 3)
        self._client_writer.write(websocket.encode_frame(opcode, payload))
        await self._client_writer.drain()

    async def _send_close(self, code: int, reason: str = "") -> None:
        if self._close_sent:
            return
        self._client_writer.write(websocket.encode_frame(
            Opcode.CLOSE, websocket.close_payload(code, reason)))
        self._close_sent = True  # before the drain: the other direction sends nothing more
        await self._client_writer.drain()
