"""``sharedstream dags list`` and ``dags next-runs`` in process, on a store file the schedule loop
has worked on (frozen clock), and ``runs list`` showing time-based runs' dates."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.cli import main
from sharedstream.runtime.cli_output import time_text
from sharedstream.runtime.definitions import load_definitions, timetable_registry
from sharedstream.runtime.schedule_loop import ScheduleLoop, dag_specs
from sharedstream.store import SqliteStore, TriggerSpec, WatcherSpec

NOW = datetime(2026, 3, 2, 3, 30, tzinfo=UTC)

DEFS = """
from datetime import UTC, datetime
from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.timetables.base import DagRunInfo, Timetable

class Watch(BaseEventTrigger):
    def serialize(self):
        return f"{type(self).__module__}.Watch", {}
    async def run(self):
        yield TriggerEvent(None)

class Noon(Timetable):
    summary = "every day at noon"
    def next_dagrun_info(self, *, last_automated_data_interval, restriction):
        day = (last_automated_data_interval.end.date().toordinal() + 1
               if last_automated_data_interval else restriction.earliest.date().toordinal())
        at = datetime.fromordinal(day).replace(hour=12, tzinfo=UTC)
        return DagRunInfo.exact(at)

Dag("hourly", schedule="0 * * * *", start_date=datetime(2026, 3, 2, tzinfo=UTC), catchup=True)
Dag("noon", schedule=Noon(), start_date=datetime(2026, 3, 2, tzinfo=UTC))
orders = Asset("orders", watchers=[AssetWatcher("w", trigger=Watch())])
refunds = Asset("refunds", watchers=[AssetWatcher("w", trigger=Watch())])
Dag("ship", schedule=orders & refunds)
Dag("manual", schedule=None)
"""


async def direct(fn: Any, *args: Any) -> Any:
    return fn(*args)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "meta.db"
    (tmp_path / "dags_cli_defs.py").write_text(DEFS)
    defs = load_definitions(tmp_path / "dags_cli_defs.py")
    with SqliteStore(db) as store:
        store.migrate()
        store.sync_definitions(
            [TriggerSpec("fp", "pkg.T", b"kw")],
            [WatcherSpec("orders", "w", "fp"), WatcherSpec("refunds", "w", "fp")],
            dag_specs(defs))
        loop = ScheduleLoop(store, direct, timetable_registry(defs.timetable_classes),
                            clock=lambda: NOW)
        asyncio.run(loop.run_once())
    monkeypatch.setenv("SHAREDSTREAM__STORE__URL", f"sqlite:///{db}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_dags_list(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "dags", "list", "--json")
    assert code == 0
    dags = {d["dag_id"]: d for d in json.loads(out)}
    assert list(dags) == ["hourly", "manual", "noon", "ship"]
    hourly = dags["hourly"]
    assert (hourly["schedule"], hourly["catchup"], hourly["next_run"]) == (
        "0 * * * *", True, "2026-03-02T04:00:00+00:00")
    assert hourly["last_run"] == "scheduled__2026-03-02T03:00:00+00:00"
    assert dags["ship"]["schedule"] == "assets: orders & refunds"
    assert dags["manual"]["schedule"] == "None"
    # noon's class is the definitions file's: unregistered for the CLI, but planned by the loop
    assert dags["noon"]["schedule"] == "every day at noon"
    assert dags["noon"]["next_run"] == "2026-03-02T12:00:00+00:00"
    code, table, _ = cli(capsys, "dags", "list")
    assert table.splitlines()[0].split() == [
        "DAG_ID", "SCHEDULE", "TARGET", "PAUSED", "NEXT_RUN", "CATCHUP", "LAST_RUN",
        "LAST_RUN_AT"]
    assert "0 * * * *" in table.splitlines()[1]


def test_next_runs_from_the_stores_bookkeeping(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "dags", "next-runs", "hourly", "-n", "3", "--json")
    assert code == 0
    assert [r["logical_date"] for r in json.loads(out)] == [
        f"2026-03-02T0{h}:00:00+00:00" for h in (4, 5, 6)]
    assert json.loads(out)[0]["run_id"] == "scheduled__2026-03-02T04:00:00+00:00"
    code, out, _ = cli(capsys, "dags", "next-runs", "hourly", "-n", "1")
    assert out.splitlines()[0] == (
        "next runs of hourly (0 * * * *), from the store's bookkeeping")
    assert out.splitlines()[1].split() == [
        "LOGICAL_DATE", "DATA_INTERVAL_START", "DATA_INTERVAL_END", "RUN_AFTER", "RUN_ID"]


def test_next_runs_of_a_file_class_need_the_file(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "dags", "next-runs", "noon")
    assert code == 2
    assert "refusing to rebuild timetable class" in err
    assert err.count("\n") == 1
    code, out, _ = cli(capsys, "dags", "next-runs", "noon", "-n", "2", "--json",
                       "--definitions", "dags_cli_defs.py")
    assert code == 0
    assert [r["run_after"] for r in json.loads(out)] == [
        "2026-03-02T12:00:00+00:00", "2026-03-03T12:00:00+00:00"]


def test_definitions_given_twice_and_as_a_folder_are_all_read(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31, item 3: a second ``--definitions`` adds to the first (it used to replace
    it), and a folder gives its files, like Airflow's DAGs folder."""
    (workdir / "more").mkdir()
    (workdir / "more" / "later.py").write_text(
        "from datetime import UTC, datetime\n"
        "from sharedstream.definitions import Dag\n"
        'Dag("later", schedule="@daily", start_date=datetime(2026, 3, 2, tzinfo=UTC))\n')
    given = ("--definitions", "dags_cli_defs.py", "--definitions", "more")
    code, out, _ = cli(capsys, "dags", "next-runs", "noon", "-n", "1", "--json", *given)
    assert (code, json.loads(out)[0]["run_after"]) == (0, "2026-03-02T12:00:00+00:00")
    code, out, _ = cli(capsys, "dags", "next-runs", "later", "-n", "1", *given)
    assert code == 0
    assert out.splitlines()[0] == (
        f"next runs of later (0 0 * * *), from {workdir / 'dags_cli_defs.py'}, {workdir / 'more'}"
        " (not in the store yet: no run queued so far)")


def test_next_runs_of_unknown_and_asset_dags(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "dags", "next-runs", "nope")
    assert (code, err) == (2, "sharedstream: error: no DAG 'nope' in the store (it has the DAGs "
                           "of a triggerer that started; to read a definitions file or folder "
                           "instead, pass --definitions PATH)\n")
    code, out, _ = cli(capsys, "dags", "next-runs", "ship")
    assert (code, out) == (
        0, "DAG 'ship' is not scheduled on time (assets: orders & refunds)\n(none)\n")


def test_runs_list_shows_the_dates_of_time_based_runs(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = cli(capsys, "runs", "list", "--dag", "hourly", "--json")
    newest = json.loads(out)[0]
    assert (newest["run_type"], newest["logical_date"], newest["data_interval_end"],
            newest["run_after"]) == ("scheduled", "2026-03-02T03:00:00+00:00",
                                     "2026-03-02T03:00:00+00:00", "2026-03-02T03:00:00+00:00")
    _, table, _ = cli(capsys, "runs", "list")
    assert table.splitlines()[0].split() == [
        "DAG_ID", "RUN_ID", "STATE", "CREATED_AT", "LOGICAL_DATE", "DATA_INTERVAL_START",
        "DATA_INTERVAL_END", "ASSETS", "TARGET", "ATTEMPTS", "LAST_ERROR"]


def test_tables_say_their_times_are_utc(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31, item 12: a table's times say their zone, in the one format of ``time_text``."""
    _, out, _ = cli(capsys, "dags", "next-runs", "hourly", "-n", "1")
    row = out.splitlines()[2]
    assert row.startswith("2026-03-02 04:00:00 UTC  2026-03-02 04:00:00 UTC  ")
    assert row.count(" UTC") == 4  # logical date, interval start and end, run after
    _, table, _ = cli(capsys, "runs", "list", "--dag", "hourly")
    created = json.loads(cli(capsys, "runs", "list", "--dag", "hourly", "--json")[1])[0]
    assert time_text(created["created_at"]) in table.splitlines()[1]
    assert "2026-03-02 03:00:00 UTC" in table.splitlines()[1]  # the logical date
    run_id = created["run_id"]
    _, shown, _ = cli(capsys, "runs", "show", "hourly", run_id)
    assert "logical_date:   2026-03-02 03:00:00 UTC" in shown.splitlines()
    assert created["created_at"].endswith("+00:00")  # JSON: ISO 8601 with its offset


def test_a_timedelta_schedule_runs_at_its_start_date_plus_whole_deltas(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31, item 12: run ids of a timedelta DAG are start_date + k * delta, not now."""
    (workdir / "every7m.py").write_text(
        "from datetime import UTC, datetime, timedelta\n"
        "from sharedstream.definitions import Dag\n"
        'Dag("every7m", schedule=timedelta(minutes=7),\n'
        "    start_date=datetime(2026, 1, 1, 0, 3, 30, tzinfo=UTC))\n")
    code, out, _ = cli(capsys, "dags", "next-runs", "every7m", "-n", "3", "--json",
                       "--definitions", "every7m.py")
    assert code == 0
    start, step = datetime(2026, 1, 1, 0, 3, 30, tzinfo=UTC), timedelta(minutes=7)
    runs = json.loads(out)
    for run in runs:
        logical = datetime.fromisoformat(run["logical_date"])
        assert (logical - start) % step == timedelta(0), run
        assert run["run_id"] == f"scheduled__{logical.isoformat()}"
    first = datetime.fromisoformat(runs[0]["logical_date"])
    assert timedelta(0) <= datetime.now(UTC) - first < step  # the latest point, at once
    assert [datetime.fromisoformat(r["logical_date"]) - first for r in runs] == [
        timedelta(0), step, 2 * step]
