"""Trace context in the store (schema v5), on every backend: a stored event keeps the
``traceparent`` it was written with, an asset-triggered run keeps the one of the event that
completed its condition, duplicates change nothing, and a v4 database is upgraded in place."""

from __future__ import annotations

from datetime import UTC, datetime

from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    TimedRun,
    TriggerSpec,
    WatcherSpec,
)
from sharedstream.store._write_plan import Definitions, plan_runs
from sharedstream.store.base import Schedule
from tests.store.conftest import LATEST, Backend


def tp(n: int) -> str:
    """A W3C traceparent value, distinct per ``n``."""
    return f"00-{n:032x}-{n:016x}-01"


def define(store: MetadataStore, dags: dict[str, object]) -> dict[str, int]:
    """Triggers ``a`` and ``b``, watched by the assets of the same names; the given DAGs."""
    ids = store.sync_definitions(
        [TriggerSpec(f"fp-{t}", f"pkg.{t}", b"kw") for t in ("a", "b")],
        [WatcherSpec(t, "w", f"fp-{t}") for t in ("a", "b")],
        [DagSpec(dag_id, schedule) for dag_id, schedule in dags.items()],  # type: ignore[arg-type]
    )
    return {t: ids[f"fp-{t}"] for t in ("a", "b")}


def runs_of(store: MetadataStore, dag_id: str) -> list[tuple[str, str | None]]:
    """(run id, trace parent) of a DAG's runs, oldest first."""
    return [(r.run_id, r.trace_parent) for r in reversed(store.list_runs(dag_id=dag_id))]


def test_an_event_and_the_run_it_makes_keep_its_trace_parent(store: MetadataStore) -> None:
    ids = define(store, {"each_a": {"asset": "a"}})
    store.write_events([PendingEvent(ids["a"], "k1", b"{}", tp(1)),
                        PendingEvent(ids["a"], "k2", b"{}"),
                        PendingEvent(ids["a"], None, b"{}", tp(3))])
    assert [(e.idem_key, e.trace_parent) for e in store.list_events()] == [
        (None, tp(3)), ("k2", None), ("k1", tp(1))]
    assert runs_of(store, "each_a") == [
        ("asset_triggered__000000000001", tp(1)),
        ("asset_triggered__000000000002", None),
        ("asset_triggered__000000000003", tp(3))]


def test_the_run_takes_the_trace_of_the_event_that_completed_it(store: MetadataStore) -> None:
    ids = define(store, {"both": {"all": [{"asset": "a"}, {"asset": "b"}]},
                         "each_b": {"asset": "b"}})
    # in one batch: a queues, b completes 'both' (and runs 'each_b' on its own)
    store.write_events([PendingEvent(ids["a"], "a1", b"{}", tp(1)),
                        PendingEvent(ids["b"], "b1", b"{}", tp(2))])
    # across batches, through the stored queue: the completing event has no trace
    store.write_events([PendingEvent(ids["a"], "a2", b"{}", tp(3))])
    store.write_events([PendingEvent(ids["b"], "b2", b"{}")])
    # and the other way round: the queued event has none, the completing one has
    store.write_events([PendingEvent(ids["b"], "b3", b"{}")])
    store.write_events([PendingEvent(ids["a"], "a3", b"{}", tp(6))])
    assert runs_of(store, "both") == [
        ("asset_triggered__000000000002", tp(2)),
        ("asset_triggered__000000000004", None),
        ("asset_triggered__000000000006", tp(6))]
    assert runs_of(store, "each_b") == [
        ("asset_triggered__000000000002", tp(2)),
        ("asset_triggered__000000000004", None),
        ("asset_triggered__000000000005", None)]


def test_one_event_completing_several_dags_gives_each_its_trace(store: MetadataStore) -> None:
    ids = define(store, {"x": {"asset": "a"}, "y": {"any": [{"asset": "a"}, {"asset": "b"}]}})
    result = store.write_events([PendingEvent(ids["a"], f"k{n}", b"{}", tp(n))
                                 for n in range(1, 5)])
    assert len(result.dag_runs) == 8
    assert [t for _, t in runs_of(store, "x")] == [t for _, t in runs_of(store, "y")] == [
        tp(n) for n in range(1, 5)]


def test_a_duplicate_changes_no_stored_trace(store: MetadataStore) -> None:
    ids = define(store, {"each_a": {"asset": "a"}})
    store.write_events([PendingEvent(ids["a"], "k1", b"{}", tp(1)),
                        PendingEvent(ids["a"], "k1", b"{}", tp(9)),  # same key, same batch
                        PendingEvent(ids["a"], "k2", b"{}")])
    result = store.write_events([PendingEvent(ids["a"], "k1", b"{}", tp(8)),
                                 PendingEvent(ids["a"], "k2", b"{}", tp(7)),
                                 PendingEvent(ids["a"], "k3", b"{}", tp(3))])
    assert (result.stored, result.duplicates) == (1, 2)
    assert [(e.idem_key, e.trace_parent) for e in store.list_events()] == [
        ("k3", tp(3)), ("k2", None), ("k1", tp(1))]
    # the events left after duplicates are dropped still give each run its own trace
    assert [t for _, t in runs_of(store, "each_a")] == [tp(1), None, tp(3)]


def test_time_based_runs_have_no_trace_parent(store: MetadataStore) -> None:
    store.sync_definitions([], [], [DagSpec("clock", None, {"classpath": "pkg.Hourly"},
                                            summary="hourly")])
    (dag,) = store.list_dags()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    run = TimedRun(f"scheduled__{at.isoformat()}", at, at, at, at)
    assert store.queue_timed_runs("clock", dag.revision, [run], None).applied
    (row,) = store.list_runs()
    assert (row.run_type, row.trace_parent) == ("scheduled", None)


def test_a_v4_database_is_upgraded_and_keeps_its_rows(backend: Backend) -> None:
    # the v4 code's writes, as it wrote them (no trace_parent column to write)
    with backend.at_version(4) as old:
        ids = {"a": backend.insert_old_trigger("a")}
        # the v4 code's DAG row, written as it wrote it (no target column to write)
        backend.execute("INSERT INTO dags (dag_id, schedule, updated_at) VALUES "
                        "('each_a', '{\"asset\": \"a\"}', '2026-01-01T00:00:00+00:00')")
        backend.execute("INSERT INTO dag_schedule_assets (dag_id, asset_id) "
                        "SELECT 'each_a', id FROM assets WHERE name = 'a'")
        backend.execute("UPDATE store_meta SET value = value + 1"
                        " WHERE key = 'definitions_generation'")
        backend.insert_old_event(ids["a"], "old")
        backend.execute("INSERT INTO dag_runs (dag_id, run_id, state, created_at, run_type)"
                        " VALUES ('each_a', 'manual__old', 'queued',"
                        " '2026-01-01T00:00:00+00:00', 'manual')")
        status = old.schema_status()
        assert (status.current, status.latest, status.behind) == (4, 4, False)
    new = backend.open()
    status = new.schema_status()
    assert (status.current, status.latest, status.behind) == (4, LATEST, True)
    assert new.migrate() == LATEST
    assert not new.schema_status().behind
    (event,) = new.list_events()
    (run,) = new.list_runs()
    assert (event.idem_key, event.trace_parent) == ("old", None)
    assert (run.run_id, run.trace_parent) == ("manual__old", None)
    assert backend.query("SELECT count(*) FROM trigger_events WHERE trace_parent IS NULL") == [
        (1,)]
    new.write_events([PendingEvent(ids["a"], "new", b"{}", tp(5))])
    assert new.list_events()[0].trace_parent == new.list_runs()[0].trace_parent == tp(5)


# -- the planner alone (pure logic) ---------------------------------------------------


def test_plan_runs_gives_the_planned_events_trace_not_the_largest_ids() -> None:
    """On PostgreSQL a queued entry may carry a larger id than the event completing the run."""
    defs = Definitions(
        generation=1,
        assets_by_trigger={1: ((10, "a", ("d",)),), 2: ((20, "b", ("d",)),)},
        scheduled_triggers=frozenset({1, 2}),
        schedules={"d": Schedule.parse({"all": [{"asset": "a"}, {"asset": "b"}]})},
    )
    plan = plan_runs(defs, [(2, [50], tp(2))], {"d": [(99, "a")]})
    assert plan.runs == [("d", "asset_triggered__000000000099", [50, 99], tp(2))]
