"""Time-scheduled DAGs in the store, on every backend: the v4 migration, the bookkeeping that
``sync_definitions`` keeps or resets, and ``queue_timed_runs`` (idempotent, compare-and-set,
and - on PostgreSQL - two writers racing for the same run queue it once)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    TimedRun,
    TriggerSpec,
    WatcherSpec,
)
from tests.store.conftest import LATEST, Backend

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOURLY: dict[str, Any] = {"classpath": "pkg.Hourly", "kwargs": {"every": 3600}}


def hour(n: int) -> TimedRun:
    """The hourly trigger run of logical date ``T0 + n h`` (a point data interval)."""
    at = T0 + timedelta(hours=n)
    return TimedRun(f"scheduled__{at.isoformat()}", at, at, at, at)


def timed(dag_id: str = "d", timetable: dict[str, Any] | None = None, **kw: Any) -> DagSpec:
    return DagSpec(dag_id, None, timetable or HOURLY, summary="every hour", **kw)


def only(store: MetadataStore, dag_id: str = "d") -> Any:
    (row,) = [r for r in store.list_dags() if r.dag_id == dag_id]
    return row


def test_a_v3_database_is_upgraded_and_its_asset_runs_keep_their_meaning(
        backend: Backend) -> None:
    with backend.at_version(3):
        ids = {"fp": backend.insert_old_trigger("a")}
        # the v3 code's DAG row, written as it wrote it
        backend.execute("INSERT INTO dags (dag_id, schedule, updated_at) VALUES "
                        "('each', '{\"asset\": \"a\"}', '2026-01-01T00:00:00+00:00')")
        backend.execute("INSERT INTO dag_schedule_assets (dag_id, asset_id) "
                        "SELECT 'each', id FROM assets WHERE name = 'a'")
        backend.execute("UPDATE store_meta SET value = value + 1"
                        " WHERE key = 'definitions_generation'")
        # and its write of one event: the asset event and the run it made
        backend.insert_old_event(ids["fp"], "k1")
        backend.execute("INSERT INTO asset_events (asset_id, trigger_event_id, created_at)"
                        " SELECT id, 1, '2026-01-01T00:00:00+00:00' FROM assets WHERE name = 'a'")
        backend.execute("INSERT INTO dag_runs (dag_id, run_id, state, created_at) VALUES"
                        " ('each', 'asset_triggered__000000000001', 'queued',"
                        " '2026-01-01T00:00:00+00:00')")
        backend.execute("INSERT INTO dag_run_asset_events (dag_run_id, asset_event_id)"
                        " VALUES (1, 1)")
    with backend.open() as new:
        assert new.migrate() == LATEST
        (run,) = new.list_runs()
        assert (run.run_id, run.run_type) == ("asset_triggered__000000000001", "asset_triggered")
        assert (run.logical_date, run.data_interval_start, run.data_interval_end) == (
            None, None, None)
        assert run.run_after == run.created_at
        (dag,) = new.list_dags()
        assert (dag.schedule, dag.timetable, dag.next_run, dag.revision) == (
            {"asset": "a"}, None, None, 0)
        assert dag.last_run_id == "asset_triggered__000000000001"
        new.write_events([PendingEvent(ids["fp"], "k2", b"{}")])  # the asset path still runs
        assert new.list_runs()[0].run_id == "asset_triggered__000000000002"


def test_a_time_only_dag_is_stored_beside_asset_dags(store: MetadataStore) -> None:
    ids = store.sync_definitions(
        [TriggerSpec("fp", "pkg.T", b"kw")], [WatcherSpec("a", "w", "fp")],
        [DagSpec("each", {"asset": "a"}), timed("clock", start_date=T0, catchup=True)])
    dag = only(store, "clock")
    assert (dag.schedule, dag.timetable, dag.summary) == (None, HOURLY, "every hour")
    assert (dag.start_date, dag.end_date, dag.catchup, dag.last_interval) == (
        T0, None, True, None)
    result = store.write_events([PendingEvent(ids["fp"], "k", b"{}")])
    assert result.dag_runs == ("each/asset_triggered__000000000001",)


def test_queuing_runs_advances_the_bookkeeping_once(store: MetadataStore) -> None:
    store.sync_definitions([], [], [timed()])
    start = only(store)
    done = store.queue_timed_runs("d", start.revision, [hour(0), hour(1)], hour(2))
    assert done.applied
    assert done.queued == (hour(0).run_id, hour(1).run_id)
    dag = only(store)
    assert dag.last_interval == (hour(1).data_interval_start, hour(1).data_interval_end)
    assert dag.next_run == hour(2)
    assert dag.revision == start.revision + 1
    assert dag.last_run_id == hour(1).run_id
    # the same decision again (another triggerer, a retry): the revision moved, nothing is written
    assert not store.queue_timed_runs("d", start.revision, [hour(2)], hour(3)).applied
    assert only(store) == dag
    runs = store.list_runs(dag_id="d")
    assert [(r.run_id, r.run_type, r.logical_date, r.run_after) for r in runs] == [
        (hour(n).run_id, "scheduled", hour(n).logical_date, hour(n).run_after) for n in (1, 0)]
    assert (runs[0].data_interval_start, runs[0].data_interval_end) == (
        hour(1).data_interval_start, hour(1).data_interval_end)


def test_a_stored_run_id_is_never_queued_twice(store: MetadataStore) -> None:
    store.sync_definitions([], [], [timed()])
    store.queue_timed_runs("d", only(store).revision, [hour(0)], hour(1))
    again = store.queue_timed_runs("d", only(store).revision, [hour(0), hour(1)], hour(2))
    assert again.applied
    assert again.queued == (hour(1).run_id,)
    assert store.counts()["dag_runs"] == 2


def test_an_unknown_dag_queues_nothing(store: MetadataStore) -> None:
    assert not store.queue_timed_runs("nope", 0, [hour(0)], None).applied
    assert store.counts()["dag_runs"] == 0


def test_sync_keeps_the_bookkeeping_of_an_unchanged_schedule(store: MetadataStore) -> None:
    store.sync_definitions([], [], [timed(start_date=T0)])
    store.queue_timed_runs("d", only(store).revision, [hour(0)], hour(1))
    before = only(store)
    store.sync_definitions([], [], [timed(start_date=T0)])  # a restart
    assert only(store) == before


@pytest.mark.parametrize("change", [
    {"timetable": {"classpath": "pkg.Daily", "kwargs": {}}},
    {"start_date": T0 + timedelta(days=1)},
    {"end_date": T0 + timedelta(days=9)},
    {"catchup": True},
])
def test_a_changed_schedule_continues_after_the_last_run(
        store: MetadataStore, change: dict[str, Any]) -> None:
    store.sync_definitions([], [], [timed(start_date=T0)])
    store.queue_timed_runs("d", only(store).revision, [hour(0)], hour(1))
    before = only(store)
    store.sync_definitions([], [], [timed(**{"start_date": T0} | change)])
    after = only(store)
    assert after.last_interval == before.last_interval  # what was queued stays queued
    assert after.next_run is None  # recomputed by the schedule loop
    assert after.revision == before.revision + 1
    assert not store.queue_timed_runs("d", before.revision, [hour(1)], None).applied


def test_a_dag_added_back_continues_after_its_stored_runs(store: MetadataStore) -> None:
    store.sync_definitions([], [], [timed()])
    store.queue_timed_runs("d", only(store).revision, [hour(0), hour(1)], hour(2))
    store.sync_definitions([], [], [])
    assert store.list_dags() == []
    store.sync_definitions([], [], [timed()])
    dag = only(store)
    assert dag.last_interval == (hour(1).data_interval_start, hour(1).data_interval_end)
    assert dag.next_run is None


def test_two_writers_racing_for_the_same_runs_queue_them_once(backend: Backend) -> None:
    first = backend.open()
    first.migrate()
    first.sync_definitions([], [], [timed()])
    second = backend.open()
    revision = only(first).revision
    barrier = threading.Barrier(2)
    results = []

    def decide(store: MetadataStore) -> None:
        barrier.wait(timeout=10)
        results.append(store.queue_timed_runs("d", revision, [hour(0), hour(1)], hour(2)))

    threads = [threading.Thread(target=decide, args=(s,)) for s in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(r.applied for r in results) == [False, True]
    assert [r.queued for r in results if r.applied] == [(hour(0).run_id, hour(1).run_id)]
    assert first.counts()["dag_runs"] == 2
    assert only(second).revision == revision + 1
