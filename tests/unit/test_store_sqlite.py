"""SqliteStore on real database files: schema, definitions, the group commit, reads."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream import SharedStreamError
from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    Schedule,
    SqliteStore,
    StoreError,
    StoreWriteError,
    TriggerSpec,
    WatcherSpec,
    WriteResult,
)
from sharedstream.store import sqlite as sqlite_store
from sharedstream.store._sqlite_events import values_chunk
from sharedstream.store.sqlite import MIGRATIONS


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "meta.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(db_path) as s:
        s.migrate()
        yield s


def trig(name: str, blob: bytes = b"kw") -> TriggerSpec:
    return TriggerSpec(fingerprint=f"fp-{name}", classpath=f"pkg.{name}.Trigger", kwargs_blob=blob)


def asset(name: str) -> dict[str, Any]:
    return {"asset": name}


def define(
    store: SqliteStore,
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


def test_migrate_creates_the_file_and_is_idempotent(db_path: Path) -> None:
    assert not db_path.parent.exists()
    with SqliteStore(db_path) as s:
        assert s.migrate() == len(MIGRATIONS) == 2
        assert s.migrate() == 2
    assert db_path.is_file()
    with SqliteStore(db_path) as again:
        assert again.migrate() == 2
        assert again.counts() == {
            "triggers": 0,
            "trigger_events": 0,
            "asset_events": 0,
            "dag_runs": 0,
        }
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(1,), (2,)]
    finally:
        raw.close()


def test_a_migrated_file_is_in_wal_mode(store: SqliteStore, db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        raw.close()


def test_a_database_newer_than_the_code_is_refused(store: SqliteStore, db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    try:
        with raw:
            raw.execute("INSERT INTO schema_version VALUES (99, '2099-01-01T00:00:00+00:00')")
    finally:
        raw.close()
    with SqliteStore(db_path) as newer, pytest.raises(StoreError, match="newer") as info:
        newer.migrate()
    assert not info.value.retryable
    assert isinstance(info.value, SharedStreamError)


def test_a_closed_store_raises(db_path: Path) -> None:
    s = SqliteStore(db_path)
    s.migrate()
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.counts()
    with pytest.raises(StoreError, match="closed"):
        s.write_events([ev(1)])


def test_sqlite_store_satisfies_the_protocol(store: SqliteStore) -> None:
    typed: MetadataStore = store
    assert typed.counts()["triggers"] == 0


# -- definitions ----------------------------------------------------------------


def test_sync_upserts_triggers_by_fingerprint(store: SqliteStore) -> None:
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


def test_repeated_syncs_do_not_skip_ids(store: SqliteStore, db_path: Path) -> None:
    # Every start syncs the same definitions again; a new trigger or asset added
    # later must still get the next id (an upsert's UPDATE branch burns one).
    first = define(store, {"a": ["x"], "b": ["y"]}, {})
    for _ in range(3):
        assert define(store, {"a": ["x"], "b": ["y"]}, {}) == first
    grown = define(store, {"a": ["x"], "b": ["y"], "c": ["z"]}, {})
    assert grown["c"] == max(first.values()) + 1
    with sqlite3.connect(db_path) as conn:
        asset_ids = dict(conn.execute("SELECT name, id FROM assets").fetchall())
    assert asset_ids == {"x": 1, "y": 2, "z": 3}


def test_list_triggers_names_the_watchers_of_each_trigger(store: SqliteStore) -> None:
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
    store: SqliteStore,
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


def test_a_failed_trigger_is_reactivated_and_a_finished_one_is_not(store: SqliteStore) -> None:
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


def test_active_triggers_is_limited_and_ordered_by_id(store: SqliteStore) -> None:
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
    store: SqliteStore, schedule: dict[str, Any], match: str
) -> None:
    define(store, {"a": ["x"]}, {"d": asset("x")})
    with pytest.raises(StoreError, match=match):
        store.sync_definitions(
            [trig("b")], [WatcherSpec("y", "w", "fp-b")], [DagSpec("e", schedule)]
        )
    assert [t.fingerprint for t in store.list_triggers()] == ["fp-a"]


def test_bad_watchers_and_dags_are_refused(store: SqliteStore) -> None:
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


def test_single_asset_dag_gets_one_run_per_event(store: SqliteStore) -> None:
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


def test_all_of_two_assets_waits_for_both_and_consumes_both(store: SqliteStore) -> None:
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


def test_queue_entries_survive_batches_in_every_combination(store: SqliteStore) -> None:
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


def test_any_creates_a_run_for_each_event(store: SqliteStore) -> None:
    ids = define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"any": [asset("a"), asset("b")]}})
    result = store.write_events([ev(ids["ta"]), ev(ids["tb"]), ev(ids["ta"])])
    assert len(result.dag_runs) == 3
    assert [r.assets for r in store.list_runs()] == [("a",), ("b",), ("a",)]


def test_nested_all_any(store: SqliteStore) -> None:
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


def test_one_trigger_watched_by_two_assets_feeding_several_dags(store: SqliteStore) -> None:
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


def test_a_dag_is_evaluated_once_per_event_not_once_per_asset_event(store: SqliteStore) -> None:
    ids = define(store, {"t": ["a", "b"]}, {"d": {"any": [asset("a"), asset("b")]}})
    result = store.write_events([ev(ids["t"])])
    assert result.dag_runs == ("d/asset_triggered__000000000002",)
    assert store.list_runs()[0].asset_event_ids == (1, 2)


def test_an_event_of_an_unwatched_trigger_is_stored_without_asset_events(
    store: SqliteStore,
) -> None:
    ids = store.sync_definitions([trig("lonely")], [], [DagSpec("d", asset("x"))])
    result = store.write_events([ev(ids["fp-lonely"], "k")])
    assert (result.stored, result.asset_events, result.dag_runs) == (1, 0, ())
    assert store.list_events()[0].assets == ()


def test_duplicates_within_a_batch_and_across_batches(store: SqliteStore) -> None:
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


def test_events_without_idem_key_are_never_deduplicated(store: SqliteStore) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    result = store.write_events([ev(ids["t"]), ev(ids["t"])])
    assert (result.stored, result.duplicates, len(result.dag_runs)) == (2, 0, 2)
    result = store.write_events([ev(ids["t"])])
    assert (result.stored, result.duplicates, len(result.dag_runs)) == (1, 0, 1)
    assert store.counts()["dag_runs"] == 3


def test_a_failure_mid_batch_rolls_back_everything(store: SqliteStore) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    store.write_events([ev(ids["t"], "before")])
    before = store.counts()
    batch = [ev(ids["t"], "new1"), ev(999_999, "bad"), ev(ids["t"], "new2")]
    with pytest.raises(StoreWriteError, match="rolled back") as info:
        store.write_events(batch)
    assert info.value.retryable
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert store.counts() == before
    trigger = store.get_trigger(ids["t"])
    assert trigger is not None
    assert trigger.events_stored == 1
    # nothing half-done lingers: the good events go through on their own
    result = store.write_events([batch[0], batch[2]])
    assert (result.stored, len(result.dag_runs)) == (2, 2)


def test_run_ids_are_deterministic(tmp_path: Path) -> None:
    def replay(path: Path) -> list[tuple[str, str]]:
        with SqliteStore(path) as s:
            s.migrate()
            ids = define(
                s,
                {"ta": ["a"], "tb": ["b"]},
                {"single": asset("a"), "pair": {"all": [asset("a"), asset("b")]}},
            )
            s.write_events([ev(ids["ta"], "1"), ev(ids["tb"], "2")])
            s.write_events([ev(ids["ta"], "1"), ev(ids["ta"], "3")])
            return [(r.dag_id, r.run_id) for r in s.list_runs()]

    first = replay(tmp_path / "one.db")
    assert first == replay(tmp_path / "two.db")
    assert first == [
        ("single", "asset_triggered__000000000003"),
        ("pair", "asset_triggered__000000000002"),
        ("single", "asset_triggered__000000000001"),
    ]


def test_removing_a_dag_drops_its_queue_but_keeps_its_runs(store: SqliteStore) -> None:
    ids = define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"all": [asset("a"), asset("b")]}})
    store.write_events([ev(ids["ta"]), ev(ids["tb"]), ev(ids["ta"])])  # one run, one a queued
    define(store, {"ta": ["a"], "tb": ["b"]}, {})
    define(store, {"ta": ["a"], "tb": ["b"]}, {"d": {"all": [asset("a"), asset("b")]}})
    assert store.write_events([ev(ids["tb"])]).dag_runs == ()
    assert len(store.list_runs(dag_id="d")) == 1


def test_a_dag_that_stays_keeps_its_queue_across_syncs(store: SqliteStore) -> None:
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
    store: SqliteStore,
) -> None:
    ids = store.sync_definitions(
        [trig("t")],
        [WatcherSpec("x", "first", "fp-t"), WatcherSpec("x", "second", "fp-t")],
        [DagSpec("d", asset("x"))],
    )
    result = store.write_events([ev(ids["fp-t"]), ev(ids["fp-t"])])
    assert (result.asset_events, len(result.dag_runs)) == (2, 2)


def test_watchers_changed_behind_the_generation_fail_the_batch_once(
    store: SqliteStore, db_path: Path
) -> None:
    ids = define(store, {"t": ["x"]}, {})
    store.write_events([ev(ids["t"])])  # caches the definitions
    raw = sqlite3.connect(db_path)
    try:
        with raw:  # a second watching asset, without bumping definitions_generation
            raw.execute("INSERT INTO assets (name, created_at) VALUES ('y', 'now')")
            raw.execute(
                "INSERT INTO watchers (asset_id, name, trigger_id)"
                " SELECT id, 'w', ? FROM assets WHERE name = 'y'",
                (ids["t"],),
            )
    finally:
        raw.close()
    with pytest.raises(StoreWriteError, match="watchers table"):
        store.write_events([ev(ids["t"], "k")])
    assert store.counts()["trigger_events"] == 1
    # the failure dropped the cached definitions: the retry reloads them
    assert store.write_events([ev(ids["t"], "k")]).asset_events == 2


def test_an_empty_batch_is_a_no_op(store: SqliteStore) -> None:
    result = store.write_events([])
    assert (result.stored, result.duplicates, result.asset_events, result.dag_runs) == (0, 0, 0, ())


# -- reads, errors, triggerers, other connections ----------------------------------


def test_list_filters(store: SqliteStore) -> None:
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


def test_error_recording_and_states(store: SqliteStore) -> None:
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


def test_heartbeats(store: SqliteStore) -> None:
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


def test_a_second_connection_sees_committed_data(store: SqliteStore, db_path: Path) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    with SqliteStore(db_path) as other:
        assert other.migrate() == 2
        store.write_events([ev(ids["t"], "k")])
        assert other.counts()["dag_runs"] == 1
        # the other connection writes too, with definitions synced elsewhere
        assert other.write_events([ev(ids["t"], "k"), ev(ids["t"], "k2")]).duplicates == 1
        # definitions changed by the other connection are picked up by this one's writes
        other.sync_definitions([trig("t")], [WatcherSpec("x", "w-t", "fp-t")], [])
        assert store.write_events([ev(ids["t"], "k3")]).dag_runs == ()
    assert store.counts() == {"triggers": 1, "trigger_events": 3, "asset_events": 3, "dag_runs": 2}


def test_write_throughput_batch_500(store: SqliteStore, capsys: pytest.CaptureFixture[str]) -> None:
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
            print(f"\nwrite_events, batch 500, one asset ({label}): {rate:,.0f} events/s")


# -- write_events against the original one-statement-per-row algorithm --------------
#
# ``_reference_write_batch`` is the per-row ``_write_batch`` that the set-based one
# replaced, kept verbatim in behaviour (and self-contained: it loads the definitions
# itself). Two stores, one per algorithm, are fed the same operations under the same
# clock; every WriteResult (or failure) and every table, sqlite_sequence included,
# must come out identical.


def _reference_definitions(
    conn: sqlite3.Connection,
) -> tuple[dict[int, tuple[tuple[int, str], ...]], dict[int, tuple[str, ...]], dict[str, Schedule]]:
    assets_by_trigger: dict[int, dict[int, str]] = {}
    for trigger_id, asset_id, name in conn.execute(
        "SELECT w.trigger_id, a.id, a.name FROM watchers w JOIN assets a ON a.id = w.asset_id"
        " ORDER BY w.trigger_id, a.id"
    ):
        assets_by_trigger.setdefault(int(trigger_id), {})[int(asset_id)] = str(name)
    dags_by_asset: dict[int, list[str]] = {}
    for asset_id, dag_id in conn.execute(
        "SELECT asset_id, dag_id FROM dag_schedule_assets ORDER BY asset_id, dag_id"
    ):
        dags_by_asset.setdefault(int(asset_id), []).append(str(dag_id))
    schedules = {
        str(dag_id): Schedule.parse(json.loads(text))
        for dag_id, text in conn.execute("SELECT dag_id, schedule FROM dags")
    }
    return (
        {t: tuple(assets.items()) for t, assets in assets_by_trigger.items()},
        {a: tuple(ids) for a, ids in dags_by_asset.items()},
        schedules,
    )


def _reference_write_batch(conn: sqlite3.Connection, batch: Sequence[PendingEvent]) -> WriteResult:
    assets_by_trigger, dags_by_asset, schedules = _reference_definitions(conn)
    now = sqlite_store._now()
    cur = conn.cursor()
    stored = duplicates = asset_event_count = 0
    runs: list[str] = []
    per_trigger: Counter[int] = Counter()
    queues: dict[str, list[tuple[int, str]]] = {}
    unwritten: dict[str, list[tuple[int, int]]] = {}
    in_table: set[str] = set()
    consumed_from_table: list[str] = []
    for event in batch:
        cur.execute(
            "INSERT INTO trigger_events (trigger_id, idem_key, payload, created_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (idem_key) DO NOTHING",
            (event.trigger_id, event.idem_key, event.payload, now),
        )
        if cur.rowcount == 0:
            duplicates += 1
            continue
        trigger_event_id = cur.lastrowid
        stored += 1
        per_trigger[event.trigger_id] += 1
        touched: dict[str, None] = {}
        for asset_id, asset_name in assets_by_trigger.get(event.trigger_id, ()):
            cur.execute(
                "INSERT INTO asset_events (asset_id, trigger_event_id, created_at)"
                " VALUES (?, ?, ?)",
                (asset_id, trigger_event_id, now),
            )
            asset_event_id = cur.lastrowid
            assert asset_event_id is not None
            asset_event_count += 1
            for dag_id in dags_by_asset.get(asset_id, ()):
                queue = queues.get(dag_id)
                if queue is None:
                    queue = queues[dag_id] = [
                        (int(ae_id), str(name))
                        for ae_id, name in cur.execute(
                            "SELECT q.asset_event_id, a.name FROM asset_dag_queue q"
                            " JOIN assets a ON a.id = q.asset_id WHERE q.dag_id = ?",
                            (dag_id,),
                        ).fetchall()
                    ]
                    unwritten[dag_id] = []
                    if queue:
                        in_table.add(dag_id)
                queue.append((asset_event_id, asset_name))
                unwritten[dag_id].append((asset_event_id, asset_id))
                touched[dag_id] = None
        for dag_id in touched:
            queue = queues[dag_id]
            if not schedules[dag_id].satisfied({name for _, name in queue}):
                continue
            consumed = sorted(ae_id for ae_id, _ in queue)
            run_id = f"asset_triggered__{consumed[-1]:012d}"
            cur.execute(
                "INSERT INTO dag_runs (dag_id, run_id, state, created_at) VALUES (?, ?, ?, ?)",
                (dag_id, run_id, "queued", now),
            )
            cur.executemany(
                "INSERT INTO dag_run_asset_events (dag_run_id, asset_event_id) VALUES (?, ?)",
                [(cur.lastrowid, ae_id) for ae_id in consumed],
            )
            runs.append(f"{dag_id}/{run_id}")
            queue.clear()
            unwritten[dag_id].clear()
            if dag_id in in_table:
                in_table.discard(dag_id)
                consumed_from_table.append(dag_id)
    cur.executemany(
        "DELETE FROM asset_dag_queue WHERE dag_id = ?", [(d,) for d in consumed_from_table]
    )
    cur.executemany(
        "INSERT INTO asset_dag_queue (dag_id, asset_event_id, asset_id) VALUES (?, ?, ?)",
        [(d, ae_id, a_id) for d, entries in unwritten.items() for ae_id, a_id in entries],
    )
    cur.executemany(
        "UPDATE triggers SET events_stored = events_stored + ? WHERE id = ?",
        [(count, trigger_id) for trigger_id, count in per_trigger.items()],
    )
    return WriteResult(stored, duplicates, asset_event_count, tuple(runs))


class _ReferenceStore(SqliteStore):
    def _write_batch(self, conn: sqlite3.Connection, batch: Sequence[PendingEvent]) -> WriteResult:
        return _reference_write_batch(conn, batch)


_TABLES = (
    "triggers",
    "assets",
    "watchers",
    "dags",
    "dag_schedule_assets",
    "trigger_events",
    "asset_events",
    "asset_dag_queue",
    "dag_runs",
    "dag_run_asset_events",
    "sqlite_sequence",
)

_UNKNOWN_TRIGGER = 999_999
_TRIGGER_NAMES = ("t0", "t1", "t2", "t3")
_ASSET_NAMES = ("a", "b", "c", "d")

# ("sync", watchers, dags) | ("write", events) | ("purge",) - events are
# (trigger name or None for an unknown trigger id, idem key, payload)
Op = tuple[Any, ...]


def _dump(store: SqliteStore) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: sorted(store._read(f"SELECT * FROM {table}"), key=repr)  # noqa: S608
        for table in _TABLES
    }


def _apply(store: SqliteStore, op: Op, ids: dict[str, int]) -> object:
    """Run one operation; returns its WriteResult, or the failure's type and cause type."""
    if op[0] == "sync":
        _, watchers, dags = op
        ids.update(
            store.sync_definitions(
                [trig(t) for t in _TRIGGER_NAMES],
                [WatcherSpec(a, name, f"fp-{t}") for a, name, t in watchers],
                [DagSpec(dag_id, schedule) for dag_id, schedule in dags.items()],
            )
        )
        return None
    if op[0] == "purge":
        # empties the event tables but not sqlite_sequence: new ids continue past a gap
        with store._write("purge") as conn:
            for table in (
                "dag_run_asset_events",
                "dag_runs",
                "asset_dag_queue",
                "asset_events",
                "trigger_events",
            ):
                conn.execute(f"DELETE FROM {table}")  # noqa: S608
        return None
    batch = [
        ev(_UNKNOWN_TRIGGER if t is None else ids[f"fp-{t}"], key, payload)
        for t, key, payload in op[1]
    ]
    try:
        return store.write_events(batch)
    except StoreWriteError as exc:
        return (type(exc), type(exc.__cause__))


def _assert_same_as_reference(ops: Sequence[Op], db_dir: Path | None) -> None:
    """Both stores in ``db_dir``, or in memory (no fsync: fast enough for Hypothesis)."""
    clock = iter(range(1, 1_000_000))
    with (
        SqliteStore(db_dir / "new.db" if db_dir else Path(":memory:")) as new,
        _ReferenceStore(db_dir / "reference.db" if db_dir else Path(":memory:")) as reference,
    ):
        new.migrate()
        reference.migrate()
        new_ids: dict[str, int] = {}
        reference_ids: dict[str, int] = {}
        for step, op in enumerate(ops):
            stamp = f"2025-01-01T00:00:00.{next(clock):06d}+00:00"
            with patch.object(sqlite_store, "_now", lambda stamp=stamp: stamp):
                got = _apply(new, op, new_ids)
                want = _apply(reference, op, reference_ids)
            assert got == want, f"step {step}: {op}"
            assert _dump(new) == _dump(reference), f"step {step}: {op}"


_schedules = st.recursive(
    st.sampled_from(_ASSET_NAMES).map(asset),
    lambda children: st.builds(
        lambda op, kids: {op: kids},
        st.sampled_from(("all", "any")),
        st.lists(children, min_size=1, max_size=3),
    ),
    max_leaves=4,
)
_sync_ops = st.tuples(
    st.just("sync"),
    # (asset, watcher name, trigger): a trigger watched by 0, 1 or more assets, and
    # sometimes by the same asset twice under two names (still one asset event)
    st.lists(
        st.tuples(
            st.sampled_from(_ASSET_NAMES),
            st.sampled_from(("w1", "w2")),
            st.sampled_from(_TRIGGER_NAMES),
        ),
        max_size=6,
        unique_by=lambda w: (w[0], w[1]),
    ),
    st.dictionaries(st.sampled_from(("d1", "d2", "d3")), _schedules, max_size=3),
)
_events = st.tuples(
    # None (an unknown trigger id) is rare: it makes the whole batch fail
    st.sampled_from((*_TRIGGER_NAMES * 8, None)),
    st.one_of(st.none(), st.sampled_from([f"k{i}" for i in range(8)])),
    st.binary(max_size=3),
)
_write_ops = st.tuples(st.just("write"), st.lists(_events, min_size=1, max_size=30))
_ops = st.lists(
    # mostly writes; one_of picks its branches about evenly
    st.one_of(_write_ops, _write_ops, _write_ops, _write_ops, _sync_ops, st.just(("purge",))),
    max_size=10,
)


@settings(max_examples=300, deadline=None)
@given(first=_sync_ops, ops=_ops)
def test_write_events_matches_the_per_row_reference(first: Op, ops: list[Op]) -> None:
    _assert_same_as_reference([first, *ops], None)


def test_write_events_matches_the_per_row_reference_on_large_batches(tmp_path: Path) -> None:
    rng = random.Random(20250101)
    ops: list[Op] = [
        (
            "sync",
            [
                ("a", "w", "t0"),
                ("b", "w", "t1"),
                ("c", "w", "t1"),
                ("c", "w2", "t2"),
                ("d", "w", "t2"),
            ],
            {
                "d1": asset("a"),
                "d2": {"all": [asset("b"), asset("c")]},
                "d3": {"any": [asset("c"), {"all": [asset("a"), asset("d")]}]},
            },
        )
    ]
    for b in range(8):
        events = [
            (
                rng.choice(_TRIGGER_NAMES),  # t3 is watched by nobody
                rng.choice((None, f"k{rng.randrange(2_000)}", f"b{b}-{i}")),
                rng.randbytes(rng.randrange(8)),
            )
            for i in range(500)
        ]
        ops.append(("write", events))
        if b == 5:
            ops.append(("purge",))
    _assert_same_as_reference(ops, tmp_path)


@pytest.mark.parametrize("variable_limit", [999, 64, 4])
def test_large_batches_fit_a_lower_bound_parameter_limit(
    tmp_path: Path, variable_limit: int
) -> None:
    """Builds allowing fewer bound parameters per statement get smaller VALUES chunks.

    The events of trigger_events have 4 columns: a limit of 999 (SQLite before
    3.32) allows 128 rows per statement, 64 allows 16, 4 one row at a time.
    """
    batches = [
        [ev(0, rng_key, bytes([i % 256])) for i, rng_key in enumerate(
            f"k{(b * 7919 + i) % 1800}" if i % 5 else None for i in range(1500))]
        for b in range(2)
    ]
    results = []
    for limit in (None, variable_limit):
        with SqliteStore(tmp_path / f"meta-{limit}.db") as store:
            store.migrate()
            ids = define(store, {"t": ["x"]}, {"d": asset("x")})
            if limit is not None:
                store._connection().setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
                assert values_chunk(store._connection(), 4) == min(
                    512, 1 << ((limit // 4).bit_length() - 1))
            written = [
                store.write_events([PendingEvent(ids["t"], e.idem_key, e.payload) for e in batch])
                for batch in batches
            ]
            rows = [(e.idem_key, e.payload) for e in store.list_events(limit=10_000)]
            results.append((written, rows, store.counts()))
    assert results[0] == results[1]
    assert results[0][2]["trigger_events"] > 1500  # duplicates and fresh keys both happened
