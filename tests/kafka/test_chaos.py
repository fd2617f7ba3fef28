"""Chaos soak: the triggerer CLI SIGKILLed and restarted at random moments under steady load.

Records are produced continuously to a 3-partition Tansu topic while
``sharedstream triggerer`` (the demo definitions: four watchers on one shared
consumer, three DAGs) is killed with SIGKILL and restarted ``ROUNDS`` times,
each after a random uptime (startup and group join included, so some kills
land before the first commit). A last triggerer drains the topic and stops
with SIGTERM. Every record must then have produced exactly one asset event
per matching watcher, and exactly one ``ship`` run per order.

``SHAREDSTREAM_CHAOS_SEED`` replays a run's kill moments (the seed is in the
failure message).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from sharedstream.demo import demo_message
from sharedstream.testing.harness import Stream
from tests.kafka.conftest import KafkaHarness, demo_cli, demo_environment
from tests.kafka.demo_accounting import check_demo_outcome

pytestmark = pytest.mark.slow

ROUNDS = 5
PARTITIONS = 3
RATE = 400
"""Records produced per second while the triggerers are being killed."""


class Production:
    """Produces demo records continuously; remembers where each one landed."""

    def __init__(self, harness: KafkaHarness, stream: Stream) -> None:
        self.harness, self.stream = harness, stream
        self.at: dict[tuple[int, int], int] = {}
        """``(partition, offset)`` -> index of the record there."""
        self.ends = dict.fromkeys(range(PARTITIONS), 0)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        index = 0
        batch = RATE // 20
        while not self.stop.is_set():
            sent = []
            for i in range(index, index + batch):
                key, value = demo_message(i)
                sent.append((i, await self.harness.client.send(
                    self.stream.name, value, key=key, partition=i % PARTITIONS)))
            for i, future in sent:
                meta = await future
                self.at[(meta.partition, meta.offset)] = i
                self.ends[meta.partition] = max(self.ends[meta.partition], meta.offset + 1)
            index += batch
            await asyncio.sleep(0.05)


async def kill(process: subprocess.Popen[bytes], log: Path) -> None:
    if process.poll() is not None:
        tail = await asyncio.to_thread(log.read_text)
        raise AssertionError(f"the triggerer exited by itself: {tail[-2000:]}")
    process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(process.wait, 10)


async def committed_ends(harness: KafkaHarness, stream: Stream) -> dict[int, int]:
    return {p: await harness.committed(stream, p) for p in range(PARTITIONS)}


@pytest.mark.timeout(300)
async def test_random_sigkills_under_load_lose_and_duplicate_nothing(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    seed = int(os.environ.get("SHAREDSTREAM_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    name = f"chaos-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=f"{name}.dlq", group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=PARTITIONS)
    await harness.create_topics(f"{name}.dlq")
    cli = demo_cli(tmp_path, demo_environment(harness.bootstrap, stream))
    cli.run("init", "--path", str(cli.config))

    production = Production(harness, stream)
    producing = asyncio.create_task(production.run())
    processes: list[subprocess.Popen[bytes]] = []
    at_kill: list[dict[int, int]] = []
    try:
        for round_ in range(ROUNDS):
            processes.append(cli.start(round_))
            await asyncio.sleep(rng.uniform(1.5, 7.0))
            await kill(processes[-1], tmp_path / f"triggerer-{round_}.log")
            at_kill.append(await committed_ends(harness, stream))
            await asyncio.sleep(rng.uniform(0.0, 1.0))
        production.stop.set()
        await producing

        last = cli.start(ROUNDS)
        processes.append(last)
        try:
            async with asyncio.timeout(120):
                while await committed_ends(harness, stream) != production.ends:
                    assert last.poll() is None, "the last triggerer exited"
                    await asyncio.sleep(0.2)
        except TimeoutError:
            raise AssertionError(
                f"seed {seed}: committed {await committed_ends(harness, stream)}, "
                f"produced {production.ends}") from None
        last.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(last.wait, 30) == 0
    finally:
        production.stop.set()
        await asyncio.wait([producing])
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    context = f"seed {seed}, committed at each kill: {at_kill}"
    check_demo_outcome(cli, name, production.at, await harness.dead_letters(stream), context)
