"""Chaos soak on SQS: the triggerer CLI SIGKILLed and restarted at random moments under load.

Messages are sent continuously to a standard moto queue while ``sharedstream
triggerer`` (``sqs_defs.py``: three watchers on one receiver, one DAG) is
killed with SIGKILL and restarted ``ROUNDS`` times, each after a random
uptime. A last triggerer drains the queue and stops with SIGTERM. Every
message must then have produced exactly one asset event per matching
watcher and exactly one ``ship`` run per order, and every malformed one
must be in the dead-letter queue.

``SHAREDSTREAM_CHAOS_SEED`` replays a run's kill moments (the seed is in the
failure message).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.harness import Stream
from tests.sqs.conftest import SqsHarness
from tests.sqs.test_sqs_e2e import assets_for, message, send, sqs_cli

pytestmark = pytest.mark.slow

ROUNDS = 4
RATE = 100
"""Messages sent per second while the triggerers are being killed (moto is slow)."""


class Production:
    """Sends messages continuously; remembers each one's message id."""

    def __init__(self, harness: SqsHarness, stream: Stream) -> None:
        self.harness, self.stream = harness, stream
        self.ids: dict[int, str] = {}
        self.stop = asyncio.Event()

    async def run(self) -> None:
        index, batch = 0, RATE // 5
        while not self.stop.is_set():
            self.ids |= await send(self.harness, self.stream, range(index, index + batch))
            index += batch
            await asyncio.sleep(0.2)


@pytest.mark.timeout(600)
async def test_repeated_sigkill_under_load_loses_and_duplicates_nothing(
    sqs_endpoint: str, tmp_path: Path,
) -> None:
    seed = int(os.environ.get("SHAREDSTREAM_CHAOS_SEED", uuid.uuid4().int % 10**6))
    rng = random.Random(seed)
    harness = SqsHarness(sqs_endpoint, fifo=False)
    await harness.start()
    try:
        stream = await harness.create_stream()
        cli = sqs_cli(tmp_path, sqs_endpoint, stream)
        production = Production(harness, stream)
        producing = asyncio.create_task(production.run())
        try:
            for round_ in range(ROUNDS):
                process = cli.start(round_)
                await asyncio.sleep(rng.uniform(1.0, 6.0))
                assert process.poll() is None, f"seed {seed}: exited: {cli.log(round_)[-2000:]}"
                process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(process.wait, 10)
        finally:
            production.stop.set()
            await producing
        last = cli.start(ROUNDS)
        try:
            total = len(production.ids)
            async with asyncio.timeout(240):
                while await harness.committed(stream) < total:
                    assert last.poll() is None, f"seed {seed}: {cli.log(ROUNDS)[-2000:]}"
                    await asyncio.sleep(0.2)
            last.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(last.wait, 30) == 0
        finally:
            if last.poll() is None:
                last.kill()
                last.wait()

        ids = production.ids
        events: list[dict[str, Any]] = json.loads(
            cli.run("events", "list", "--json", "--limit", "1000000"))
        stored = Counter((asset, e["payload"]["message_id"]) for e in events
                         for asset in e["assets"])
        wanted = Counter((asset, ids[i]) for i in ids for asset in assets_for(*message(i)))
        assert stored == wanted, f"seed {seed}"
        ship = json.loads(cli.run("runs", "list", "--json", "--dag", "ship", "--limit",
                                  "1000000"))
        assert len(ship) == sum(1 for asset, _ in wanted if asset == "orders"), f"seed {seed}"
        letters = await harness.dead_letters(stream)
        malformed = {ids[i] for i in ids if not assets_for(*message(i))}
        assert {letter.source for letter in letters} == malformed, f"seed {seed}"
    finally:
        await harness.close()
