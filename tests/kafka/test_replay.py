"""Replaying a Kafka stream for one watcher (issue 33), through the CLI, a triggerer and Tansu.

A watcher added after its stream was read (``late/all``) catches up: the
replay feeds it the records the live consumer had committed past, and only
it - the other watcher stores nothing new, the group's committed offsets do
not move, and one DAG run per new event appears for the late watcher. A
second replay of the same records stores nothing (same idempotency keys as
live). Offsets as well as times start a replay. The SIGKILL mid-replay and
the replay beside live traffic are marked slow (the slow CI step runs them).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from datetime import UTC, datetime
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


def cli_for(workdir: Path, harness: KafkaHarness, stream: Stream, *, late: bool,
            delay: float = 0.0) -> TriggererCli:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAY_BOOTSTRAP": harness.bootstrap,
           "REPLAY_TOPIC": stream.name, "REPLAY_GROUP": stream.group,
           "REPLAY_LATE": "1" if late else "0", "REPLAY_DELAY": str(delay),
           "SHAREDSTREAM__DISPATCH__ENABLED": "false"}
    return TriggererCli(workdir, env, DEFINITIONS)


def replay(cli: TriggererCli, *args: str) -> subprocess.CompletedProcess[str]:
    """``sharedstream watchers replay ...``, followed to its end."""
    return subprocess.run(
        [sys.executable, "-m", "sharedstream", "--config", str(cli.config), "watchers",
         "replay", *args], cwd=cli.dir, env=cli.env, capture_output=True, text=True,
        timeout=90, check=False)


async def read_early_records(harness: KafkaHarness, tmp_path: Path, count: int
                             ) -> tuple[Stream, Path]:
    """A 2-partition topic whose ``count`` records the early definitions stored; the database."""
    name = f"replay-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=None, group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=2)
    early = cli_for(tmp_path, harness, stream, late=False)
    early.run("init", "--path", str(early.config))
    database = tmp_path / "sharedstream.db"
    await send(harness, stream.name, range(count))
    with early.running(0) as process:
        async def read() -> bool:
            return (await committed(harness, stream) == count
                    and events_by_asset(database).get("orders") == count)
        await early.until(0, process, read)
    return stream, database


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(240)
async def test_a_watcher_added_late_catches_up_and_nothing_else_changes(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    stream, database = await read_early_records(harness, tmp_path, EARLY)
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
    watchers = json.loads(late.run("watchers", "list", "--json"))
    assert [(w["watcher"], w["events"], w["replay"]) for w in watchers] == [
        ("orders/all", EARLY + LIVE, None), ("late/all", (EARLY + LIVE) // 2, None)]
    listing = late.run("watchers", "replays", "--json")
    assert [(r["id"], r["state"], r["new_events"]) for r in json.loads(listing)] == [
        (2, "done", 0), (1, "done", 15)]


def replay_row(database: Path, replay_id: int) -> tuple[str, int, int | None, int]:
    """``(state, done, total, stored)`` of a replay, read from the SQLite file."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
        ((state, done, total, stored),) = db.execute(
            "SELECT state, done, total, stored FROM replays WHERE id = ?", (replay_id,)).fetchall()
    return str(state), int(done), None if total is None else int(total), int(stored)


@pytest.mark.slow  # chaos-like (a SIGKILL, or live traffic beside): the slow CI step
@pytest.mark.timeout(240)
async def test_a_replay_killed_midway_resumes_where_it_was_and_stores_each_event_once(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    records = 200  # 100 match the late watcher, 50 ms each: about 5 s of replay
    stream, database = await read_early_records(harness, tmp_path, records)
    late = cli_for(tmp_path, harness, stream, late=True, delay=0.05)
    first = late.start(1, log_level="INFO")
    try:
        await asyncio.to_thread(late.wait_for_log, 1, "definitions registered")
        asked = late.run("watchers", "replay", "late/all", "--from", "0:0,1:0", "--detach")
        assert asked.startswith("replay 1 of late/all asked for (offsets {'"), asked

        async def midway() -> bool:
            state, _done, total, stored = replay_row(database, 1)
            return state == "running" and total == records and 20 <= stored < 90
        await late.until(1, first, midway)
    finally:
        first.kill()
        first.wait()
    state, _, _, stored = replay_row(database, 1)
    assert state == "running", "killed mid-replay"
    assert stored < records // 2, "killed mid-replay"
    with late.running(2, log_level="INFO") as second:
        async def finished() -> bool:
            return replay_row(database, 1)[0] == "done"
        await late.until(2, second, finished, within=60)
        assert "replay resumed" in late.log(2)
    _, done, total, stored = replay_row(database, 1)
    assert (done, total) == (records, records)
    assert events_by_asset(database) == {"orders": records, "late": records // 2}
    assert runs_by_dag(database) == {"on_orders": records, "on_late": records // 2}
    assert await committed(harness, stream) == records


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(240)
async def test_a_cancelled_replay_stops_and_a_second_replay_of_a_watcher_is_refused(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    records = 200
    stream, database = await read_early_records(harness, tmp_path, records)
    late = cli_for(tmp_path, harness, stream, late=True, delay=0.05)
    with late.running(1, log_level="INFO") as process:
        await asyncio.to_thread(late.wait_for_log, 1, "definitions registered")
        late.run("watchers", "replay", "late/all", "--from", "1d", "--detach")
        follower = await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, "-m", "sharedstream", "--config", str(late.config), "watchers",
             "replay", "late/all", "--from", "1d"], cwd=late.dir, env=late.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, refused = await asyncio.to_thread(follower.communicate, timeout=60)
        assert follower.returncode == 2
        assert refused == ("sharedstream: error: watcher 'late/all' already has replay 1 "
                           "(pending); wait for it or cancel it: sharedstream watchers "
                           "cancel-replay 1\n") or "(running)" in refused, refused

        async def running() -> bool:
            return replay_row(database, 1)[3] >= 10
        await late.until(1, process, running)
        said = late.run("watchers", "cancel-replay", "1")
        assert said.startswith("replay 1 of late/all: asked its triggerer to stop it"), said

        async def cancelled() -> bool:
            return replay_row(database, 1)[0] == "cancelled"
        await late.until(1, process, cancelled, within=30)
        _state, done, total, stored = replay_row(database, 1)
        assert total == records
        assert done < records
        assert stored < records // 2
        assert events_by_asset(database)["late"] == stored
        assert "replay cancelled" in late.log(1)


@pytest.mark.slow  # chaos-like (a SIGKILL, or live traffic beside): the slow CI step
@pytest.mark.timeout(240)
async def test_a_replay_beside_live_traffic_skips_nothing_and_stores_nothing_twice(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    records, live = 200, 60  # the replay takes ~3 s (100 events, 30 ms each); live sends meanwhile
    stream, database = await read_early_records(harness, tmp_path, records)
    late = cli_for(tmp_path, harness, stream, late=True, delay=0.03)
    with late.running(1, log_level="INFO") as process:
        await asyncio.to_thread(late.wait_for_log, 1, "definitions registered")
        follower = asyncio.create_task(asyncio.to_thread(replay, late, "late/all", "--from", "1d"))

        async def planned() -> bool:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
                row = db.execute("SELECT total FROM replays WHERE id = 1").fetchone()
            return row is not None and row[0] is not None
        await late.until(1, process, planned)
        for i in range(records, records + live, 10):  # while the replay runs
            await send(harness, stream.name, range(i, i + 10))
            await asyncio.sleep(0.1)
        assert replay_row(database, 1)[0] == "running", "live traffic came during the replay"
        result = await follower
        assert result.returncode == 0, (result.stdout, result.stderr, late.log(1))
        assert replay_row(database, 1)[2] == records, "planned up to the commits of then"

        async def all_in() -> bool:
            return (await committed(harness, stream) == records + live
                    and events_by_asset(database) == {"orders": records + live,
                                                      "late": (records + live) // 2})
        await late.until(1, process, all_in)
        await asyncio.sleep(1.0)  # anything stored twice would show up meanwhile
    assert events_by_asset(database) == {"orders": records + live, "late": (records + live) // 2}
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        keys = [key for (key,) in db.execute("SELECT idem_key FROM trigger_events")]
    assert len(keys) == len(set(keys)) == records + live + (records + live) // 2


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(240)
async def test_to_bounds_a_replay_by_the_records_time(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    name = f"replay-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=None, group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=2)
    early = cli_for(tmp_path, harness, stream, late=False)
    early.run("init", "--path", str(early.config))
    database = tmp_path / "sharedstream.db"
    await send(harness, stream.name, range(10))
    await asyncio.sleep(1.2)
    cut = datetime.now(UTC)
    await asyncio.sleep(1.2)
    await send(harness, stream.name, range(10, 20))
    with early.running(0) as process:
        async def read() -> bool:
            return events_by_asset(database).get("orders") == 20
        await early.until(0, process, read)
    late = cli_for(tmp_path, harness, stream, late=True)
    with late.running(1, log_level="INFO"):
        await asyncio.to_thread(late.wait_for_log, 1, "definitions registered")
        result = await asyncio.to_thread(replay, late, "late/all", "--from", "1d",
                                         "--to", cut.isoformat())
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.strip().splitlines()[-1] == (
        "replay 1 (late/all): done, 10 of 10 messages (100%), 5 new events"), result.stdout
    assert events_by_asset(database) == {"orders": 20, "late": 5}
