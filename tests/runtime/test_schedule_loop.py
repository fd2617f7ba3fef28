"""The schedule loop on a real SQLite file with an injected clock (no waiting): the runs it queues,
catch-up on and off, its bound, start/end dates, a restart in the middle of a schedule, a failing
timetable, and asset-or-time DAGs (each side queues its own run, once per trigger)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest

from sharedstream.runtime.definitions import Asset, Dag, Definitions, timetable_registry
from sharedstream.runtime.schedule_loop import ScheduleLoop, dag_specs
from sharedstream.store import PendingEvent, SqliteStore, StoreError, TriggerSpec, WatcherSpec
from sharedstream.timetables.assets import AssetOrTimeSchedule
from sharedstream.timetables.base import (
    DagRunInfo,
    Timetable,
    serialize_timetable,
)
from sharedstream.timetables.from_schedule import timetable_for
from sharedstream.timetables.interval import CronDataIntervalTimetable
from tests.log_lines import fields_of, text_of

T = TypeVar("T")
T0 = datetime(2026, 3, 2, tzinfo=UTC)
AMSTERDAM = ZoneInfo("Europe/Amsterdam")
DAY = 24 * 3600.0  # the loop's longest sleep here


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def rid(hours: float) -> str:
    return f"scheduled__{at(hours).isoformat()}"


class Clock:
    """The loop's clock: a moment the test moves."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def direct(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class Broken(Timetable):
    """A timetable that fails whenever it is asked (registered as a definitions-file class)."""

    def next_dagrun_info(self, **_: Any) -> DagRunInfo | None:
        raise RuntimeError("the moon is in the wrong phase")


def definitions(*dags: Dag) -> Definitions:
    return Definitions(
        path=Path("defs.py"), assets={}, dags={d.dag_id: d for d in dags}, triggers={},
        trigger_classes={}, timetable_classes={"tests.Broken": Broken},
        timetables={d.dag_id: _stored(d.timetable) for d in dags if d.timetable is not None})


def _stored(timetable: Timetable) -> dict[str, Any]:
    data = serialize_timetable(timetable)
    return {"classpath": "tests.Broken", "data": {}} if isinstance(timetable, Broken) else data


class World:
    """A store file, the definitions synced into it, and loops over it (one per 'restart')."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.path, self.clock = path, clock
        self.store = SqliteStore(path)
        self.store.migrate()
        self.defs: Definitions | None = None

    def define(self, *dags: Dag, watchers: list[WatcherSpec] | None = None,
               triggers: list[TriggerSpec] | None = None) -> dict[str, int]:
        self.defs = definitions(*dags)
        return self.store.sync_definitions(triggers or [], watchers or [], dag_specs(self.defs))

    def loop(self, max_runs: int = 16) -> ScheduleLoop:
        assert self.defs is not None
        return ScheduleLoop(self.store, direct, timetable_registry(self.defs.timetable_classes),
                            clock=self.clock, max_runs=max_runs, max_sleep=DAY)

    def restart(self) -> None:
        """A new process: a new connection to the same file."""
        self.store.close()
        self.store = SqliteStore(self.path)
        self.store.migrate()

    def runs(self, dag_id: str = "d") -> list[str]:
        return [r.run_id for r in reversed(self.store.list_runs(dag_id=dag_id, limit=1000))]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "meta.db", Clock(at(0)))
    yield w
    w.store.close()


def one_pass(loop: ScheduleLoop) -> float:
    return asyncio.run(loop.run_once())


def test_catchup_queues_every_missed_run_in_order_with_its_interval(world: World) -> None:
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(3.5)
    wake = one_pass(world.loop())
    assert world.runs() == [rid(0), rid(1), rid(2), rid(3)]
    newest = world.store.list_runs(dag_id="d")[0]
    assert (newest.run_type, newest.logical_date, newest.run_after) == ("scheduled", at(3), at(3))
    assert (newest.data_interval_start, newest.data_interval_end) == (at(3), at(3))
    assert wake == 30 * 60  # until 04:00
    (dag,) = world.store.list_dags()
    assert dag.next_run is not None
    assert dag.next_run.run_id == rid(4)
    assert one_pass(world.loop()) == 30 * 60  # nothing new is due: nothing written
    assert world.runs() == [rid(0), rid(1), rid(2), rid(3)]


def test_the_bound_spreads_a_long_catchup_over_passes_in_order(world: World) -> None:
    world.define(Dag("d", schedule=timedelta(hours=1), start_date=at(0), catchup=True))
    world.clock.now = at(6)
    loop = world.loop(max_runs=3)
    assert one_pass(loop) == 0  # more is due: the next pass follows at once
    assert world.runs() == [rid(0), rid(1), rid(2)]
    assert one_pass(loop) == 0
    assert one_pass(loop) == 60 * 60
    assert world.runs() == [rid(h) for h in range(7)]
    assert loop.queued == 7


def test_a_restart_mid_schedule_queues_nothing_twice_and_misses_nothing(world: World) -> None:
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(1.5)
    one_pass(world.loop())
    assert world.runs() == [rid(0), rid(1)]
    world.restart()  # the triggerer died; it comes back 3 h 40 min later
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(5 + 10 / 60)
    loop = world.loop(max_runs=2)
    while one_pass(loop) == 0:
        pass
    assert world.runs() == [rid(h) for h in range(6)]  # 02:00 .. 05:00 once each, in order
    ids = [r.id for r in reversed(world.store.list_runs(dag_id="d"))]
    assert ids == sorted(ids)


def test_catchup_off_queues_only_the_latest_due_run(world: World) -> None:
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0)))
    world.clock.now = at(3.5)
    assert one_pass(world.loop()) == 30 * 60
    assert world.runs() == []  # the past is not backfilled: the first run is 04:00
    world.clock.now = at(4)
    one_pass(world.loop())
    assert world.runs() == [rid(4)]
    world.restart()  # down from 04:00 to 07:30
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0)))
    world.clock.now = at(7.5)
    one_pass(world.loop())
    assert world.runs() == [rid(4), rid(7)]  # 05:00 and 06:00 skipped, 07:00 queued


def test_catchup_off_walks_a_long_gap_in_bounded_steps(world: World) -> None:
    world.define(Dag("d", schedule=timedelta(seconds=1), start_date=at(0)))
    world.clock.now = at(0)
    one_pass(world.loop())
    assert world.runs() == [rid(0)]
    world.clock.now = at(1)  # 3,600 missed runs: more than one pass walks
    loop = world.loop()
    passes = 1
    while one_pass(loop) == 0:
        passes += 1
    assert passes == 4
    assert world.runs() == [rid(0), rid(1)]


def test_a_data_interval_timetable_queues_the_last_complete_interval(world: World) -> None:
    world.define(Dag("d", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
                     start_date=at(0)))
    world.clock.now = at(3.5)
    one_pass(world.loop())
    (run,) = world.store.list_runs(dag_id="d")
    assert (run.run_id, run.logical_date, run.run_after) == (rid(3), at(2), at(3))
    assert (run.data_interval_start, run.data_interval_end) == (at(2), at(3))


def test_start_and_end_dates_are_honoured(world: World) -> None:
    world.define(Dag("d", schedule="0 * * * *", start_date=at(2), end_date=at(4), catchup=True))
    world.clock.now = at(10)
    assert one_pass(world.loop()) == DAY  # no next run: the loop looks again after max_sleep
    assert world.runs() == [rid(2), rid(3), rid(4)]
    (dag,) = world.store.list_dags()
    assert dag.next_run is None
    world.clock.now = at(20)
    one_pass(world.loop())
    assert world.runs() == [rid(2), rid(3), rid(4)]


def test_a_failing_timetable_is_logged_once_and_others_go_on(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.define(Dag("broken", schedule=Broken()),
                 Dag("d", schedule="0 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(1.5)
    loop = world.loop()
    with caplog.at_level(logging.ERROR, "sharedstream.runtime"):
        one_pass(loop)
        one_pass(loop)
    assert world.runs() == [rid(0), rid(1)]
    [said] = caplog.records  # once, though both passes failed to plan it
    assert text_of(said) == "schedule loop: the DAG cannot be planned"
    assert fields_of(said) == {
        "dag_id": "broken", "error": "RuntimeError: the moon is in the wrong phase"}


def test_a_changed_schedule_continues_after_the_last_run(world: World) -> None:
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(2.5)
    one_pass(world.loop())
    world.define(Dag("d", schedule="30 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(4)
    one_pass(world.loop())
    assert world.runs() == [rid(0), rid(1), rid(2), rid(2.5), rid(3.5)]


def test_asset_or_time_runs_once_per_trigger_whichever_fires(world: World) -> None:
    orders = Asset("orders")
    hourly = timetable_for("0 * * * *")
    dag = Dag("d", schedule=AssetOrTimeSchedule(timetable=hourly, assets=orders),
              start_date=at(0), catchup=True)
    ids = world.define(dag, triggers=[TriggerSpec("fp", "pkg.Orders", b"kw")],
                       watchers=[WatcherSpec("orders", "w", "fp")])
    world.clock.now = at(1.5)
    one_pass(world.loop())
    assert world.runs() == [rid(0), rid(1)]
    written = world.store.write_events([PendingEvent(ids["fp"], "order-1", b"{}"),
                                        PendingEvent(ids["fp"], "order-1", b"{}")])
    assert written.dag_runs == ("d/asset_triggered__000000000001",)  # the asset side: once
    world.clock.now = at(2)
    one_pass(world.loop())  # the time side is unaffected by the asset run, and vice versa
    assert world.runs() == [rid(0), rid(1), "asset_triggered__000000000001", rid(2)]
    kinds = [r.run_type for r in reversed(world.store.list_runs(dag_id="d"))]
    assert kinds == ["scheduled", "scheduled", "asset_triggered", "scheduled"]


def test_run_survives_a_failing_pass_and_sleeps_until_the_next_run(
        world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    world.define(Dag("d", schedule="0 * * * *", start_date=at(0), catchup=True))
    world.clock.now = at(1.5)
    real = world.store.list_dags
    calls = []

    def flaky() -> list[Any]:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("database is locked")
        return real()

    monkeypatch.setattr(world.store, "list_dags", flaky)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise asyncio.CancelledError  # the triggerer stopping

    loop = ScheduleLoop(world.store, direct, timetable_registry({}), clock=world.clock,
                        sleep=sleep, max_sleep=DAY)
    with caplog.at_level(logging.WARNING, "sharedstream.runtime"), pytest.raises(
            asyncio.CancelledError):
        asyncio.run(loop.run())
    assert waits == [DAY, 30 * 60, 30 * 60]
    assert world.runs() == [rid(0), rid(1)]
    [said] = caplog.records
    assert text_of(said) == "schedule loop: the store failed; retrying"
    assert str(fields_of(said)["error"]) == "database is locked"
    assert fields_of(said)["delay_s"] == DAY


@pytest.mark.parametrize(("start", "now", "utc_hours"), [
    # spring forward (29 March): 02:30 does not exist that night; cronsim runs it at 03:00
    (datetime(2026, 3, 27, tzinfo=AMSTERDAM), datetime(2026, 3, 31, tzinfo=UTC),
     [(27, 1.5), (28, 1.5), (29, 1.0), (30, 0.5)]),
    # fall back (25 October): 02:30 happens twice that night; it runs once, the first time
    (datetime(2026, 10, 24, tzinfo=AMSTERDAM), datetime(2026, 10, 27, tzinfo=UTC),
     [(24, 0.5), (25, 0.5), (26, 1.5)]),
])
def test_a_restart_across_a_daylight_saving_change_keeps_the_cron_librarys_times(
        world: World, start: datetime, now: datetime,
        utc_hours: list[tuple[int, float]]) -> None:
    dag = Dag("d", schedule="30 2 * * *", start_date=start, catchup=True)
    world.define(dag)
    world.clock.now = start + timedelta(days=1, hours=6)  # two runs, then down over the change
    one_pass(world.loop())
    world.restart()
    world.define(dag)
    world.clock.now = now
    one_pass(world.loop())
    expected = [start.astimezone(UTC).replace(day=day, hour=0, minute=0) + timedelta(hours=h)
                for day, h in utc_hours]
    assert world.runs() == [f"scheduled__{moment.isoformat()}" for moment in expected]
