"""``sharedstream demo`` end to end, and a SIGKILLed triggerer losing and duplicating nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sharedstream.demo import demo_message, expected_counts, matching_assets
from sharedstream.testing.harness import Stream
from tests.demo_accounting import check_demo_run, check_interrupted_demo, run_demo_cli
from tests.kafka.conftest import KafkaHarness, demo_cli, demo_environment

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 3000


@pytest.mark.usefixtures("kafka_bootstrap")  # skips, with the install hint, without a broker
def test_demo_runs_to_completion_with_the_expected_counts() -> None:
    started = time.monotonic()
    result = run_demo_cli("--messages", "300")
    assert time.monotonic() - started < 60
    check_demo_run(result, "kafka", 300)


def test_an_unknown_broker_is_one_line_listing_the_valid_ones() -> None:
    result = run_demo_cli("--broker", "sqs", "--messages", "5", timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "sharedstream: error: --broker 'sqs': the demo runs on kafka, pubsub, servicebus "
        "only for now"]


@pytest.mark.parametrize(("keep", "error"), [
    ("/etc/passwd", "--keep /etc/passwd: not a directory (give a new or empty one)"),
    ("full", "--keep {tmp}/full is not empty (give a new or empty directory)"),
    ("/etc/passwd/sub", "--keep /etc/passwd/sub: cannot create it: Not a directory"),
])
def test_a_bad_keep_directory_is_one_line(tmp_path: Path, keep: str, error: str) -> None:
    """``--keep`` takes a new or empty directory; anything else is refused before it starts."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    result = run_demo_cli("--keep", keep if keep.startswith("/") else str(tmp_path / keep),
                          "--messages", "5", timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"sharedstream: error: {error.format(tmp=tmp_path)}"]
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["full"]


@pytest.mark.usefixtures("kafka_bootstrap")
@pytest.mark.parametrize("signals", [1, 2])
def test_an_interrupted_demo_stops_its_broker_and_cleans_up(signals: int) -> None:
    """Ctrl-C (once: a graceful stop; twice: at once) always exits 130, stops the broker
    it started, removes its temp directory and prints no traceback."""
    check_interrupted_demo(
        "kafka", signals,
        started=r"tansu on (?P<host>[\d.]+):(?P<port>\d+);.* working in (?P<workdir>\S+)",
        progress=r"consumed and committed +[1-9]")


async def _wait_committed(harness: KafkaHarness, stream: Stream, at_least: int,
                          proc: subprocess.Popen[bytes], within: float) -> int:
    deadline = time.monotonic() + within
    while True:
        committed = await harness.committed(stream)
        if committed >= at_least:
            return committed
        assert proc.poll() is None, "the triggerer exited"
        assert time.monotonic() < deadline, f"committed {committed} < {at_least}"
        await asyncio.sleep(0.05)


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_sigkill_mid_stream_loses_and_duplicates_nothing(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    stream = await harness.create_stream()
    cli = demo_cli(tmp_path, demo_environment(harness.bootstrap, stream))
    cli.run("init", "--path", str(cli.config))
    first = cli.start(0)
    try:
        records = [demo_message(i) for i in range(TOTAL)]
        sends = [await harness.client.send(stream.name, value, key=key, partition=0)
                 for key, value in records[: TOTAL // 2]]
        await asyncio.gather(*sends)
        await _wait_committed(harness, stream, 200, first, within=60)
        sends = [await harness.client.send(stream.name, value, key=key, partition=0)
                 for key, value in records[TOTAL // 2:]]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        await asyncio.gather(*sends)
        at_kill = await harness.committed(stream)
        assert 0 < at_kill < TOTAL, at_kill

        second = cli.start(1)
        try:
            await _wait_committed(harness, stream, TOTAL, second, within=90)
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

    events: list[dict[str, Any]] = json.loads(
        cli.run("events", "list", "--json", "--limit", "100000"))
    stored = Counter((asset, e["payload"]["offset"]) for e in events for asset in e["assets"])
    wanted = Counter((asset, offset) for offset, record in enumerate(records)
                     for asset in matching_assets(*record))
    assert stored == wanted  # every matching (watcher, message) exactly once
    assert len(events) == sum(wanted.values())

    ship = json.loads(cli.run("runs", "list", "--json", "--dag", "ship", "--limit", "100000"))
    orders = sum(1 for asset, _ in wanted if asset == "orders")
    assert len(ship) == orders  # one run per order event
    consumed = [event for run in ship for event in run["asset_events"]]
    assert all(len(run["asset_events"]) == 1 for run in ship)
    assert len(set(consumed)) == orders

    dead = await harness.dead_letters(stream)
    assert len(dead) >= expected_counts(TOTAL).dead_lettered  # redelivery may repeat some
    assert {letter.source for letter in dead} == {
        f"{stream.name}/0/{i}" for i in range(TOTAL) if not matching_assets(*records[i])
    }


def test_generator_is_deterministic() -> None:
    assert [demo_message(i) for i in range(100)] == [demo_message(i) for i in range(100)]
    assert expected_counts(100).dead_lettered == 2
