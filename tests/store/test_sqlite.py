"""What only the SQLite store does: the file, WAL, stale definitions, the per-row reference.

``write_events`` is checked here against ``_reference_write_batch``, the
one-statement-per-row algorithm the set-based one replaced, table by table
(``sqlite_sequence`` included); the contract itself is checked on every
backend in ``test_store.py``.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream.store import (
    DagSpec,
    PendingEvent,
    Schedule,
    SqliteStore,
    StoreWriteError,
    WatcherSpec,
    WriteResult,
)
from sharedstream.store import sqlite as sqlite_store
from sharedstream.store._sqlite_events import values_chunk
from sharedstream.store.sqlite import MIGRATIONS
from tests.store.conftest import ALL_VERSIONS, LATEST
from tests.store.test_store import asset, define, ev, trig


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "meta.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(db_path) as s:
        s.migrate()
        yield s


def test_migrate_creates_the_file_and_is_idempotent(db_path: Path) -> None:
    assert not db_path.parent.exists()
    with SqliteStore(db_path) as s:
        assert s.migrate() == len(MIGRATIONS) == LATEST
        assert s.migrate() == LATEST
    assert db_path.is_file()
    with SqliteStore(db_path) as again:
        assert again.migrate() == LATEST
        assert again.counts() == {
            "triggers": 0,
            "trigger_events": 0,
            "asset_events": 0,
            "dag_runs": 0,
        }
    raw = sqlite3.connect(db_path)
    try:
        versions = raw.execute("SELECT version FROM schema_version").fetchall()
        assert versions == ALL_VERSIONS
    finally:
        raw.close()


def test_a_migrated_file_is_in_wal_mode(store: SqliteStore, db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        raw.close()


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
            "INSERT INTO trigger_events (trigger_id, idem_key, payload, trace_parent, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (idem_key) DO NOTHING",
            (event.trigger_id, event.idem_key, event.payload, event.trace_parent, now),
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
                "INSERT INTO dag_runs (dag_id, run_id, state, created_at, trace_parent)"
                " VALUES (?, ?, ?, ?, ?)",
                (dag_id, run_id, "queued", now, event.trace_parent),
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
    _foreign_keys_per_row = True  # SQLite itself checks the reference's references

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
# (trigger name or None for an unknown trigger id, idem key, payload, trace parent)
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
        PendingEvent(_UNKNOWN_TRIGGER if t is None else ids[f"fp-{t}"], key, payload, trace)
        for t, key, payload, trace in op[1]
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
            # write_events runs with foreign keys off: every reference must still hold
            assert new._read("PRAGMA foreign_key_check") == [], f"step {step}: {op}"
            assert new._read("PRAGMA foreign_keys") == [(op[0] != "write",)], f"step {step}"


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
    st.one_of(st.none(), st.sampled_from(("00-a-1-01", "00-b-2-01"))),
)
_write_ops = st.tuples(st.just("write"), st.lists(_events, min_size=1, max_size=30))
_ops = st.lists(
    # mostly writes; one_of picks its branches about evenly
    st.one_of(_write_ops, _write_ops, _write_ops, _write_ops, _sync_ops, st.just(("purge",))),
    max_size=10,
)


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
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
                rng.choice((None, f"00-{b:032x}-{i:016x}-01")),
            )
            for i in range(500)
        ]
        ops.append(("write", events))
        if b == 5:
            ops.append(("purge",))
    _assert_same_as_reference(ops, tmp_path)


@pytest.mark.parametrize("variable_limit", [999, 64, 6])
def test_large_batches_fit_a_lower_bound_parameter_limit(
    tmp_path: Path, variable_limit: int
) -> None:
    """Builds allowing fewer bound parameters per statement get smaller VALUES chunks.

    A trigger event binds 5 values per row and the batch's time once: a limit
    of 999 (SQLite before 3.32) allows 128 rows per statement, 64 allows 8,
    6 one row at a time.
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
                assert values_chunk(store._connection(), 5, 1) == min(
                    4096, 1 << (((limit - 1) // 5).bit_length() - 1))
            written = [
                store.write_events([PendingEvent(ids["t"], e.idem_key, e.payload, f"tp-{i}")
                                    for i, e in enumerate(batch)])
                for batch in batches
            ]
            rows = [(e.idem_key, e.payload, e.trace_parent)
                    for e in store.list_events(limit=10_000)]
            runs = [r.trace_parent for r in store.list_runs(limit=10_000)]
            results.append((written, rows, runs, store.counts()))
    assert results[0] == results[1]
    assert results[0][3]["trigger_events"] > 1500  # duplicates and fresh keys both happened


def test_opening_a_second_store_keeps_the_first_ones_writes_visible(tmp_path: Path) -> None:
    """A second store opened in-process (the dispatcher's) must not drop the first's file locks.

    Closing any descriptor of the database file drops every POSIX lock the
    process holds on it; another process would then checkpoint and delete
    the write-ahead log under the first connection, whose later commits
    went to an unlinked file no other process could see.
    """
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from sharedstream.store import open_store  # noqa: PLC0415

    path = tmp_path / "meta.db"
    first = SqliteStore(path)
    first.migrate()
    define(first, {"t": ["a"]}, {})
    second = open_store(f"sqlite:///{path}")  # checks the file, then opens it
    reader = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
              " print(c.execute('SELECT count(*) FROM trigger_events').fetchone()[0]); c.close()")
    subprocess.run([sys.executable, "-c", reader, str(path)], check=True, timeout=30)
    first.write_events([ev(1, "k1")])
    seen = subprocess.run([sys.executable, "-c", reader, str(path)], check=True, timeout=30,
                          capture_output=True, text=True).stdout.strip()
    assert seen == "1"
    assert Path(f"{path}-wal").exists()
    second.close()
    first.close()


def test_bytes_and_none_bind_through_identity_adapters_as_before(store: SqliteStore) -> None:
    # Opening a store registers them (sqlite3 otherwise formats and drops an
    # AttributeError per such parameter); what is stored must not change.
    assert sqlite3.adapters[(bytes, sqlite3.PrepareProtocol)](b"\x00ab") == b"\x00ab"
    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)](None) is None
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (v)")
    conn.executemany("INSERT INTO t VALUES (?)", [(b"\x00ab",), (None,), (b"",)])
    assert conn.execute("SELECT typeof(v), v FROM t ORDER BY rowid").fetchall() == [
        ("blob", b"\x00ab"), ("null", None), ("blob", b"")]


def test_an_applications_own_adapters_are_kept(tmp_path: Path) -> None:
    script = (
        "import sqlite3, sys\n"
        "mine = lambda value: b'mine'\n"
        "sqlite3.register_adapter(bytes, mine)\n"
        "from sharedstream.store import SqliteStore\n"
        "SqliteStore(sys.argv[1]).close()\n"
        "assert sqlite3.adapters[(bytes, sqlite3.PrepareProtocol)] is mine\n"
        "assert (type(None), sqlite3.PrepareProtocol) in sqlite3.adapters\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "s.db")], check=True)
