"""AMQP over WebSockets through the real SDK, sync and async, to the kit's Service Bus server.

``TransportType.AmqpOverWebsocket`` (what an ``http_proxy`` also implies)
makes azure-servicebus open ``wss://<host>:443/$servicebus/websocket`` with
the subprotocol ``AMQPWSB10`` and speak AMQP in binary frames: its sync
client through ``websocket-client``, its async one through ``aiohttp``. The
server serves it with ``--websocket-port`` (a relay to its own AMQP port,
:mod:`sharedstream.testing.servicebus.websocket_front`); here on a free port,
which the SDK is given as ``custom_endpoint_address``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.brokers.process import BrokerNotInstalled, free_port
from sharedstream.testing.brokers.servicebus import (
    servicebus_server,
    start_servicebus,
    stop_servicebus,
    tls_client_options,
)
from sharedstream.testing.fixtures import running_or_skip

servicebus: Any = pytest.importorskip("azure.servicebus")
aio: Any = pytest.importorskip("azure.servicebus.aio")
exceptions: Any = pytest.importorskip("azure.servicebus.exceptions")

OVER_WEBSOCKETS = servicebus.TransportType.AmqpOverWebsocket
QUEUES = ["sync", "async", "no-ca", "plain"]
LARGE = "A" * 250 * 1024
"""Azure's own test's payload: hundreds of WebSocket frames each way, near Standard's limit."""


@pytest.fixture(scope="module")
def wss(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    """A TLS server taking WebSockets: its connection string, work directory and wss port."""
    workdir, websocket_port = tmp_path_factory.mktemp("servicebus-wss"), free_port()
    try:
        process, connection_string = start_servicebus(
            workdir, entities={"queues": [{"name": name} for name in QUEUES]}, tls=True,
            websocket_port=websocket_port)
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        yield connection_string, workdir, websocket_port
    finally:
        stop_servicebus(process)


@pytest.mark.timeout(60)
def test_the_sync_sdk_sends_receives_and_settles_over_wss(
        wss: tuple[str, Path, int]) -> None:
    pytest.importorskip("websocket", reason="the SDK's sync WebSockets need websocket-client")
    connection_string, workdir, port = wss
    with servicebus.ServiceBusClient.from_connection_string(
            connection_string, transport_type=OVER_WEBSOCKETS,
            **tls_client_options(workdir, port)) as client:
        with client.get_queue_sender("sync", keep_alive=None) as sender:
            assert sender._config.transport_type == OVER_WEBSOCKETS
            sender.send_messages([servicebus.ServiceBusMessage(LARGE),
                                  servicebus.ServiceBusMessage("small")])
        with client.get_queue_receiver("sync", keep_alive=None) as receiver:
            first = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.abandon_message(first[0])
            received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert [(str(m), m.delivery_count) for m in received] == [(LARGE, 1), ("small", 0)]
            for message in received:
                receiver.complete_message(message)
            assert receiver.receive_messages(max_wait_time=1) == []


@pytest.mark.timeout(60)
async def test_the_async_sdk_sends_receives_and_settles_over_wss(
        wss: tuple[str, Path, int]) -> None:
    connection_string, workdir, port = wss
    client = aio.ServiceBusClient.from_connection_string(
        connection_string, transport_type=OVER_WEBSOCKETS, **tls_client_options(workdir, port))
    async with client:
        async with client.get_queue_sender("async", keep_alive=None) as sender:
            await sender.send_messages(servicebus.ServiceBusMessage(LARGE))
        async with client.get_queue_receiver("async", keep_alive=None) as receiver:
            [message] = await receiver.receive_messages(max_wait_time=5)
            assert str(message) == LARGE
            await receiver.dead_letter_message(message, reason="checked")
        async with client.get_queue_receiver("async", sub_queue="deadletter",
                keep_alive=None) as letters:
            [letter] = await letters.receive_messages(max_wait_time=5)
            assert letter.dead_letter_reason == "checked"
            await letters.complete_message(letter)


@pytest.mark.timeout(60)
async def test_without_the_ca_the_sdk_refuses_the_wss_server(
        wss: tuple[str, Path, int]) -> None:
    connection_string, _, port = wss
    client = aio.ServiceBusClient.from_connection_string(
        connection_string, transport_type=OVER_WEBSOCKETS, retry_total=0,
        custom_endpoint_address=f"sb://127.0.0.1:{port}")
    async with client:
        with pytest.raises(exceptions.ServiceBusConnectionError, match=r"(?i)certificate"):
            async with client.get_queue_sender("no-ca", keep_alive=None) as sender:
                await sender.send_messages(servicebus.ServiceBusMessage("x"))


@pytest.mark.timeout(60)
def test_a_plain_server_takes_plain_websockets_with_the_emulator_string() -> None:
    # the sync client: the async one hands aiohttp ssl=None for ws://, which aiohttp deprecates
    pytest.importorskip("websocket", reason="the SDK's sync WebSockets need websocket-client")
    port = free_port()
    entities = {"queues": [{"name": "plain"}]}
    with running_or_skip(servicebus_server(entities=entities, websocket_port=port)) as string, \
            servicebus.ServiceBusClient.from_connection_string(
                string, transport_type=OVER_WEBSOCKETS,
                custom_endpoint_address=f"sb://127.0.0.1:{port}") as client:
        with client.get_queue_sender("plain", keep_alive=None) as sender:
            sender.send_messages(servicebus.ServiceBusMessage("over ws"))
        with client.get_queue_receiver(
                "plain", receive_mode=servicebus.ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                        keep_alive=None
        ) as receiver:
            [message] = receiver.receive_messages(max_wait_time=5)
            assert str(message) == "over ws"
