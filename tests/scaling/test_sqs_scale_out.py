"""Two triggerers, one PostgreSQL, one SQS queue: competing consumers, and a SIGKILL.

Both triggerers run the three watchers of ``tests/sqs/sqs_defs.py`` (one
shared receiver each, visibility timeout 6 s) on one queue, so SQS hands
each message to one of them. One is SIGKILLed while it holds messages; they
become visible again when their visibility lapses and the survivor takes
them. A message the dead triggerer had stored but not yet deleted comes back
too: its idempotency key makes it a duplicate, so every matching (watcher,
message) is stored exactly once and every order queues exactly one run.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scaling.conftest import Cluster
from tests.sqs.conftest import SqsHarness, sqs_endpoint
from tests.sqs.test_sqs_e2e import TOTAL, assets_for, message, send

__all__ = ["sqs_endpoint"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

DEFS = Path(__file__).parents[1] / "sqs" / "sqs_defs.py"


async def test_two_triggerers_compete_for_one_queue_and_the_survivor_takes_over(
    postgres_database: str, sqs_endpoint: str, cluster_factory: Callable[..., Cluster],
) -> None:
    harness = SqsHarness(sqs_endpoint, fifo=False)
    await harness.start()
    try:
        stream = await harness.create_stream()
        assert stream.dead_letter is not None
        cluster = cluster_factory(
            postgres_database, SQS_TEST_ENDPOINT=sqs_endpoint, SQS_TEST_QUEUE=stream.name,
            SQS_TEST_DLQ=stream.dead_letter,
            SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT="10")
        procs = [cluster.start(index, DEFS) for index in range(2)]
        ids = await send(harness, stream, range(TOTAL // 2))

        async def deleted(at_least: int, within: float) -> None:
            deadline = time.monotonic() + within
            while await harness.committed(stream) < at_least:
                assert time.monotonic() < deadline, f"fewer than {at_least} deleted"
                await asyncio.sleep(0.1)

        await deleted(60, 30)
        ids |= await send(harness, stream, range(TOTAL // 2, TOTAL))
        victim, survivor = procs
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait(timeout=10)
        at_kill = await harness.committed(stream)
        assert at_kill < TOTAL
        await deleted(TOTAL, 60)
        took = time.monotonic() - killed
        print(f"\nSQS: {TOTAL - at_kill} messages left at the SIGKILL, all deleted by the "
              f"survivor {took:.2f} s later (visibility timeout 6 s)")
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=30) == 0

        events = cluster.json("events", "list", "--limit", "100000")
        stored = Counter((asset, e["payload"]["message_id"]) for e in events
                         for asset in e["assets"])
        wanted = Counter((asset, ids[i]) for i in range(TOTAL)
                         for asset in assets_for(*message(i)))
        assert stored == wanted  # every matching (watcher, message) exactly once
        ship = cluster.json("runs", "list", "--dag", "ship", "--limit", "100000")
        assert len(ship) == sum(1 for asset, _ in wanted if asset == "orders")
        consumed = [e for run in ship for e in run["asset_events"]]
        assert len(consumed) == len(set(consumed))
    finally:
        await harness.close()
