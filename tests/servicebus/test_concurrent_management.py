"""Overlapping management requests on one connection, as azure-servicebus 7.15 sends them.

The SDK's session reads its next delivery-id before a send and raises it
after, so requests sent at once by its ``AutoLockRenewer`` or by several
tasks peeking on one receiver carry the same delivery-id when their writes
take turns. Service Bus takes them; the test server's AMQP front
(:mod:`sharedstream.testing.servicebus.amqp_rewrite`) renumbers them for
proton, which would otherwise close the connection ("sequencing error",
and these calls fail). Driven by the real SDK only, over TLS as it reaches
Service Bus. Whether the writes take turns depends on the SDK's timing:
the old server passed this test in every run here, where
azure-servicebus's own tests of the same (run by the fidelity suite,
``test_*peek_check_uniq_corr_id``, ``*autolockrenew*``) failed every time.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from sharedstream.testing.brokers.process import BrokerNotInstalled, free_port
from sharedstream.testing.brokers.servicebus import (
    start_servicebus,
    stop_servicebus,
    tls_client_options,
)

servicebus: Any = pytest.importorskip("azure.servicebus")
servicebus_aio: Any = pytest.importorskip("azure.servicebus.aio")

PEEKS = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The kit's server over TLS: the client's keyword arguments to reach it."""
    workdir, port = tmp_path_factory.mktemp("servicebus-concurrent"), free_port()
    entities = {"queues": [{"name": "peek"}]}
    try:
        process, connection_string = start_servicebus(workdir, entities=entities, port=port,
                                                      tls=True)
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        yield {"conn_str": connection_string, "transport_type": servicebus.TransportType.Amqp,
               **tls_client_options(workdir, port)}
    finally:
        stop_servicebus(process)
        gc.collect()  # the SDK leaves broken connections' sockets to the collector


@pytest.mark.timeout(60)
async def test_ten_peeks_at_once_on_one_receiver_each_get_their_message(
        server: dict[str, Any]) -> None:
    async with servicebus_aio.ServiceBusClient.from_connection_string(**server) as client:
        async with client.get_queue_sender("peek", keep_alive=None) as sender:
            await sender.send_messages([servicebus.ServiceBusMessage(f"m-{n}")
                                        for n in range(PEEKS)])
        async with client.get_queue_receiver("peek") as receiver:
            numbers = list(range(1, PEEKS + 1))  # the queue's first: its management link opens
            peeked = await asyncio.gather(*(
                receiver.peek_messages(max_message_count=1, sequence_number=number)
                for number in numbers))
            assert [[message.sequence_number for message in one] for one in peeked] == [
                [number] for number in numbers]
