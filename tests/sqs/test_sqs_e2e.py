"""The real ``sharedstream triggerer`` on an SQS queue: SIGKILL mid-stream loses nothing.

Three watchers of ``sqs_defs.py`` share one receiver. The first triggerer
process is killed with SIGKILL while messages are in flight; a second one
takes over once their visibility lapses. Every matching (watcher, message)
pair must be stored exactly once and the DAG run exactly once per order.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.harness import Stream
from tests.cli import ROOT, TriggererCli
from tests.sqs.conftest import SqsHarness

TOTAL = 400
REGIONS = ("eu", "us", "apac")


def message(index: int) -> tuple[str, str]:
    """Message ``index`` as ``(region, body)``: JSON, except every 50th is malformed."""
    region = REGIONS[index % len(REGIONS)]
    if index % 50 == 49:
        return region, f"{{not json #{index}"
    kind = "refund" if index % 5 == 0 else "order"
    return region, json.dumps({"id": index, "kind": kind})


def assets_for(region: str, body: str) -> list[str]:
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    if doc["kind"] == "refund":
        return ["refunds"]
    return ["orders", "eu_orders"] if region == "eu" else ["orders"]


async def send(harness: SqsHarness, stream: Stream, indexes: range) -> dict[int, str]:
    """Send messages ``indexes`` (10 per call, 8 calls at once); their message ids."""
    ids: dict[int, str] = {}

    async def batch(chunk: range) -> None:
        entries = []
        for index in chunk:
            region, body = message(index)
            entries.append({"Id": str(index), "MessageBody": body, "MessageAttributes": {
                "region": {"DataType": "String", "StringValue": region}}})
        response = await harness.client.send_message_batch(QueueUrl=stream.name,
                                                           Entries=entries)
        assert not response.get("Failed"), response
        ids.update({int(ok["Id"]): ok["MessageId"] for ok in response["Successful"]})

    chunks = [indexes[i:i + 10] for i in range(0, len(indexes), 10)]
    for start in range(0, len(chunks), 8):
        await asyncio.gather(*(batch(chunk) for chunk in chunks[start:start + 8]))
    harness.sent.setdefault(stream.name, []).extend(ids[i] for i in indexes)
    return ids


def sqs_cli(workdir: Path, endpoint: str, stream: Stream) -> TriggererCli:
    """``sharedstream`` in ``workdir`` (initialised), its triggerers on ``sqs_defs.py``."""
    assert stream.dead_letter is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SQS_TEST_ENDPOINT": endpoint,
           "SQS_TEST_QUEUE": stream.name, "SQS_TEST_DLQ": stream.dead_letter,
           "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "10"}
    cli = TriggererCli(workdir, env, Path(__file__).with_name("sqs_defs.py"))
    cli.run("init", "--path", str(cli.config))
    return cli


async def wait_deleted(harness: SqsHarness, stream: Stream, at_least: int,
                       proc: subprocess.Popen[bytes], within: float) -> int:
    deadline = time.monotonic() + within
    while True:
        deleted = await harness.committed(stream)
        if deleted >= at_least:
            return deleted
        assert proc.poll() is None, "the triggerer exited"
        assert time.monotonic() < deadline, f"deleted {deleted} < {at_least}"
        await asyncio.sleep(0.1)


@pytest.mark.slow  # a SIGKILL chaos case (about 12 s): the slow CI step
@pytest.mark.timeout(240)
async def test_sigkill_mid_stream_loses_and_duplicates_nothing(
    sqs_endpoint: str, tmp_path: Path,
) -> None:
    harness = SqsHarness(sqs_endpoint, fifo=False)
    await harness.start()
    try:
        stream = await harness.create_stream()
        cli = sqs_cli(tmp_path, sqs_endpoint, stream)
        ids = await send(harness, stream, range(TOTAL // 2))
        first = cli.start(0)
        try:
            await wait_deleted(harness, stream, 60, first, within=60)
            ids |= await send(harness, stream, range(TOTAL // 2, TOTAL))
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        at_kill = await harness.committed(stream)
        assert 0 < at_kill < TOTAL, at_kill

        second = cli.start(1)
        try:
            await wait_deleted(harness, stream, TOTAL, second, within=120)
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0, cli.log(1)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()

        events: list[dict[str, Any]] = json.loads(
            cli.run("events", "list", "--json", "--limit", "100000"))
        stored = Counter((asset, e["payload"]["message_id"]) for e in events
                         for asset in e["assets"])
        wanted = Counter((asset, ids[i]) for i in range(TOTAL)
                         for asset in assets_for(*message(i)))
        assert stored == wanted  # every matching (watcher, message) exactly once
        ship = json.loads(cli.run("runs", "list", "--json", "--dag", "ship", "--limit",
                                  "100000"))
        assert len(ship) == sum(1 for asset, _ in wanted if asset == "orders")
        malformed = {ids[i] for i in range(TOTAL) if not assets_for(*message(i))}
        letters = await harness.dead_letters(stream)
        assert {letter.source for letter in letters} == malformed
        assert {letter.reason for letter in letters} == {"rejected"}
    finally:
        await harness.close()


@pytest.mark.timeout(60)
async def test_a_queue_that_does_not_exist_is_one_line_and_a_non_zero_exit(
    sqs_endpoint: str, tmp_path: Path,
) -> None:
    """Restarting cannot create the queue: the triggers are marked failed, the process exits 1."""
    harness = SqsHarness(sqs_endpoint, fifo=False)
    await harness.start()
    try:
        stream = await harness.create_stream()
        missing = Stream(name=stream.name.rsplit("/", 1)[0] + "/no-such-queue",
                         dead_letter=stream.dead_letter, group=stream.group)
        cli = sqs_cli(tmp_path, sqs_endpoint, missing)
        process = cli.start(0)
        try:
            code = await asyncio.to_thread(process.wait, 30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        log = cli.log(0)
        assert code == 1, log[-2000:]
        naming = [line for line in log.splitlines() if "no-such-queue" in line]
        assert len(naming) == 1, naming
        assert "queue does not exist" in naming[0]
        assert "Traceback" not in log
        failed = [t for t in json.loads(cli.run("triggers", "list", "--json"))
                  if t["state"] == "failed"]
        assert failed
        assert all("queue does not exist" in t["last_error"] for t in failed)
    finally:
        await harness.close()
