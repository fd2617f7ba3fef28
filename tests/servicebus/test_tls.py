"""The Service Bus producer over ``amqps``: the kit's server serving TLS, the real SDK through ours.

Production Service Bus is AMQP over TLS. The kit's server (a child process,
as users start it) serves ``amqps`` with a certificate it makes at start;
the trigger's producer, given the server's CA as ``connection_verify`` and
its port as ``custom_endpoint_address``, receives over it. Without the CA
the SDK's own bundle does not know the server: the poll ends with one line
saying the certificate was not verified.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.producers.servicebus import (
    ServiceBusConfigError,
    ServiceBusProducerError,
    ServiceBusSettings,
    ServiceBusSharedStreamProducer,
)
from sharedstream.testing.brokers.process import BrokerNotInstalled, free_port
from sharedstream.testing.brokers.servicebus import (
    start_servicebus,
    stop_servicebus,
    tls_client_options,
)
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger

servicebus: Any = pytest.importorskip("azure.servicebus")
aio: Any = pytest.importorskip("azure.servicebus.aio")

QUEUE = "over-tls"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The kit's server serving ``amqps``: its connection string and the client's TLS options."""
    workdir, port = tmp_path_factory.mktemp("servicebus-tls"), free_port()
    try:
        process, connection_string = start_servicebus(
            workdir, entities={"queues": [{"name": QUEUE}]}, port=port, tls=True)
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        yield connection_string, tls_client_options(workdir, port)
    finally:
        stop_servicebus(process)
        gc.collect()  # the SDK leaves broken connections' sockets to the collector


async def send(connection_string: str, options: dict[str, str], body: bytes) -> None:
    """Send ``body`` to the queue with the SDK's own client, over TLS."""
    client = aio.ServiceBusClient.from_connection_string(
        connection_string, transport_type=servicebus.TransportType.Amqp, **options)
    async with client, client.get_queue_sender(QUEUE, keep_alive=None) as sender:
        await sender.send_messages(servicebus.ServiceBusMessage(body))


async def first_of(producer: ServiceBusSharedStreamProducer) -> Any:
    """The first message the producer's poll yields (its batch settled), then the poll ends."""
    try:
        async for message, payload in producer.open_stream():
            del payload
            return message
    finally:
        await producer.aclose()
    raise AssertionError("the poll ended without a message")


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_the_trigger_receives_over_tls(tls_server: tuple[str, dict[str, str]]) -> None:
    connection_string, options = tls_server
    await send(connection_string, options, b"over amqps")
    trigger = ServiceBusSharedStreamTrigger(
        connection_string=connection_string, queue=QUEUE, max_wait_time=0.5,
        connection_verify=options["connection_verify"],
        custom_endpoint_address=options["custom_endpoint_address"])
    producer = ServiceBusSharedStreamTrigger.create_shared_stream_producer(
        trigger.consumer_kwargs())
    assert isinstance(producer, ServiceBusSharedStreamProducer)
    message = await asyncio.wait_for(first_of(producer), 20)
    assert message.body == b"over amqps"


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_without_the_ca_the_server_is_refused(
        tls_server: tuple[str, dict[str, str]]) -> None:
    connection_string, options = tls_server
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string=connection_string, queue=QUEUE, max_wait_time=0.5, retries=0,
        custom_endpoint_address=options["custom_endpoint_address"]))
    with pytest.raises(ServiceBusProducerError) as raised:
        await asyncio.wait_for(first_of(producer), 20)
    text = str(raised.value)
    assert "certificate verify failed" in text.lower()
    assert "\n" not in text


def test_an_unreadable_ca_file_is_one_line(tmp_path: Path) -> None:
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string="Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=v;",
        queue=QUEUE, connection_verify=str(tmp_path / "missing.pem")))

    async def poll() -> None:
        async for _ in producer.open_stream():
            pass

    with pytest.raises(ServiceBusConfigError, match=r"^connection_verify '.*missing.pem' cannot"):
        asyncio.run(poll())
