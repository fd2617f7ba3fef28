"""Property tests of the schedule loop over random clocks, restarts and bounds (real SQLite file).

Hypothesis drives a DAG's life - the clock moving forward by random amounts,
the triggerer restarted (a new connection to the same file) at random
points, a random catch-up bound - and checks after every pass, run until
nothing more is due:

* catch-up on: the queued runs are exactly every hourly point from the
  start date up to now, each once, queued in logical-date order;
* catch-up off: a pass queues at most one run, the latest hourly point
  that is due; runs only move forward, and none is queued twice.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream.runtime.definitions import Dag
from tests.runtime.test_schedule_loop import Clock, World, at, one_pass

STEPS = st.lists(st.tuples(st.integers(0, 600), st.booleans()), min_size=1, max_size=6)


def settle(world: World, max_runs: int) -> None:
    loop = world.loop(max_runs=max_runs)
    while one_pass(loop) == 0:
        pass


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


@settings(max_examples=25, deadline=None)
@given(steps=STEPS, bound=st.integers(1, 5), start=st.integers(0, 90))
def test_catchup_queues_every_run_once_in_order(
        steps: list[tuple[int, bool]], bound: int, start: int) -> None:
    begin = at(0) + timedelta(minutes=start)
    dag = Dag("d", schedule="0 * * * *", start_date=begin, catchup=True)
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp, "meta.db"), Clock(begin))
        try:
            world.define(dag)
            for minutes, restart in steps:
                world.clock.now += timedelta(minutes=minutes)
                if restart:
                    world.restart()
                    world.define(dag)
                settle(world, bound)
                due, point = [], hour_floor(begin)
                point += timedelta(hours=1) if point < begin else timedelta(0)
                while point <= world.clock.now:
                    due.append(f"scheduled__{point.isoformat()}")
                    point += timedelta(hours=1)
                assert world.runs() == due
        finally:
            world.store.close()


@settings(max_examples=25, deadline=None)
@given(steps=STEPS)
def test_catchup_off_queues_only_the_latest_due_run(steps: list[tuple[int, bool]]) -> None:
    dag = Dag("d", schedule="0 * * * *", start_date=at(0))
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp, "meta.db"), Clock(at(0) + timedelta(minutes=1)))
        try:
            world.define(dag)
            settle(world, 16)
            before: list[str] = world.runs()
            assert before == []  # the past is not backfilled: the first run is 01:00
            for minutes, restart in steps:
                previous = world.clock.now
                world.clock.now += timedelta(minutes=minutes)
                if restart:
                    world.restart()
                    world.define(dag)
                settle(world, 16)
                after = world.runs()
                new = after[len(before):]
                assert after[:len(before)] == before
                latest = hour_floor(world.clock.now)
                if latest > hour_floor(previous):  # an hourly point passed since the last pass
                    assert new == [f"scheduled__{latest.isoformat()}"]
                else:
                    assert new == []
                before = after
        finally:
            world.store.close()
