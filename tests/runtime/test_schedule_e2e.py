"""A real triggerer process runs a time-scheduled DAG: its runs reach the store and the CLI, in
order, and a SIGKILL + restart neither queues a run twice nor misses one (catch-up)."""

from __future__ import annotations

import re
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import Deployment, wait_for

DEFS = Path(__file__).with_name("schedule_defs.py")


def tick_runs(d: Deployment) -> list[dict[str, str]]:
    runs = d.json("runs", "list", "--dag", "tick", "--limit", "100000")
    return list(reversed(runs))


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
def test_scheduled_runs_survive_a_sigkill_without_duplicates_or_gaps(
        deployment: Deployment) -> None:
    d = deployment
    start = (datetime.now(UTC) - timedelta(seconds=5)).replace(microsecond=0)
    d.env["SCHEDULE_START"] = start.isoformat()
    d.env["SHAREDSTREAM__SCHEDULER__MAX_CATCHUP_RUNS_PER_LOOP"] = "2"
    proc = d.start(DEFS)
    wait_for(lambda: len(tick_runs(d)) >= 8, what="8 runs of tick")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    killed_at = datetime.now(UTC)
    proc = d.start(DEFS)
    wait_for(lambda: datetime.fromisoformat(tick_runs(d)[-1]["logical_date"])
             >= killed_at + timedelta(seconds=2), what="runs past the restart")
    assert d.stop(proc) == 0

    runs = tick_runs(d)
    dates = [datetime.fromisoformat(r["logical_date"]) for r in runs]
    assert dates == [start + timedelta(seconds=n) for n in range(len(runs))]  # no gap, no twice
    assert [r["run_id"] for r in runs] == [f"scheduled__{x.isoformat()}" for x in dates]
    assert {r["run_type"] for r in runs} == {"scheduled"}
    assert all(r["data_interval_start"] == r["logical_date"] == r["run_after"] for r in runs)
    assert "queued scheduled runs dag_id=tick count=2 " in d.stderr(0)  # the catch-up bound
    # The stop summary counts the scheduled runs the restarted process queued.
    summary = re.search(r"stopped .*\bdag_runs=(\d+)", d.stderr(1))
    assert summary is not None
    assert int(summary[1]) >= 2

    dags = {dag["dag_id"]: dag for dag in d.json("dags", "list")}
    assert dags["tick"]["schedule"] == "0:00:01"
    assert dags["tick"]["catchup"] is True
    assert dags["tick"]["last_run"] == runs[-1]["run_id"]
    assert dags["never"]["schedule"] == "None"
    assert dags["never"]["next_run"] is None
    upcoming = d.json("dags", "next-runs", "tick", "-n", "3")
    assert [datetime.fromisoformat(r["logical_date"]) for r in upcoming] == [
        dates[-1] + timedelta(seconds=n) for n in (1, 2, 3)]
    table = d.cli("dags", "next-runs", "tick", "-n", "2").stdout
    assert table.startswith("next runs of tick (0:00:01), from the store's bookkeeping\n")


HYBRID = """
import os
from datetime import datetime, timedelta

from sharedstream.definitions import Dag
from sharedstream.timetables.assets import AssetOrTimeSchedule
from sharedstream.timetables.trigger import DeltaTriggerTimetable
from tests.runtime.filelog_defs import orders

Dag("hybrid", schedule=AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(timedelta(seconds=1)), assets=orders),
    start_date=datetime.fromisoformat(os.environ["SCHEDULE_START"]), catchup=True)
"""


def test_an_asset_or_time_dag_runs_on_both_each_once(deployment: Deployment) -> None:
    d = deployment
    start = (datetime.now(UTC) - timedelta(seconds=2)).replace(microsecond=0)
    d.env["SCHEDULE_START"] = start.isoformat()
    defs = d.dir / "hybrid_defs.py"
    defs.write_text(HYBRID)
    proc = d.start(defs)

    def hybrid() -> list[dict[str, Any]]:
        return list(reversed(d.json("runs", "list", "--dag", "hybrid", "--limit", "1000")))

    wait_for(lambda: len(hybrid()) >= 3, what="3 scheduled runs of hybrid")
    d.append({"kind": "order", "amount": 50}, {"kind": "refund", "amount": 5})
    wait_for(lambda: d.committed() == 1, what="both messages committed")
    wait_for(lambda: datetime.fromisoformat(
        next(r for r in reversed(hybrid()) if r["run_type"] == "scheduled")["logical_date"])
        > datetime.now(UTC) - timedelta(seconds=1), what="the time side going on")
    assert d.stop(proc) == 0
    runs = hybrid()
    by_asset = [r for r in runs if r["run_type"] == "asset_triggered"]
    assert [r["assets"] for r in by_asset] == [["orders"]]  # the order, once; not the refund
    assert by_asset[0]["logical_date"] is None
    timed = [datetime.fromisoformat(r["logical_date"]) for r in runs
             if r["run_type"] == "scheduled"]
    assert timed == [start + timedelta(seconds=n) for n in range(len(timed))]
    [listed] = [dag for dag in d.json("dags", "list") if dag["dag_id"] == "hybrid"]
    assert listed["schedule"] == "Asset or 0:00:01"
