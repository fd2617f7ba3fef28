"""The SQS producer's ``connected`` follows the network: the server away, and back.

The producer reaches a moto server of this test's own through the testing
kit's TCP proxy (no added delay) on a port of its own; the proxy is closed
under the polling producer (every connection through it cut, new ones
refused) and opened again on the same port, while moto, and the queue in
it, stay up. (Restarting moto itself would lose the queue, and a receive
that met the new server before the queue was made again would rightly end
the poll.) botocore's own retries are turned off, so a receive that gets no
answer reaches the producer at once; its receive loop retries, reporting
``connected`` ``False`` meanwhile, and the same poll goes on once the
server is reachable again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.producers.sqs import SqsSettings, SqsSharedStreamProducer
from sharedstream.testing.brokers.moto import start_moto, stop_moto
from sharedstream.testing.brokers.process import BrokerNotInstalled, free_port
from sharedstream.testing.harness import opened
from sharedstream.testing.latency_proxy import LatencyProxy
from sharedstream.testing.runner import eventually
from tests.sqs.conftest import CREDENTIALS, REGION, SqsHarness

QUEUE = "connected"


async def make_queue(endpoint: str) -> str:
    async with opened(SqsHarness(endpoint, fifo=False)) as harness:
        return await harness.create_queue(QUEUE)


@contextlib.asynccontextmanager
async def polling(producer: SqsSharedStreamProducer) -> AsyncIterator[asyncio.Task[None]]:
    """The producer's poll as a task for the block (what it yields is dropped)."""
    async def poll() -> None:
        async for _ in producer.open_stream():
            pass

    task = asyncio.create_task(poll(), name="sqs connected poll")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.wait([task])
        await producer.aclose()


async def test_connected_follows_the_server(tmp_path: Path) -> None:
    try:
        process, endpoint = start_moto(tmp_path, port=free_port())
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    moto_port = int(endpoint.rsplit(":", 1)[1])
    relay = await LatencyProxy("127.0.0.1", moto_port, delay=0, port=free_port()).start()
    through = f"http://127.0.0.1:{relay.port}"
    try:
        url = (await make_queue(endpoint)).replace(endpoint, through)
        # No retries inside botocore, and no call that can hang on a server gone away.
        no_sdk_retries: dict[str, Any] = {"retries": {"mode": "standard", "max_attempts": 1},
                                          "connect_timeout": 2, "read_timeout": 5}
        producer = SqsSharedStreamProducer(SqsSettings(
            queue=url, region_name=REGION, endpoint_url=through, credentials=CREDENTIALS,
            wait_time_seconds=1, receive_concurrency=1, retries=60, retry_backoff=0.1,
            client_config=no_sdk_retries))
        assert producer.connected is None  # no receive yet
        async with polling(producer) as task:
            await eventually(lambda: producer.connected is True, within=10,
                             what="connected while receiving")
            await relay.aclose()
            await eventually(lambda: producer.connected is False, within=10,
                             what="not connected with the server away")
            assert not task.done()  # the poll rides the outage out
            await relay.start()
            await eventually(lambda: producer.connected is True, within=15,
                             what="connected again once the server is back")
            assert not task.done()
    finally:
        await relay.aclose()
        stop_moto(process)
