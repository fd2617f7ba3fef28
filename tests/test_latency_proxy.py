"""The testing kit's latency proxy: bytes arrive late, in order, whole; ends and failures pass on.

Real sockets on ``127.0.0.1`` against a small echo server; delays of tens
of milliseconds, so each test takes well under a second. Times are checked
from below (never early) with a generous bound above (a busy machine is
slow, never fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from sharedstream.testing.brokers.process import free_port
from sharedstream.testing.latency_proxy import LatencyProxy, latency_proxy

DELAY = 0.04
SLACK = 0.5
"""Seconds a busy machine may add to what the proxy should take."""


class EchoServer:
    """Echoes what it reads; notes when each connection's first byte came; EOF ends it."""

    def __init__(self) -> None:
        self.first_byte: list[float] = []
        self.server: asyncio.Server | None = None

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while data := await reader.read(65536):
            if first:
                self.first_byte.append(asyncio.get_running_loop().time())
                first = False
            writer.write(data)
            await writer.drain()
        writer.write(b"<eof>")
        await writer.drain()
        writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    echo = EchoServer()
    echo.server = await asyncio.start_server(echo._echo, "127.0.0.1", 0)
    async with echo.server:
        yield echo


async def test_a_round_trip_takes_twice_the_delay_and_the_bytes_are_unchanged(
    echo: EchoServer,
) -> None:
    async with LatencyProxy("127.0.0.1", echo.port, delay=DELAY) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            await _round_trip(reader, writer, b"warm-up")  # the handshake's round trip
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await _round_trip(reader, writer, b"ping") == b"ping"
            took = loop.time() - started
        finally:
            writer.close()
        assert 2 * DELAY <= took < 2 * DELAY + SLACK, took
        assert proxy.relays == 1


async def test_a_new_connection_costs_a_round_trip_before_its_first_byte_arrives(
    echo: EchoServer,
) -> None:
    async with LatencyProxy("127.0.0.1", echo.port, delay=DELAY) as proxy:
        loop = asyncio.get_running_loop()
        started = loop.time()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(b"hello")  # sent at once; the handshake is still under way
            assert await reader.readexactly(5) == b"hello"
        finally:
            writer.close()
        # handshake (2 delays), then the byte's way there (1 delay)
        assert echo.first_byte[0] - started >= 3 * DELAY


async def test_jitter_never_reorders_bytes(echo: EchoServer) -> None:
    """300 small writes, each delayed by 0-80 ms: they come back whole and in order."""
    sent = [f"{n:04d};".encode() for n in range(300)]
    async with LatencyProxy("127.0.0.1", echo.port, delay=DELAY, jitter=DELAY,
                            seed=7) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            for part in sent:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0)  # separate reads at the proxy, each its own draw
            got = await reader.readexactly(sum(map(len, sent)))
        finally:
            writer.close()
    assert got == b"".join(sent)


async def test_a_half_close_is_passed_on_after_the_bytes_before_it(echo: EchoServer) -> None:
    async with LatencyProxy("127.0.0.1", echo.port, delay=DELAY) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(b"last words")
            writer.write_eof()
            # the server echoes, answers the EOF with its own and closes: all of it comes back
            assert await asyncio.wait_for(reader.read(), 5) == b"last words<eof>"
        finally:
            writer.close()


async def test_an_upstream_that_refuses_ends_the_client_s_connection() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]  # nothing listens once the socket closes
    async with LatencyProxy("127.0.0.1", closed_port, delay=0.01) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(b"anyone?")
            assert await asyncio.wait_for(_read_until_closed(reader), 5) == b""
        finally:
            writer.close()


async def test_closing_the_proxy_ends_every_relay(echo: EchoServer) -> None:
    proxy = await LatencyProxy("127.0.0.1", echo.port, delay=0.01).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        assert await _round_trip(reader, writer, b"up") == b"up"
        await asyncio.wait_for(proxy.aclose(), 5)
        assert await asyncio.wait_for(_read_until_closed(reader), 5) == b""
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", proxy.port)
    finally:
        writer.close()



async def test_a_closed_proxy_comes_back_on_its_port(echo: EchoServer) -> None:
    """A server that goes away and returns: refused while closed, relayed again after."""
    proxy = await LatencyProxy("127.0.0.1", echo.port, delay=0, port=free_port()).start()
    port = proxy.port
    try:
        await proxy.aclose()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        await proxy.start()
        assert proxy.port == port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await _round_trip(reader, writer, b"back") == b"back"
        finally:
            writer.close()
    finally:
        await proxy.aclose()


async def test_a_connection_accepted_as_the_proxy_closes_is_aborted(echo: EchoServer) -> None:
    """The accept callback that runs after ``aclose`` ends its connection, relays nothing."""
    proxy = await LatencyProxy("127.0.0.1", echo.port, delay=0).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    await proxy.aclose()
    try:
        late_reader, late_writer = await asyncio.open_connection(  # a callback after the close:
            "127.0.0.1", echo.port)                                 # fed to the proxy by hand
        proxy._accept(late_reader, late_writer)
        assert late_writer.transport.is_closing()
        assert proxy.relays == 1
        assert await asyncio.wait_for(_read_until_closed(reader), 5) == b""
    finally:
        writer.close()


def test_the_threaded_proxy_serves_blocking_clients_and_stops_with_its_block() -> None:
    """``latency_proxy`` on its own thread: a plain socket client, no event loop here."""
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        with latency_proxy("127.0.0.1", upstream.getsockname()[1], delay=DELAY) as address:
            with socket.create_connection((address.host, address.port), timeout=5) as client:
                client.sendall(b"ping")
                served, _ = upstream.accept()
                with served:
                    served.settimeout(5)
                    assert served.recv(16) == b"ping"
                    started = time.monotonic()
                    served.sendall(b"pong")
                    assert client.recv(16) == b"pong"
                    assert time.monotonic() - started >= DELAY
            assert address.proxy.relays == 1
        with pytest.raises(ConnectionRefusedError):  # stopped: nothing listens on its port any more
            socket.create_connection((address.host, address.port), timeout=1).close()


def test_negative_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="delay and jitter"):
        LatencyProxy("127.0.0.1", 1, delay=-0.01)
    with pytest.raises(ValueError, match="max_chunks"):
        LatencyProxy("127.0.0.1", 1, delay=0.01, max_chunks=0)


# -- the command: python -m sharedstream.testing.latency_proxy ---------------------------------

COMMAND = [sys.executable, "-m", "sharedstream.testing.latency_proxy"]


@contextlib.contextmanager
def _threaded_echo() -> Iterator[int]:
    """A blocking TCP echo server on a thread (the proxy's process connects to it); its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    while data := conn.recv(65536):
                        conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        server.close()


def test_the_command_delays_a_round_trip_and_ends_cleanly_on_sigterm() -> None:
    """The proxy as its own process: it says where it listens, a round trip takes >= the RTT,
    SIGTERM ends it with status 0 within a few seconds."""
    rtt = 0.06
    with _threaded_echo() as echo_port:
        proxy = subprocess.Popen(
            [*COMMAND, f"127.0.0.1:{echo_port}", "--rtt-ms", "60", "--jitter-ms", "2",
             "--seed", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proxy.stdout is not None
            line = proxy.stdout.readline()  # flushed at once: no wait for the process's end
            found = re.fullmatch(
                rf"listening on 127\.0\.0\.1:(\d+), 60 ms round trip to "
                rf"127\.0\.0\.1:{echo_port}\n", line)
            assert found is not None, line
            with socket.create_connection(("127.0.0.1", int(found[1])), timeout=5) as client:
                client.sendall(b"warm-up")  # pays the handshake's round trip
                assert _recv_exactly(client, 7) == b"warm-up"
                started = time.monotonic()
                client.sendall(b"ping")
                assert _recv_exactly(client, 4) == b"ping"
                took = time.monotonic() - started
            # jitter is at most 2 ms each way: never below rtt - 4 ms
            assert rtt - 0.004 <= took < rtt + SLACK, took
            started = time.monotonic()
            proxy.send_signal(signal.SIGTERM)
            assert proxy.wait(5) == 0
            assert time.monotonic() - started < 5
            assert proxy.stdout.read() == ""  # the one line only
        finally:
            if proxy.poll() is None:
                proxy.kill()
                proxy.wait()
            proxy.stdout.close()  # type: ignore[union-attr]
            proxy.stderr.close()  # type: ignore[union-attr]


def test_the_command_waits_out_the_full_round_trip_without_jitter() -> None:
    """Without jitter, a round trip through the proxy process is never shorter than the RTT."""
    with _threaded_echo() as echo_port:
        proxy = subprocess.Popen([*COMMAND, f"localhost:{echo_port}", "--rtt-ms", "40"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert proxy.stdout is not None
            port = int(re.findall(r"127\.0\.0\.1:(\d+)", proxy.stdout.readline())[0])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                for _ in range(3):
                    started = time.monotonic()
                    client.sendall(b"x")
                    assert _recv_exactly(client, 1) == b"x"
                    assert time.monotonic() - started >= 0.04
            proxy.send_signal(signal.SIGINT)
            assert proxy.wait(5) == 0
        finally:
            if proxy.poll() is None:
                proxy.kill()
                proxy.wait()
            proxy.stdout.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("args", [
    ["no-port-here", "--rtt-ms", "20"],
    ["127.0.0.1:http", "--rtt-ms", "20"],
    ["127.0.0.1:70000", "--rtt-ms", "20"],
    ["127.0.0.1:5672", "--rtt-ms", "-1"],
    ["127.0.0.1:5672"],
])
def test_bad_arguments_end_the_command_with_one_line_and_status_2(args: list[str]) -> None:
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "error:" in done.stderr


def test_a_port_taken_ends_the_command_with_one_line_and_status_1() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        done = subprocess.run([*COMMAND, "127.0.0.1:5672", "--rtt-ms", "20", "--port",
                               str(taken.getsockname()[1])],
                              capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), 5)


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the connection still delivers until it ends (a reset counts as an end)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""
