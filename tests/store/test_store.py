"""The store contract on every backend (SQLite, PostgreSQL): schema, definitions, the group
commit, reads. Backend-specific tests are in ``test_sqlite.py`` and ``test_postgres.py``."""

from __future__ import annotations

import time
from datetime import UTC
from typing import Any

import pytest

from sharedstream import SharedStreamError
from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    Schedule,
    StoreError,
    StoreWriteError,
    TriggerSpec,
    WatcherSpec,
)
from tests.store.conftest import ALL_VERSIONS, LATEST, Backend

SCHEMA_VERSION = LATEST


def trig(name: str, blob: bytes = b"kw") -> TriggerSpec:
    return TriggerSpec(fingerprint=f"fp-{name}", classpath=f"pkg.{name}.Trigger", kwargs_blob=blob)


def asset(name: str) -> dict[str, Any]:
    return {"asset": name}


def define(
    store: MetadataStore,
    bindings: dict[str, list[str]],
    dags: dict[str, dict[str, Any]],
) -> dict[str, int]:
    """Trigger ``t`` is watched by each asset in ``bindings[t]``."""
    triggers = [trig(t) for t in bindings]
    watchers = [
        WatcherSpec(a, f"w-{t}", f"fp-{t}") for t, assets in bindings.items() for a in assets
    ]
    specs = [DagSpec(dag_id, schedule) for dag_id, schedule in dags.items()]
    ids = store.sync_definitions(triggers, watchers, specs)
    return {t: ids[f"fp-{t}"] for t in bindings}


def ev(trigger_id: int, key: str | None = None, payload: bytes = b"{}") -> PendingEvent:
    return PendingEvent(trigger_id=trigger_id, idem_key=key, payload=payload)


# -- schema ---------------------------------------------------------------------


def test_migrate_is_idempotent_and_records_each_version(backend: Backend) -> None:
    store = backend.open()
    assert store.schema_status().current == 0
    assert store.schema_status().behind
    assert store.migrate() == SCHEMA_VERSION
    assert store.migrate() == SCHEMA_VERSION
    again = backend.open()
    assert again.migrate() == SCHEMA_VERSION
    assert again.counts() == {"triggers": 0, "trigger_events": 0, "asset_events": 0, "dag_runs": 0}
    status = again.schema_status()
    assert (status.current, status.latest, status.behind, status.newer) == (
        LATEST, LATEST, False, False)
    assert backend.query("SELECT version FROM schema_version ORDER BY version") == ALL_VERSIONS


def test_a_database_newer_than_the_code_is_refused(store: MetadataStore, backend: Backend) -> None:
    backend.execute("INSERT INTO schema_version VALUES (99, '2099-01-01T00:00:00+00:00')")
    assert store.schema_status().newer
    with pytest.raises(StoreError, match="newer") as info:
        backend.open().migrate()
    assert not info.value.retryable
    assert isinstance(info.value, SharedStreamError)


def test_a_closed_store_raises(backend: Backend) -> None:
    s = backend.open()
    s.migrate()
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.counts()
    with pytest.raises(StoreError, match="closed"):
        s.write_events([ev(1)])


def test_open_store_picks_the_backend_of_the_url(store: MetadataStore, backend: Backend) -> None:
    expected = {"sqlite": "SqliteStore", "postgres": "PostgresStore"}[backend.name]
    assert type(store).__name__ == expected
    assert "********" not in store.location or backend.name == "postgres"
    assert store.counts()["triggers"] == 0


# -- definitions ----------------------------------------------------------------


def test_sync_upserts_triggers_by_fingerprint(store: MetadataStore) -> None:
    ids = store.sync_definitions([trig("a", b"v1")], [WatcherSpec("x", "w", "fp-a")], [])
    first = store.get_trigger(ids["fp-a"])
    assert first is not None
    assert (first.state, first.kwargs_blob, first.classpath) == ("active", b"v1", "pkg.a.Trigger")
    assert first.created_at.tzinfo is not None
    assert first.created_at.utcoffset() == UTC.utcoffset(None)
    ids2 = store.sync_definitions(
        [TriggerSpec("fp-a", "pkg.a.Other", b"v2")], [WatcherSpec("x", "w", "fp-a")], []
    )
    assert ids2 == ids
    again = store.get_trigger(ids["fp-a"])
    assert again is not None
    assert (again.kwargs_blob, again.classpath, again.created_at) == (
        b"v2",
        "pkg.a.Other",
        first.created_at,
    )
    assert store.counts()["triggers"] == 1


def test_a_pinned_trigger_keeps_its_first_serialized_form(store: MetadataStore) -> None:
    watcher = [WatcherSpec("x", "w", "fp-a")]
    ids = store.sync_definitions([TriggerSpec("fp-a", "pkg.At", b"moment-1", pinned=True)],
                                 watcher, [])
    store.sync_definitions([TriggerSpec("fp-a", "pkg.Other", b"moment-2", pinned=True)],
                           watcher, [])  # a restart computed another moment
    kept = store.get_trigger(ids["fp-a"])
    assert kept is not None
    assert (kept.classpath, kept.kwargs_blob) == ("pkg.At", b"moment-1")
    store.sync_definitions([TriggerSpec("fp-a", "pkg.Other", b"v3")], watcher, [])
    replaced = store.get_trigger(ids["fp-a"])
    assert replaced is not None
    assert (replaced.classpath, replaced.kwargs_blob) == ("pkg.Other", b"v3")


def test_repeated_syncs_do_not_skip_ids(store: MetadataStore, backend: Backend) -> None:
    # Every start syncs the same definitions again; a new trigger or asset added
    # later must still get the next id (an upsert's UPDATE branch burns one).
    first = define(store, {"a": ["x"], "b": ["y"]}, {})
    for _ in range(3):
        assert define(store, {"a": ["x"], "b": ["y"]}, {}) == first
    grown = define(store, {"a": ["x"], "b": ["y"], "c": ["z"]}, {})
    assert grown["c"] == max(first.values()) + 1
    asset_ids = dict(backend.query("SELECT name, id FROM assets"))
    assert asset_ids == {"x": 1, "y": 2, "z": 3}


def test_list_triggers_names_the_watchers_of_each_trigger(store: MetadataStore) -> None:
    ids = store.sync_definitions(
        [trig("a"), trig("b"), trig("c")],
        [WatcherSpec("orders", "big", "fp-a"), WatcherSpec("refunds", "all", "fp-a"),
         WatcherSpec("orders", "all", "fp-b")],
        [],
    )
    watchers = {t.id: t.watchers for t in store.list_triggers()}
    assert watchers == {ids["fp-a"]: ("orders/big", "refunds/all"),
                        ids["fp-b"]: ("orders/all",), ids["fp-c"]: ()}


def test_unreferenced_triggers_are_orphaned_and_come_back_with_their_history(
    store: MetadataStore,
) -> None:
    ids = define(store, {"a": ["x"], "b": ["y"]}, {})
    store.record_trigger_error(ids["b"], "boom", "Traceback ...")
    # b's watcher disappears; b is still given but referenced by nobody
    store.sync_definitions([trig("a"), trig("b")], [WatcherSpec("x", "w-a", "fp-a")], [])
    assert [(t.fingerprint, t.state) for t in store.list_triggers()] == [
        ("fp-a", "active"),
        ("fp-b", "orphaned"),
    ]
    # a is no longer given at all
    store.sync_definitions([trig("b")], [WatcherSpec("y", "w-b", "fp-b")], [])
    rows = {t.fingerprint: t for t in store.list_triggers()}
    assert rows["fp-a"].state == "orphaned"
    assert rows["fp-b"].state == "active"
    assert rows["fp-b"].error_count == 1
    assert rows["fp-b"].last_error == "boom"
    assert [t.fingerprint for t in store.active_triggers(10)] == ["fp-b"]


def test_a_failed_trigger_is_reactivated_and_a_finished_one_is_not(store: MetadataStore) -> None:
    ids = define(store, {"a": ["x"], "b": ["y"]}, {})
    store.record_trigger_error(ids["a"], "bad", "tb")
    store.set_trigger_state(ids["a"], "failed")
    store.set_trigger_state(ids["b"], "finished")
    assert store.active_triggers(10) == []
    define(store, {"a": ["x"], "b": ["y"]}, {})
    a, b = store.get_trigger(ids["a"]), store.get_trigger(ids["b"])
    assert a is not None
    assert b is not None
    assert (a.state, a.error_count, a.last_error) == ("active", 1, "bad")
    assert b.state == "finished"


def test_active_triggers_is_limited_and_ordered_by_id(store: MetadataStore) -> None:
    ids = define(store, {n: [n] for n in "abcde"}, {})
    assert [t.id for t in store.active_triggers(3)] == sorted(ids.values())[:3]
    assert store.active_triggers(0) == []
    with pytest.raises(ValueError, match="limit"):
        store.active_triggers(-1)


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        ({}, "exactly one"),
        ({"asset": ""}, "non-empty asset name"),
        ({"all": []}, "non-empty list"),
        ({"any": "x"}, "non-empty list"),
        ({"all": [{"asset": "a"}, {"every": []}]}, r"all\[1\]: unknown operator"),
        ({"asset": "a", "all": []}, "exactly one"),
    ],
)
def test_invalid_schedules_are_refused_and_change_nothing(
    store: MetadataStore, schedule: dict[str, Any], match: str
) -> None:
    define(store, {"a": ["x"]}, {"d": asset("x")})
    with pytest.raises(StoreError, match=match):
        store.sync_definitions(
            [trig("b")], [WatcherSpec("y", "w", "fp-b")], [DagSpec("e", schedule)]
        )
    assert [t.fingerprint for t in store.list_triggers()] == ["fp-a"]


def test_bad_watchers_and_dags_are_refused(store: MetadataStore) -> None:
    with pytest.raises(StoreError, match="not among the triggers"):
        store.sync_definitions([], [WatcherSpec("x", "w", "fp-missing")], [])
    with pytest.raises(StoreError, match="two watchers"):
        store.sync_definitions(
            [trig("a")], [WatcherSpec("x", "w", "fp-a"), WatcherSpec("x", "w", "fp-a")], []
        )
    with pytest.raises(StoreError, match="twice"):
        store.sync_definitions([], [], [DagSpec("d", asset("x")), DagSpec("d", asset("y"))])
    assert store.counts()["triggers"] == 0


def test_schedule_evaluation() -> None:
    tree = Schedule.parse({"all": [asset("a"), {"any": [asset("b"), asset("c")]}]})
    assert tree.assets == {"a", "b", "c"}
    assert not tree.satisfied({"a"})
    assert not tree.satisfied({"b", "c"})
    assert tree.satisfied({"a", "c"})
    assert tree.satisfied({"a", "b", "c"})


# -- write_events -----------------------------------------------------------------


def test_single_asset_dag_gets_one_run_per_event(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    result = store.write_events([ev(ids["t"], "k1"), ev(ids["t"], "k2")])
    assert (result.stored, result.duplicates, result.asset_events) == (2, 0, 2)
    assert result.dag_runs == ("d/asset_triggered__000000000001", "d/asset_triggered__000000000002")
    runs = store.list_runs()
    assert [(r.run_id, r.state, r.asset_event_ids, r.assets) for r in runs] == [
        ("asset_triggered__000000000002", "queued", (2,), ("x",)),
        ("asset_triggered__000000000001", "queued", (1,), ("x",)),
    ]
    trigger = store.get_trigger(ids["t"])
    assert trigger is not None
    assert trigger.events_stored == 2


def test_all_of_two_assets_waits_for_both_and_consumes_both(store: MetadataStore) -> None:
    ids = define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"all": [asset("a"), asset("b")]}})
    first = store.write_events([ev(ids["ta"], "1")])
    assert (first.stored, first.asset_events, first.dag_runs) == (1, 1, ())
    second = store.write_events([ev(ids["tb"], "2")])
    assert second.dag_runs == ("d/asset_triggered__000000000002",)
    (run,) = store.list_runs()
    assert (run.asset_event_ids, run.assets) == ((1, 2), ("a", "b"))
    # the queue was consumed: the next a alone creates nothing
    assert store.write_events([ev(ids["ta"], "3")]).dag_runs == ()
    # two more a's and one b: the run consumes all three queued events
    store.write_events([ev(ids["ta"], "4")])
    third = store.write_events([ev(ids["tb"], "5")])
    assert third.dag_runs == ("d/asset_triggered__000000000005",)
    assert store.list_runs(limit=1)[0].asset_event_ids == (3, 4, 5)


def test_queue_entries_survive_batches_in_every_combination(store: MetadataStore) -> None:
    ids = define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"all": [asset("a"), asset("b")]}})
    ta, tb = ids["ta"], ids["tb"]
    store.write_events([ev(ta), ev(ta)])  # 1, 2 queued in the table
    # 3 consumes 1, 2 from the table; 4 and 5 stay queued, written at the end of the batch
    result = store.write_events([ev(tb), ev(ta), ev(ta)])
    assert result.dag_runs == ("d/asset_triggered__000000000003",)
    assert store.write_events([ev(tb)]).dag_runs == ("d/asset_triggered__000000000006",)
    assert [r.asset_event_ids for r in store.list_runs()] == [(4, 5, 6), (1, 2, 3)]
    # a queued entry consumed in the same batch that queued it never lingers
    assert store.write_events([ev(ta), ev(tb), ev(tb)]).dag_runs == (
        "d/asset_triggered__000000000008",
    )
    assert store.write_events([ev(ta)]).dag_runs == ("d/asset_triggered__000000000010",)
    assert store.list_runs(limit=1)[0].asset_event_ids == (9, 10)


def test_any_creates_a_run_for_each_event(store: MetadataStore) -> None:
    ids = define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"any": [asset("a"), asset("b")]}})
    result = store.write_events([ev(ids["ta"]), ev(ids["tb"]), ev(ids["ta"])])
    assert len(result.dag_runs) == 3
    assert [r.assets for r in store.list_runs()] == [("a",), ("b",), ("a",)]


def test_nested_all_any(store: MetadataStore) -> None:
    ids = define(
        store,
        {"ta": ["a"], "tb": ["b"], "tc": ["c"]},
        {"d": {"all": [asset("a"), {"any": [asset("b"), asset("c")]}]}},
    )
    assert store.write_events([ev(ids["tb"]), ev(ids["tc"])]).dag_runs == ()
    result = store.write_events([ev(ids["ta"])])
    assert result.dag_runs == ("d/asset_triggered__000000000003",)
    (run,) = store.list_runs()
    assert run.asset_event_ids == (1, 2, 3)
    assert run.assets == ("a", "b", "c")
    # c then a: satisfied again by a + c
    assert len(store.write_events([ev(ids["tc"]), ev(ids["ta"])]).dag_runs) == 1


def test_one_trigger_watched_by_two_assets_feeding_several_dags(store: MetadataStore) -> None:
    ids = define(
        store,
        {"t": ["a", "b"]},
        {"both": {"all": [asset("a"), asset("b")]}, "only_a": asset("a"), "other": asset("z")},
    )
    result = store.write_events([ev(ids["t"], "k")])
    assert (result.stored, result.asset_events) == (1, 2)
    assert sorted(result.dag_runs) == [
        "both/asset_triggered__000000000002",
        "only_a/asset_triggered__000000000001",
    ]
    (event,) = store.list_events()
    assert event.assets == ("a", "b")


def test_a_dag_is_evaluated_once_per_event_not_once_per_asset_event(store: MetadataStore) -> None:
    ids = define(store, {"t": ["a", "b"]}, {"d": {"any": [asset("a"), asset("b")]}})
    result = store.write_events([ev(ids["t"])])
    assert result.dag_runs == ("d/asset_triggered__000000000002",)
    assert store.list_runs()[0].asset_event_ids == (1, 2)


def test_an_event_of_an_unwatched_trigger_is_stored_without_asset_events(
    store: MetadataStore,
) -> None:
    ids = store.sync_definitions([trig("lonely")], [], [DagSpec("d", asset("x"))])
    result = store.write_events([ev(ids["fp-lonely"], "k")])
    assert (result.stored, result.asset_events, result.dag_runs) == (1, 0, ())
    assert store.list_events()[0].assets == ()


def test_duplicates_within_a_batch_and_across_batches(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    first = store.write_events(
        [ev(ids["t"], "m1"), ev(ids["t"], "m1", b"other"), ev(ids["t"], "m2")]
    )
    assert (first.stored, first.duplicates, first.asset_events, len(first.dag_runs)) == (2, 1, 2, 2)
    again = store.write_events([ev(ids["t"], "m2"), ev(ids["t"], "m1"), ev(ids["t"], "m3")])
    assert (again.stored, again.duplicates, again.asset_events) == (1, 2, 1)
    assert again.dag_runs == ("d/asset_triggered__000000000003",)
    assert store.counts() == {"triggers": 1, "trigger_events": 3, "asset_events": 3, "dag_runs": 3}
    kept = {e.idem_key: e.payload for e in store.list_events()}
    assert kept["m1"] == b"{}"
    trigger = store.get_trigger(ids["t"])
    assert trigger is not None
    assert trigger.events_stored == 3


def test_events_without_idem_key_are_never_deduplicated(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    result = store.write_events([ev(ids["t"]), ev(ids["t"])])
    assert (result.stored, result.duplicates, len(result.dag_runs)) == (2, 0, 2)
    result = store.write_events([ev(ids["t"])])
    assert (result.stored, result.duplicates, len(result.dag_runs)) == (1, 0, 1)
    assert store.counts()["dag_runs"] == 3


def test_a_failure_mid_batch_rolls_back_everything(
    store: MetadataStore, backend: Backend
) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    store.write_events([ev(ids["t"], "before")])
    before = store.counts()
    batch = [ev(ids["t"], "new1"), ev(999_999, "bad"), ev(ids["t"], "new2")]
    with pytest.raises(StoreWriteError, match="rolled back") as info:
        store.write_events(batch)
    assert info.value.retryable
    assert isinstance(info.value.__cause__, backend.integrity_error)
    assert store.counts() == before
    trigger = store.get_trigger(ids["t"])
    assert trigger is not None
    assert trigger.events_stored == 1
    # nothing half-done lingers: the good events go through on their own
    result = store.write_events([batch[0], batch[2]])
    assert (result.stored, len(result.dag_runs)) == (2, 2)


def test_run_ids_are_deterministic(backend: Backend) -> None:
    def replay(url: str) -> list[tuple[str, str]]:
        with backend.open(url) as s:
            s.migrate()
            ids = define(
                s,
                {"ta": ["a"], "tb": ["b"]},
                {"single": asset("a"), "pair": {"all": [asset("a"), asset("b")]}},
            )
            s.write_events([ev(ids["ta"], "1"), ev(ids["tb"], "2")])
            s.write_events([ev(ids["ta"], "1"), ev(ids["ta"], "3")])
            return [(r.dag_id, r.run_id) for r in s.list_runs()]

    first = replay(backend.fresh_url())
    assert first == replay(backend.fresh_url())
    assert first == [
        ("single", "asset_triggered__000000000003"),
        ("pair", "asset_triggered__000000000002"),
        ("single", "asset_triggered__000000000001"),
    ]


def test_removing_a_dag_drops_its_queue_but_keeps_its_runs(store: MetadataStore) -> None:
    ids = define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"all": [asset("a"), asset("b")]}})
    store.write_events([ev(ids["ta"]), ev(ids["tb"]), ev(ids["ta"])])  # one run, one a queued
    define(store, {"ta": ["a"], "tb": ["b"]}, {})
    define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"all": [asset("a"), asset("b")]}})
    assert store.write_events([ev(ids["tb"])]).dag_runs == ()
    assert len(store.list_runs(dag_id="d")) == 1


def test_a_dag_that_stays_keeps_its_queue_across_syncs(store: MetadataStore) -> None:
    bindings = {"ta": ["a"], "tb": ["b"]}
    ids = define(store, bindings, {"d": {"all": [asset("a"), asset("b")]}})
    store.write_events([ev(ids["ta"])])
    define(store, bindings, {"d": {"all": [asset("a"), asset("b")]}, "e": asset("b")})
    result = store.write_events([ev(ids["tb"])])
    assert sorted(result.dag_runs) == [
        "d/asset_triggered__000000000002",
        "e/asset_triggered__000000000002",
    ]


def test_an_asset_watching_a_trigger_twice_gets_one_asset_event_per_event(
    store: MetadataStore,
) -> None:
    ids = store.sync_definitions(
        [trig("t")],
        [WatcherSpec("x", "first", "fp-t"), WatcherSpec("x", "second", "fp-t")],
        [DagSpec("d", asset("x"))],
    )
    result = store.write_events([ev(ids["fp-t"]), ev(ids["fp-t"])])
    assert (result.asset_events, len(result.dag_runs)) == (2, 2)


def test_an_empty_batch_is_a_no_op(store: MetadataStore) -> None:
    result = store.write_events([])
    assert (result.stored, result.duplicates, result.asset_events, result.dag_runs) == (0, 0, 0, ())


# -- reads, errors, triggerers, other connections ----------------------------------


def test_list_filters(store: MetadataStore) -> None:
    ids = define(
        store,
        {"ta": ["a"], "tb": ["b"]},
        {"da": asset("a"), "dab": {"any": [asset("a"), asset("b")]}},
    )
    store.write_events([ev(ids["ta"], "1", b"p1"), ev(ids["tb"], "2", b"p2"), ev(ids["ta"], "3")])
    assert [e.idem_key for e in store.list_events()] == ["3", "2", "1"]
    assert [e.idem_key for e in store.list_events(limit=2)] == ["3", "2"]
    assert [e.idem_key for e in store.list_events(asset="a")] == ["3", "1"]
    assert [e.payload for e in store.list_events(asset="b")] == [b"p2"]
    assert [e.idem_key for e in store.list_events(trigger_id=ids["tb"])] == ["2"]
    assert store.list_events(trigger_id=ids["tb"], asset="a") == []
    assert store.list_events(asset="nope") == []
    assert [r.dag_id for r in store.list_runs()] == ["dab", "da", "dab", "dab", "da"]
    assert [r.run_id for r in store.list_runs(dag_id="da")] == [
        "asset_triggered__000000000003",
        "asset_triggered__000000000001",
    ]
    assert [(r.dag_id, r.assets) for r in store.list_runs(asset="b")] == [("dab", ("b",))]
    assert [r.run_id for r in store.list_runs(dag_id="dab", asset="a", limit=1)] == [
        "asset_triggered__000000000003"
    ]
    event = store.list_events(limit=1)[0]
    assert event.created_at.utcoffset() == UTC.utcoffset(None)


def test_error_recording_and_states(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {})
    store.record_trigger_error(ids["t"], "first", "tb1")
    store.record_trigger_error(ids["t"], "second", "tb2")
    row = store.get_trigger(ids["t"])
    assert row is not None
    assert (row.error_count, row.last_error, row.last_traceback) == (2, "second", "tb2")
    assert row.last_error_at is not None
    assert row.last_error_at.utcoffset() == UTC.utcoffset(None)
    store.set_trigger_state(ids["t"], "failed")
    failed = store.get_trigger(ids["t"])
    assert failed is not None
    assert failed.state == "failed"
    assert store.get_trigger(12345) is None
    with pytest.raises(StoreError, match="one of"):
        store.set_trigger_state(ids["t"], "sleeping")
    with pytest.raises(StoreError, match="no trigger"):
        store.set_trigger_state(12345, "failed")
    with pytest.raises(StoreError, match="no trigger"):
        store.record_trigger_error(12345, "m", "tb")


def test_a_cleared_error_keeps_its_count_and_time(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {})
    store.record_trigger_error(ids["t"], "broker away", "tb")
    store.clear_trigger_error(ids["t"])
    store.clear_trigger_error(ids["t"])  # idempotent
    row = store.get_trigger(ids["t"])
    assert row is not None
    assert (row.error_count, row.last_error, row.last_traceback) == (1, None, None)
    assert row.last_error_at is not None
    with pytest.raises(StoreError, match="no trigger"):
        store.clear_trigger_error(12345)


def test_heartbeats(store: MetadataStore) -> None:
    store.heartbeat("t-2", "host-b", 20)
    store.heartbeat("t-1", "host-a", 10)
    (first_a,) = [t for t in store.triggerers() if t.id == "t-1"]
    time.sleep(0.002)
    store.heartbeat("t-1", "host-a", 11)
    rows = store.triggerers()
    assert [(t.id, t.hostname, t.pid) for t in rows] == [
        ("t-1", "host-a", 11),
        ("t-2", "host-b", 20),
    ]
    assert rows[0].started_at == first_a.started_at
    assert rows[0].heartbeat_at > first_a.heartbeat_at


def test_a_second_connection_sees_committed_data(store: MetadataStore, backend: Backend) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    with backend.open() as other:
        assert other.migrate() == SCHEMA_VERSION
        store.write_events([ev(ids["t"], "k")])
        assert other.counts()["dag_runs"] == 1
        # the other connection writes too, with definitions synced elsewhere
        assert other.write_events([ev(ids["t"], "k"), ev(ids["t"], "k2")]).duplicates == 1
        # definitions changed by the other connection are picked up by this one's writes
        other.sync_definitions([trig("t")], [WatcherSpec("x", "w-t", "fp-t")], [])
        assert store.write_events([ev(ids["t"], "k3")]).dag_runs == ()
    assert store.counts() == {"triggers": 1, "trigger_events": 3, "asset_events": 3, "dag_runs": 2}


def test_write_throughput_batch_500(
    store: MetadataStore, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = define(store, {"t": ["x"], "u": ["y"]}, {"d": asset("x")})
    batches = 10
    results: dict[str, float] = {}
    for label, trigger_id in (("asset event + run", ids["t"]), ("asset event, no DAG", ids["u"])):
        started = time.perf_counter()
        for b in range(batches):
            batch = [ev(trigger_id, f"{label}-{b}-{i}", b"x" * 64) for i in range(500)]
            assert store.write_events(batch).stored == 500
        results[label] = batches * 500 / (time.perf_counter() - started)
    with capsys.disabled():
        for label, rate in results.items():
            print(f"\n{backend.name} write_events, batch 500, one asset ({label}):"
                  f" {rate:,.0f} events/s")
