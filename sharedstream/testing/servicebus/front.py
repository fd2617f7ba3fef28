"""What the Service Bus test server's two fronts share: a relay on an asyncio thread of its own.

The server's proton container listens on a loopback port of its own;
clients reach it through fronts (:mod:`.amqp_front` for AMQP,
:mod:`.websocket_front` for AMQP over WebSockets), each an asyncio loop on
a thread beside the container's, serving a socket the server bound.
:class:`RelayFront` is that machinery; a front is a subclass that says
what one accepted connection does (:meth:`RelayFront.handle`).

Invariants:

1. TLS, when served, ends in the front (Python's ``ssl``, the certificate
   files of :mod:`sharedstream.testing.tls`), its handshake bounded by
   :data:`HANDSHAKE_TIMEOUT`.
2. Every connection is a task the front owns: :meth:`RelayFront.stop`
   cancels them all, waits up to :data:`CLOSE_TIMEOUT` for them, and ends
   the thread; then the listening socket is closed.
3. Bounded: at most :data:`CHUNK` bytes are read at once, and each write
   waits for its peer to drain (:func:`pump`), so a slow side slows the
   other instead of filling memory.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.testing.tls import ServerCertificates

__all__ = ["CHUNK", "CLOSE_TIMEOUT", "HANDSHAKE_TIMEOUT", "RelayFront", "Upstream", "dial_host",
           "end", "listen", "pump", "served_tls"]

HANDSHAKE_TIMEOUT = 10.0
"""Seconds for a client's TLS handshake (and a WebSocket upgrade), and for a connect upstream."""
CLOSE_TIMEOUT = 5.0
"""Seconds to wait for a peer's close, or for a connection to end."""
CHUNK = 64 * 1024
"""The most read from a connection at once."""

_log = key_value_logger(__name__)


@dataclass(frozen=True)
class Upstream:
    """Where a front relays to, and the TLS to reach it with (``None``: plain)."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the port (``OSError`` or ``TimeoutError`` when it fails)."""
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.tls, limit=CHUNK),
            HANDSHAKE_TIMEOUT)


def dial_host(host: str) -> str:
    """The address to reach a port bound on ``host`` (a wildcard one through loopback)."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port), IPv4 or IPv6 as ``host`` is."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family)


def served_tls(certificates: ServerCertificates | None) -> ssl.SSLContext | None:
    """The TLS a front serves with ``certificates`` (``None``: none, plain)."""
    if certificates is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.cert_file, certificates.key_file)
    return context


async def end(writer: asyncio.StreamWriter) -> None:
    """Flush and close ``writer``'s connection; abort it if it does not end in time."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
    except (OSError, TimeoutError):  # the peer broke the connection or hangs: drop it
        writer.transport.abort()


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               convert: Callable[[bytes], bytes]) -> None:
    """Copy ``reader`` to ``writer`` through ``convert`` until the end of ``reader``.

    Reads at most :data:`CHUNK` at once and drains after each write
    (invariant 3). Raises what reading, converting or writing raises.
    """
    while data := await reader.read(CHUNK):
        if out := convert(data):
            writer.write(out)
            await writer.drain()


class RelayFront:
    """A front serving an already listening socket on a thread of its own (module docstring).

    ``listening``: bound and listening; the front closes it when it stops.
    ``tls``: what it serves (:func:`served_tls`; ``None``: plain). ``name``:
    the thread's, and the logs'. ``limit``: the stream readers' buffer
    bound. :meth:`start` and :meth:`stop` are called from any one thread;
    :meth:`handle` runs on the front's own, once per connection.
    """

    def __init__(self, listening: socket.socket, tls: ssl.SSLContext | None, *, name: str,
                 limit: int = CHUNK) -> None:
        self._listening, self._tls, self._name, self._limit = listening, tls, name, limit
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
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

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one accepted connection (TLS done); the front closes ``writer`` after.

        Cancelled when the front stops. What it raises is logged, and ends
        that connection only.
        """
        raise NotImplementedError

    def start(self, timeout: float = 10.0) -> None:
        """Serve on the front's thread; return once it accepts connections.

        Raises what stopped it from serving (``RuntimeError`` if it did not
        serve within ``timeout`` seconds).
        """
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{self._name} did not start within {timeout} s")
        if self._failure is not None:
            raise self._failure

    def stop(self, timeout: float = 10.0) -> None:
        """End every connection and the thread (invariant 2); idempotent."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop closed in between: the thread is ending anyway
                _log.debug("a front's loop had closed", front=self._name)
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._listening.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:  # noqa: BLE001 - handed to start()'s caller, or logged
            if self._ready.is_set():
                _log.exception("a front failed", front=self._name)
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(
            self._accepted, sock=self._listening, ssl=self._tls,
            ssl_handshake_timeout=None if self._tls is None else HANDSHAKE_TIMEOUT,
            limit=self._limit)
        try:
            self._ready.set()
            await self._stopping.wait()
        finally:
            server.close()  # no new connection; then end the open ones (invariant 2)
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
            await self.handle(reader, writer)
        except Exception:  # noqa: BLE001 - one connection's failure ends it alone; logged
            _log.exception("a front's connection failed", front=self._name,
                           peer=writer.get_extra_info("peername"))
        finally:
            self._connections -= owned
            await end(writer)
