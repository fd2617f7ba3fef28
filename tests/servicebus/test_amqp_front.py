"""The Service Bus test server's AMQP port, a relay in front of proton, over real sockets.

The server runs on a thread of this test (:func:`~sharedstream.testing.servicebus.server.serve`);
the clients are raw sockets, so what comes back is exactly what crossed the
relay. (The SDK's own traffic through it is every other test of this folder.)
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("proton")

from sharedstream.testing.servicebus.server import ServerControl, serve


@pytest.fixture
def server() -> Iterator[tuple[int, ServerControl]]:
    """A server on a thread: its port and its control."""
    control, bound, ready = ServerControl(), [], threading.Event()

    def on_ready(port: int) -> None:
        bound.append(port)
        ready.set()

    thread = threading.Thread(target=serve, kwargs={"control": control, "ready": on_ready})
    thread.start()
    try:
        assert ready.wait(10)
        yield bound[0], control
    finally:
        control.stop()
        thread.join(10)


def read_to_end(client: socket.socket) -> bytes:
    received = bytearray()
    while data := client.recv(65536):
        received += data
    return bytes(received)


@pytest.mark.timeout(30)
def test_proton_s_refusal_of_what_is_not_amqp_reaches_the_client_then_the_end(
        server: tuple[int, ServerControl]) -> None:
    with socket.create_connection(("127.0.0.1", server[0]), timeout=10) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = read_to_end(client)
    assert answer.startswith(b"AMQP\x00\x01\x00\x00")
    assert b"amqp:connection:framing-error" in answer


@pytest.mark.timeout(30)
def test_bytes_that_break_amqp_framing_end_the_connection(
        server: tuple[int, ServerControl]) -> None:
    with socket.create_connection(("127.0.0.1", server[0]), timeout=10) as client:
        client.sendall(b"AMQP\x00\x01\x00\x00" + b"\x00\x00\x00\x08\x01\x00\x00\x00")  # offset 1
        started = time.monotonic()
        answer = read_to_end(client)  # the relay ends it, whether proton's header came first
    assert b"AMQP\x00\x01\x00\x00".startswith(answer[:8])
    assert len(answer) <= 8
    assert time.monotonic() - started < 5


@pytest.mark.timeout(30)
def test_stopping_the_server_ends_an_open_connection(server: tuple[int, ServerControl]) -> None:
    port, control = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"AMQP\x03\x01\x00\x00")
        assert client.recv(8) == b"AMQP\x03\x01\x00\x00"  # proton's SASL header, relayed
        started = time.monotonic()
        control.stop()
        read_to_end(client)
        assert time.monotonic() - started < 5
