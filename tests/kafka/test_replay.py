"""Replaying a Kafka stream for one watcher (issue 33), through the CLI, a triggerer and Tansu.

A watcher added after its stream was read (``late/all``) catches up: the
replay feeds it the records the live consumer had committed past, and only
it - the other watcher stores nothing new, the group's committed offsets do
not move, and one DAG run per new event appears for the late watcher. A
second replay of the same records stores nothing (same idempotency keys as
live). Offsets as well as times start a replay.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.harness import Stream
from tests.cli import TriggererCli
from tests.kafka.conftest import KafkaHarness

aiokafka: Any = pytest.importorskip("aiokafka")

DEFINITIONS = Path(__file__).with_name("replay_defs.py")
ROOT = Path(__file__).resolve().parents[2]
EARLY = 30  # records read before the late watcher exists: ids 0..29, partitions 0 and 1
LIVE = 10  # records sent once it exists: ids 30..39


def events_by_asset(database: Path) -> dict[str, int]:
    """Stored asset events per asset."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
        return dict(db.execute(
            "SELECT a.name, count(*) FROM asset_events e JOIN assets a ON a.id = e.asset_id"
            " GROUP BY a.name").fetchall())


def runs_by_dag(database: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
        return dict(db.execute("SELECT dag_id, count(*) FROM dag_runs GROUP BY dag_id"))


async def send(harness: KafkaHarness, topic: str, ids: range) -> None:
    for i in ids:
        await harness.client.send_and_wait(topic, json.dumps({"id": i}).encode(),
                                           partition=i % 2)


async def committed(harness: KafkaHarness, stream: Stream) -> int:
    return sum([await harness.committed(stream, p) for p in (0, 1)])


def cli_for(workdir: Path, harness: KafkaHarness, stream: Stream, *, late: bool) -> TriggererCli:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAY_BOOTSTRAP": harness.bootstrap,
           "REPLAY_TOPIC": stream.name, "REPLAY_GROUP": stream.group,
           "REPLAY_LATE": "1" if late else "0",
           "SHAREDSTREAM__DISPATCH__ENABLED": "false"}
    return TriggererCli(workdir, env, DEFINITIONS)


def replay(cli: TriggererCli, *args: str) -> subprocess.CompletedProcess[str]:
    """``sharedstream watchers replay ...``, followed to its end."""
    return subprocess.run(
        [sys.executable, "-m", "sharedstream", "--config", str(cli.config), "watchers",
         "replay", *args], cwd=cli.dir, env=cli.env, capture_output=True, text=True,
        timeout=90, check=False)


@pytest.mark.timeout(240)
async def test_a_watcher_added_late_catches_up_and_nothing_else_changes(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    name = f"replay-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=None, group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=2)
    early = cli_for(tmp_path, harness, stream, late=False)
    early.run("init", "--path", str(early.config))
    database = tmp_path / "sharedstream.db"

    await send(harness, stream.name, range(EARLY))
    with early.running(0) as process:
        async def read() -> bool:
            return (await committed(harness, stream) == EARLY
                    and events_by_asset(database).get("orders") == EARLY)
        await early.until(0, process, read)

    late = cli_for(tmp_path, harness, stream, late=True)
    with late.running(1, log_level="INFO") as process:
        await send(harness, stream.name, range(EARLY, EARLY + LIVE))

        async def live() -> bool:
            return (await committed(harness, stream) == EARLY + LIVE
                    and events_by_asset(database) == {"orders": EARLY + LIVE, "late": LIVE // 2})
        await late.until(1, process, live)

        result = await asyncio.to_thread(replay, late, "late/all", "--from", "1d")
        assert result.returncode == 0, (result.stdout, result.stderr, late.log(1))
        last = result.stdout.strip().splitlines()[-1]
        # up to the group's commits: the 30 it missed and the 10 it saw live (stored already)
        assert last == ("replay 1 (late/all): done, 40 of 40 messages (100%), 15 new events, "
                        "5 already stored"), result.stdout
        assert events_by_asset(database) == {"orders": EARLY + LIVE,
                                             "late": (EARLY + LIVE) // 2}
        assert runs_by_dag(database) == {"on_orders": EARLY + LIVE,
                                         "on_late": (EARLY + LIVE) // 2}
        assert await committed(harness, stream) == EARLY + LIVE, "the group's offsets stay"

        ambiguous = await asyncio.to_thread(replay, late, "all", "--from", "0:0")
        assert (ambiguous.returncode, ambiguous.stderr) == (
            2, "sharedstream: error: watcher 'all' is ambiguous: say which, late/all or "
               "orders/all\n")
        again = await asyncio.to_thread(replay, late, "late/all", "--from", "0:0,1:5")
        assert again.returncode == 0, (again.stdout, again.stderr)
        # partition 0 (even ids: all 20 match) from 0, partition 1 (odd: none) from 5
        assert again.stdout.strip().splitlines()[-1] == (
            "replay 2 (late/all): done, 35 of 35 messages (100%), 0 new events, "
            "20 already stored"), again.stdout
        assert events_by_asset(database)["late"] == (EARLY + LIVE) // 2
        assert "replay done" in late.log(1)
    listing = late.run("watchers", "replays", "--json")
    assert [(r["id"], r["state"], r["new_events"]) for r in json.loads(listing)] == [
        (2, "done", 0), (1, "done", 15)]
