"""Chaos: the Kafka broker restarts while the triggerer works through a backlog.

Tansu keeps its data in an S3 bucket (moto's server), so a restarted broker
has the records and the committed offsets it had. Records are produced to a
3-partition topic, ``sharedstream triggerer`` (the demo definitions: four
watchers on one shared consumer, three DAGs) starts consuming, and the
broker is killed (SIGKILL) and started again on the same port mid-way. The triggerer
must ride it out (retrying, never acknowledging what it did not store), and
every record must then have produced exactly one asset event per matching
watcher, one ``ship`` run per order, and the malformed ones be dead-lettered.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.demo import (
    demo_message,
    free_port,
    matching_assets,
    start_tansu,
    stop_tansu,
    tansu_binary,
)
from sharedstream.engine.errors import SharedStreamError
from sharedstream.testing.harness import DeadLetter, Stream
from tests.kafka.conftest import KafkaHarness, demo_cli, demo_environment
from tests.kafka.demo_accounting import check_demo_outcome
from tests.sqs.conftest import sqs_endpoint  # noqa: F401 - moto's server serves S3 too

pytestmark = pytest.mark.slow

PARTITIONS = 3
RECORDS = 15_000
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_DEFAULT_REGION": "us-east-1"}


class Broker:
    """Tansu on S3 storage at a fixed port: stop it, start it again, same data."""

    def __init__(self, workdir: Path, endpoint: str) -> None:
        try:
            self.binary = tansu_binary()
        except SharedStreamError as exc:
            pytest.skip(str(exc))
        self.workdir = workdir
        self.bucket = f"tansu-{uuid.uuid4().hex[:10]}"
        boto3: Any = pytest.importorskip("boto3")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                     ).create_bucket(Bucket=self.bucket)
        self.env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT": endpoint,
                    "AWS_ALLOW_HTTP": "true"}
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> None:
        self.process, self.address = start_tansu(
            self.binary, self.workdir, storage=f"s3://{self.bucket}/", port=self.port,
            env=self.env)

    def stop(self) -> None:
        if self.process is not None:
            stop_tansu(self.process)

    def crash(self) -> None:
        """SIGKILL: no goodbye to the clients, nothing flushed on the way out."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def broker(tmp_path: Path, sqs_endpoint: str) -> Iterator[Broker]:  # noqa: F811 - the fixture
    broker = Broker(tmp_path, sqs_endpoint)
    broker.start()
    yield broker
    broker.stop()


def stored_events(database: Path) -> int:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1) as db:
            count: int = db.execute("SELECT count(*) FROM trigger_events").fetchone()[0]
            return count
    except sqlite3.Error:  # not created yet, or busy: ask again
        return 0


async def committed(harness: KafkaHarness, stream: Stream) -> dict[int, int]:
    return {p: await harness.committed(stream, p) for p in range(PARTITIONS)}


@pytest.mark.timeout(240)
async def test_a_broker_restart_loses_and_duplicates_nothing(
    broker: Broker, tmp_path: Path,
) -> None:
    name = f"restart-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=f"{name}.dlq", group=f"g-{name}")
    harness = KafkaHarness(broker.address)
    await harness.start()
    at: dict[tuple[int, int], int] = {}
    ends = dict.fromkeys(range(PARTITIONS), 0)
    process: subprocess.Popen[bytes] | None = None
    try:
        await harness.create_topics(stream.name, partitions=PARTITIONS)
        await harness.create_topics(stream.dead_letter or "")
        for start in range(0, RECORDS, 500):
            sent = []
            for index in range(start, min(start + 500, RECORDS)):
                key, value = demo_message(index)
                sent.append((index, await harness.client.send(
                    stream.name, value, key=key, partition=index % PARTITIONS)))
            for index, future in sent:
                meta = await future
                at[(meta.partition, meta.offset)] = index
                ends[meta.partition] = max(ends[meta.partition], meta.offset + 1)
        await harness.close()  # its connections would not survive the restart either

        cli = demo_cli(tmp_path, demo_environment(broker.address, stream))
        cli.run("init", "--path", str(cli.config))
        process = cli.start(0)
        database = cli.dir / "sharedstream.db"
        expected = sum(len(matching_assets(*demo_message(i))) for i in range(RECORDS))
        async with asyncio.timeout(60):  # the store is the quickest to ask how far it got
            while stored_events(database) < expected // 10:
                assert process.poll() is None, cli.log(0)[-2000:]
                await asyncio.sleep(0.01)
        at_restart = stored_events(database)
        broker.crash()  # mid-way through the backlog
        at_crash = stored_events(database)
        await asyncio.sleep(3)
        broker.start()
        harness = KafkaHarness(broker.address)
        await harness.start()
        try:
            async with asyncio.timeout(150):
                while await committed(harness, stream) != ends:
                    assert process.poll() is None, cli.log(0)[-2000:]
                    await asyncio.sleep(0.2)
        except TimeoutError:
            raise AssertionError(f"committed {await committed(harness, stream)} of {ends}; "
                                 f"log: {cli.log(0)[-2000:]}") from None
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0, cli.log(0)[-2000:]
        log = cli.log(0)
        context = (f"broker killed with {at_restart} of {expected} events stored "
                   f"({at_crash} once it was gone); log: {log[-1500:]}")
        assert at_restart < expected, f"the backlog was done before the restart: {context}"
        # Tansu's S3 engine was seen to lose the last dead letters it acknowledged before a
        # restart, so the dead-letter check is the triggerer's word (each one was acked).
        logged = re.findall(rf"dead-lettered source=({re.escape(name)}/\d+/\d+) ", log)
        letters = [DeadLetter(None, source, "rejected") for source in logged]
        check_demo_outcome(cli, name, at, letters, context)
        assert {d.source for d in await harness.dead_letters(stream)} <= set(logged), context
        assert "Traceback" not in log, log[-3000:]
        # The client library's complaints while the broker was away: said once, not per try.
        noisy = [line for line in log.splitlines() if "aiokafka" in line]
        assert noisy, "the outage went unnoticed in the log"
        assert len(noisy) <= 10, noisy
        assert any("the broker may be unreachable" in line for line in noisy), noisy
    finally:
        await harness.close()
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
