"""AMQP over WebSockets for the Service Bus test server: a relay in front of its AMQP port.

:class:`WebSocketFront` listens on a port of its own (Service Bus's is 443),
completes the WebSocket upgrade (:func:`.websocket.parse_upgrade`), opens a
connection to the server's AMQP port as any client would, and relays: the
payload of every binary frame the client sends goes to the AMQP port, and
every chunk the AMQP port sends back goes to the client as one binary
frame. Everything AMQP (SASL, CBS, links, limits, the log) stays the
server's own, unchanged; the front knows nothing of AMQP. It runs an
asyncio loop on a thread of its own, beside the proton container's.

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
   close 1000 and waits up to :data:`CLOSE_TIMEOUT` for the client's. A
   protocol error is closed with its code (1002; 1003 for a text message,
   AMQP being binary; 1009 for an oversized frame), then both end. No data
   frame follows a close the front sent.
4. Bounded: the request head (:data:`.websocket.MAX_HEAD`), the upgrade
   and the AMQP connect (:data:`HANDSHAKE_TIMEOUT` each, TLS included), a
   frame (:data:`.websocket.MAX_FRAME_PAYLOAD`); each write waits for its
   peer to drain, so a slow side slows the other instead of filling memory.
5. :meth:`WebSocketFront.stop` ends every connection and the thread.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from dataclasses import dataclass

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.testing.servicebus import websocket
from sharedstream.testing.servicebus.websocket import CloseCode, Frame, Opcode
from sharedstream.testing.tls import ServerCertificates

__all__ = ["CLOSE_TIMEOUT", "HANDSHAKE_TIMEOUT", "Upstream", "WebSocketFront"]

HANDSHAKE_TIMEOUT = 10.0
"""Seconds for a client's TLS handshake and upgrade request, and for the AMQP connect."""
CLOSE_TIMEOUT = 5.0
"""Seconds to wait for the client's close after the front's, or for a connection to end."""
CHUNK = 64 * 1024
"""The most read from either side at once (so the largest binary frame sent)."""

_log = key_value_logger(__name__)


@dataclass(frozen=True)
class Upstream:
    """Where the AMQP port is, and the TLS to reach it with (``None``: plain)."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the AMQP port (``OSError`` or ``TimeoutError`` when it fails)."""
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.tls, limit=CHUNK),
            HANDSHAKE_TIMEOUT)


def _dial_host(host: str) -> str:
    """The address to reach a port bound on ``host`` (a wildcard one through loopback)."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104


class WebSocketFront:
    """The relay of the module docstring, serving an already listening socket.

    ``listening``: bound and listening (the server binds it before its AMQP
    port, so a client that reaches the AMQP port finds this one too); the
    front closes it when it stops. ``amqp_host``/``amqp_port``: the
    server's AMQP port. ``certificates``: the AMQP port's, when it serves
    TLS (invariant 1). :meth:`start` and :meth:`stop` are called from any
    one thread; all else runs on the front's own.
    """

    def __init__(self, listening: socket.socket, amqp_host: str, amqp_port: int,
                 certificates: ServerCertificates | None = None) -> None:
        self._listening = listening
        self._served_tls: ssl.SSLContext | None = None
        upstream_tls = None
        if certificates is not None:
            self._served_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._served_tls.load_cert_chain(certificates.cert_file, certificates.key_file)
            upstream_tls = ssl.create_default_context(cafile=certificates.ca_file)
        self._upstream = Upstream(_dial_host(amqp_host), amqp_port, upstream_tls)
        self._thread = threading.Thread(target=self._run, name="servicebus-websocket-front",
                                        daemon=True)
        self._ready = threading.Event()
        self._failure: Exception | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The port the front listens on."""
        port: int = self._listening.getsockname()[1]
        return port

    def start(self, timeout: float = 10.0) -> None:
        """Serve on the front's thread; return once it accepts connections.

        Raises what stopped it from serving (``RuntimeError`` if it did not
        serve within ``timeout`` seconds).
        """
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the WebSocket front did not start within {timeout} s")
        if self._failure is not None:
            raise self._failure

    def stop(self, timeout: float = 10.0) -> None:
        """End every connection and the thread (invariant 5); idempotent."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop closed in between: the thread is ending anyway
                _log.debug("the WebSocket front's loop had closed")
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._listening.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:  # noqa: BLE001 - handed to start()'s caller, or logged
            if self._ready.is_set():
                _log.exception("the WebSocket front failed")
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(
            self._accepted, sock=self._listening, ssl=self._served_tls,
            ssl_handshake_timeout=None if self._served_tls is None else HANDSHAKE_TIMEOUT,
            limit=websocket.MAX_HEAD)
        try:
            self._ready.set()
            await self._stopping.wait()
        finally:
            server.close()  # no new connection; then end the open ones (invariant 5)
            for task in self._connections:
                task.cancel()
            if self._connections:
                await asyncio.wait(self._connections, timeout=CLOSE_TIMEOUT)
            await server.wait_closed()  # from Python 3.12 on, it waits for the connections

    async def _accepted(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()  # never None: asyncio runs this callback as a task
        owned = {task} if task is not None else set()
        self._connections |= owned  # so that stop() can end it
        try:
            await self._upgrade_and_relay(reader, writer)
        finally:
            self._connections -= owned
            await _end(writer)

    async def _upgrade_and_relay(self, reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
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
            await _end(amqp_writer)


async def _refuse(writer: asyncio.StreamWriter, peer: object,
                  refused: websocket.UpgradeRefused) -> None:
    _log.warning("WebSocket upgrade refused", peer=peer, reason=str(refused))
    writer.write(websocket.refusal(refused.status, refused.reason, refused.headers))
    try:
        await writer.drain()
    except OSError:
        _log.debug("the refused client left before the answer", peer=peer)


async def _end(writer: asyncio.StreamWriter) -> None:
    """Flush and close ``writer``'s connection; abort it if it does not end in time."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
    except (OSError, TimeoutError):  # the peer broke the connection or hangs: drop it
        writer.transport.abort()


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
