"""A TCP proxy that delays every byte: a broker's test server as far away as a real one.

A broker's test server on ``127.0.0.1`` answers in a fraction of a
millisecond, so a producer that makes one round trip per message looks
as fast as one that makes one per thousand. :class:`LatencyProxy` stands
between a client and such a server and holds every chunk of bytes, in
each direction, for a one-way ``delay`` plus a ``jitter`` drawn per chunk,
so the client sees the round-trip time of a real network (Azure, say, is
5-30 ms from most machines that call it). It knows no protocol: Kafka,
AMQP, HTTP all pass through unchanged.

Terms: a *relay* is one client connection and the upstream connection
opened for it; each relay has two *pipes* (client to server, server to
client). A *chunk* is what one read returned.

Invariants:

1. Bytes leave a pipe in the order they entered it, never before
   ``delay + jitter`` after they were read (jitter is drawn uniformly from
   ``[-jitter, +jitter]`` per chunk, the sum never below zero); a chunk
   whose draw would overtake the one before it waits for it (TCP does
   not reorder).
2. A new relay costs one round trip (``2 * delay``) before the upstream
   connection is opened: the TCP handshake the server is too close to
   charge. Bytes the client sent meanwhile are read after it.
3. An end of stream (the client or the server half-closing) is passed on
   after the same delay as the bytes before it; once both pipes of a
   relay have ended, or either side failed (a reset, an upstream
   connection refused or not open within :data:`CONNECT_TIMEOUT`), both
   connections are closed.
4. Each pipe holds at most ``max_chunks`` chunks in flight; past that it
   stops reading (the sender's TCP window then fills): memory is bounded.
5. Every relay task is owned by the proxy: :meth:`LatencyProxy.aclose`
   stops accepting, cancels every relay and waits for them.

:class:`LatencyProxy` runs on the caller's event loop (``async with``);
:func:`latency_proxy` runs one on a thread of its own with its own loop,
for code that is not async or whose loop must not carry the proxy's work
(a test whose client runs in a subprocess, or that blocks its own loop).
Both listen on ``127.0.0.1`` on a free port (:attr:`LatencyProxy.port`).

As a command, for a client in another process (or a broker of your own)::

    python -m sharedstream.testing.latency_proxy HOST:PORT --rtt-ms 20 [--jitter-ms 2]
                                                 [--port N] [--seed S]

runs one (one-way delay = half the round trip, jitter per chunk either
way) until SIGINT or SIGTERM, then closes every relay and exits 0. Once
bound it prints one line to stdout, flushed, saying where it listens
and where to: ``listening on 127.0.0.1:PORT, 20 ms round trip to
HOST:PORT`` (:func:`main`). Bad arguments: one line on stderr, exit
status 2; a port it cannot bind: one line, exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import NoReturn

__all__ = ["CONNECT_TIMEOUT", "LatencyProxy", "ProxyAddress", "latency_proxy", "main"]

_CHUNK = 65536
"""Bytes read at once from either side."""
CONNECT_TIMEOUT = 10.0
"""Seconds an upstream connection may take to open before the client's is closed."""


class LatencyProxy:
    """A delaying TCP proxy to ``upstream_host:upstream_port`` on the running event loop.

    ``delay`` is the one-way delay in seconds, added in both directions (the
    round-trip time is twice it); ``jitter`` the most a chunk's delay
    varies either way; ``seed`` makes the jitter repeatable. See the module
    docstring for the guarantees. Use it as ``async with``, or call
    :meth:`start` and :meth:`aclose`. ``relays`` counts the connections
    accepted so far.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, delay: float,
                 jitter: float = 0.0, seed: int | None = None, port: int = 0,
                 max_chunks: int = 256) -> None:
        if delay < 0 or jitter < 0:
            raise ValueError(f"delay and jitter must be >= 0, got {delay}, {jitter}")
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        self.upstream = (upstream_host, upstream_port)
        self.delay, self.jitter = delay, jitter
        self.max_chunks = max_chunks
        self.relays = 0
        self._random = random.Random(seed)  # noqa: S311 - jitter, not a secret
        self._wanted_port = port
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = False

    @property
    def port(self) -> int:
        """The port the proxy listens (or listened) on, on ``127.0.0.1``; once started."""
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    async def start(self) -> LatencyProxy:
        """Bind and start accepting; returns ``self``. Raises ``OSError`` if it cannot bind.

        A closed proxy may be started again: given a fixed ``port``, it comes
        back on the same one (a server that goes away and returns).
        """
        self._accepting = True
        self._server = await asyncio.start_server(self._accept, "127.0.0.1",
                                                  self._wanted_port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def aclose(self) -> None:
        """Stop accepting, cancel every relay and wait for them. Idempotent.

        A connection the kernel accepted just before the close, whose callback
        runs after it, is aborted at once rather than relayed.
        """
        self._accepting = False
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> LatencyProxy:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.aclose()

    def _delay(self) -> float:
        """One chunk's delay: ``delay`` give or take up to ``jitter``, never negative."""
        if not self.jitter:
            return self.delay
        return max(0.0, self.delay + self._random.uniform(-self.jitter, self.jitter))

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``asyncio.start_server``'s callback: start the relay as a task the proxy owns."""
        if not self._accepting:
            writer.transport.abort()  # accepted as the proxy closed: never relayed
            return
        self.relays += 1
        task = asyncio.get_running_loop().create_task(
            self._relay(reader, writer), name=f"latency-proxy relay {self.relays}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter) -> None:
        """One client connection: the handshake's round trip, then both pipes until done."""
        server_writer: asyncio.StreamWriter | None = None
        try:
            await asyncio.sleep(2 * self.delay)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    server_reader, server_writer = await asyncio.open_connection(
                        *self.upstream)
            except (OSError, TimeoutError):
                return  # the server is not there: the client sees its connection end
            async with asyncio.TaskGroup() as pipes:
                pipes.create_task(self._pipe(client_reader, server_writer), name="to server")
                pipes.create_task(self._pipe(server_reader, client_writer), name="to client")
        except* OSError:
            pass  # a reset or broken pipe on either side ends the relay: both are closed below
        finally:
            for writer in (client_writer, server_writer):
                if writer is not None:
                    writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk held for its delay, then pass the EOF on."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self.max_chunks)

        async def read() -> None:
            due = 0.0
            while True:
                data = await reader.read(_CHUNK)
                due = max(due, loop.time() + self._delay())  # never overtakes the one before
                await chunks.put((due, data))
                if not data:
                    return

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(read(), name="read")
            while True:
                due, data = await chunks.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()


@dataclass(frozen=True)
class ProxyAddress:
    """Where a :func:`latency_proxy` listens, and its proxy (read its counters, not its loop)."""

    host: str
    port: int
    proxy: LatencyProxy


@contextlib.contextmanager
def latency_proxy(upstream_host: str, upstream_port: int, *, delay: float,
                  jitter: float = 0.0, seed: int | None = None) -> Iterator[ProxyAddress]:
    """A :class:`LatencyProxy` on a thread of its own; yields where it listens.

    Started (bound) before the block runs, stopped when it ends: every
    relay cancelled and the thread joined (within 10 s), whatever happens
    in the block. Raises ``RuntimeError`` if the proxy does not start within
    10 s, ``OSError`` if it cannot bind.
    """
    proxy = LatencyProxy(upstream_host, upstream_port, delay=delay, jitter=jitter, seed=seed)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failure: list[BaseException] = []
    stop: list[asyncio.Event] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        try:
            await proxy.start()
        except OSError as exc:
            failure.append(exc)
            return
        finally:
            started.set()
        try:
            await stop[0].wait()
        finally:
            await proxy.aclose()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),),
                              name="latency-proxy", daemon=True)
    thread.start()
    try:
        if not started.wait(10):
            raise RuntimeError("the latency proxy did not start within 10 s")
        if failure:
            raise failure[0]
        yield ProxyAddress("127.0.0.1", proxy.port, proxy)
    finally:
        if stop:
            loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        if not thread.is_alive():
            loop.close()


# -- the command ----------------------------------------------------------------------------


def _address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> ``(host, port)``; ``ArgumentTypeError`` otherwise."""
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _milliseconds(text: str) -> float:
    """A number of milliseconds, at least 0; ``ArgumentTypeError`` otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected milliseconds >= 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """``argparse``, but an argument error is one line on stderr (then exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m sharedstream.testing.latency_proxy",
        description="A TCP proxy on 127.0.0.1 that delays every byte both ways: a server "
        "as far away as a real one. Runs until SIGINT or SIGTERM.")
    parser.add_argument("upstream", type=_address, metavar="HOST:PORT",
                        help="the server to relay to")
    parser.add_argument("--rtt-ms", type=_milliseconds, required=True,
                        help="round-trip time to add, in ms (each way: half of it)")
    parser.add_argument("--jitter-ms", type=_milliseconds, default=0.0,
                        help="the most a chunk's one-way delay varies either way, in ms "
                        "(default 0)")
    parser.add_argument("--port", type=int, default=0,
                        help="the port to listen on, on 127.0.0.1 (default: a free one)")
    parser.add_argument("--seed", type=int, default=None, help="makes the jitter repeatable")
    return parser


async def _serve(args: argparse.Namespace) -> int:
    """Run the proxy until SIGINT or SIGTERM; 1 if it cannot bind."""
    host, port = args.upstream
    proxy = LatencyProxy(host, port, delay=args.rtt_ms / 2000, jitter=args.jitter_ms / 1000,
                         seed=args.seed, port=args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await proxy.start()
    except OSError as exc:
        print(f"error: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"listening on 127.0.0.1:{proxy.port}, {args.rtt_ms:g} ms round trip to "
              f"{host}:{port}", flush=True)
        await stop.wait()
    finally:
        await proxy.aclose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status.

    Argument errors leave through :class:`SystemExit` with status 2
    (``argparse``). Signals are taken on the running thread's new event
    loop, so call it from the main thread.
    """
    args = _parser().parse_args(argv)
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
