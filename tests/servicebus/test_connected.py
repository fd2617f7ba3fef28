"""The Service Bus producer's ``connected``: ``True`` while receiving, ``False`` once it is gone.

The kit's test server runs as a child process of this test and is stopped
under a polling producer. The SDK's retries are turned off, so the failed
receive reaches the producer at once: ``connected`` turns ``False`` and the
poll ends with the request error (the group would restart it).
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
from pathlib import Path

import pytest

from sharedstream.producers.servicebus import (
    ServiceBusProducerError,
    ServiceBusSettings,
    ServiceBusSharedStreamProducer,
)
from sharedstream.testing.brokers.process import BrokerNotInstalled
from sharedstream.testing.brokers.servicebus import start_servicebus, stop_servicebus
from sharedstream.testing.runner import eventually

pytest.importorskip("azure.servicebus")

QUEUE = "connected"


async def poll_through_a_stop(process: subprocess.Popen[bytes], connection_string: str) -> None:
    """Poll a producer, stop the server under it, and check ``connected`` on the way."""
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string=connection_string, queue=QUEUE, max_wait_time=0.2, retries=0))
    assert producer.connected is False  # no receiver yet

    async def poll() -> None:
        async for _ in producer.open_stream():
            pass

    task = asyncio.create_task(poll(), name="servicebus connected poll")
    try:
        await eventually(lambda: producer.connected is True, within=10,
                         what="connected while receiving")
        stop_servicebus(process)
        await eventually(lambda: producer.connected is False, within=10,
                         what="not connected with the server stopped")
        with pytest.raises(ServiceBusProducerError):
            await asyncio.wait_for(task, 10)  # the poll ends: its group restarts it
    finally:
        task.cancel()
        await asyncio.wait([task])
        await producer.aclose()


# azure-servicebus (7.15) leaves the socket of a connection that broke to the garbage
# collector (its connection is marked ended first, and closing an ended connection skips
# the socket), and that garbage is reachable until the event loop closes. So the test runs
# its own loop and collects the socket, and its ResourceWarning, before it returns: left
# to a later collection, the warning would fail whatever test runs then.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_connected_follows_the_server(tmp_path: Path) -> None:
    try:
        process, connection_string = start_servicebus(
            tmp_path, entities={"queues": [{"name": QUEUE}]})
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        asyncio.run(poll_through_a_stop(process, connection_string))
    finally:
        stop_servicebus(process)
        gc.collect()
