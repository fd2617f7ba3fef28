"""The SQLite metadata store: embedded, zero set-up, one writer at a time.

Connection: ``isolation_level=None`` (every transaction is an explicit
``BEGIN IMMEDIATE`` ... ``COMMIT``), ``journal_mode=WAL`` (readers never block
the writer), ``synchronous=FULL`` (a ``COMMIT`` that returned survives power
loss), ``foreign_keys=ON`` (but for ``write_events`` transactions, whose
references hold by construction: see :mod:`._sqlite_events`),
``busy_timeout=5000`` ms. One
:class:`SqliteStore` is one connection and must be used from one thread at a
time (the runtime gives it a dedicated writer thread); it may be created in
another thread than the one using it. Other processes and other instances
may open the same file: writes serialize on SQLite's write lock, reads see
what was committed.

Schema (version 5; ``schema_version`` holds one row per applied migration)::

    store_meta(key PK, value)                  definitions_generation counter
    triggers(id PK AUTOINCREMENT, fingerprint UNIQUE, classpath, kwargs_blob,
             state CHECK IN (active, finished, failed, orphaned),
             error_count, last_error, last_traceback, last_error_at,
             created_at, events_stored, triggerer_id)   owner of a standalone one
    assets(id PK AUTOINCREMENT, name UNIQUE, created_at)
    watchers(asset_id -> assets, name, trigger_id -> triggers,
             PK (asset_id, name))
    dags(dag_id PK, schedule JSON ('null': time only), updated_at,
         timetable JSON, timetable_summary, start_date, end_date, catchup,
         last_interval_*, next_*, revision)   bookkeeping: _dag_schedules
    dag_schedule_assets(dag_id -> dags CASCADE, asset_id -> assets, PK both)
    trigger_events(id PK AUTOINCREMENT, trigger_id -> triggers,
                   idem_key UNIQUE (NULLs never collide), payload BLOB, created_at,
                   trace_parent)   W3C traceparent text, as given
    asset_events(id PK AUTOINCREMENT, asset_id -> assets,
                 trigger_event_id -> trigger_events, created_at)
    asset_dag_queue(dag_id -> dags CASCADE, asset_event_id -> asset_events,
                    asset_id -> assets, PK (dag_id, asset_event_id))
    dag_runs(id PK AUTOINCREMENT, dag_id, run_id, state, created_at,
             run_type, logical_date, data_interval_start, data_interval_end,
             run_after, trace_parent, UNIQUE (dag_id, run_id))
    dag_run_asset_events(dag_run_id -> dag_runs, asset_event_id -> asset_events,
                         PK both)
    triggerers(id PK, hostname, pid, started_at, heartbeat_at, running JSON)
    dead_letters(id PK AUTOINCREMENT, created_at, stream, source, reason,
                 triggers JSON, payload BLOB prefix, payload_size, headers JSON,
                 UNIQUE (stream, source, reason))   formats: _rows

Datetimes are ISO-8601 text in UTC with microseconds
(``2025-01-02T03:04:05.123456+00:00``), so text order is time order.

Invariants:

1. Ids of ``trigger_events``, ``asset_events`` and ``dag_runs`` are
   ``AUTOINCREMENT``: never reused, even after rows are deleted, so the run id
   ``asset_triggered__{max consumed asset event id:012d}`` is unique per DAG
   forever, and "newest first" is "id descending".
2. An asset event is in at most one run per DAG: a run consumes, and the same
   transaction deletes, every queue entry of its DAG.
3. After :meth:`SqliteStore.write_events` commits, no DAG's queue satisfies its
   schedule: a DAG is evaluated after each stored trigger event that queued
   an asset event for it (once per trigger event, after all of its asset
   events are queued).
   Changing a schedule with :meth:`SqliteStore.sync_definitions` does not
   evaluate it; the next asset event for the DAG does.
4. ``dag_runs.dag_id`` has no foreign key: removing a DAG from the definitions
   drops its pending queue but keeps its run history.
5. ``store_meta.definitions_generation`` is bumped by every
   :meth:`SqliteStore.sync_definitions`; a store caches the watcher and
   schedule maps it needs for writing and reloads them, inside the write
   transaction, whenever the generation moved (also when another connection
   synced).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter
from sharedstream.store._dag_schedules import (
    Dialect,
    list_dags,
    queue_runs,
    sync_dags,
)
from sharedstream.store._shared_sql import SharedSql, check_definitions
from sharedstream.store._sqlite_checkpoints import BACKSTOP_PAGES, Checkpointer
from sharedstream.store._sqlite_dead_letters import insert_dead_letter
from sharedstream.store._sqlite_events import (
    Definitions,
    StaleDefinitions,
    bind_as_is,
    load_definitions,
    write_batch,
)
from sharedstream.store._sqlite_schema import MIGRATIONS
from sharedstream.store.base import (
    Claim,
    DagRow,
    DagSpec,
    PendingEvent,
    QueuedRuns,
    SchemaStatus,
    StoreError,
    StoreWriteError,
    TimedRun,
    TriggerSpec,
    WatcherSpec,
    WriteResult,
)

__all__ = ["MIGRATIONS", "SqliteStore"]

log = key_value_logger("sharedstream.store")

def _now() -> str:
    return _fmt(datetime.now(UTC))


def _fmt(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


DIALECT = Dialect(param="?", write_time=_fmt, read_time=_parse, lock="",
                  aggregate="(SELECT json_group_array({column}) {rest})", items=json.loads)
"""Times as ISO text; no row lock (the ``BEGIN IMMEDIATE`` writer is alone); lists as JSON."""


class SqliteStore(SharedSql):
    """The :class:`~sharedstream.store.base.MetadataStore` on one SQLite file.

    Creates the file and its parent directories when missing; call
    :meth:`migrate` before anything else. One instance is one connection, to
    be used from one thread at a time. Close it (or use it as a context
    manager); a closed store raises :class:`StoreError`.
    """

    _dialect = DIALECT

    _foreign_keys_per_row = False
    """Whether ``write_events`` leaves SQLite's per-row foreign-key checks on (tests' reference)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self._defs = Definitions()
        bind_as_is()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open metadata database {self.path}: {exc}") from exc
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open metadata database {self.path}: {exc}") from exc
        self._conn: sqlite3.Connection | None = conn
        self._foreign_keys_on = True
        self._checkpointer: Checkpointer | None = None
        self._checkpointer_failed = False

    # -- plumbing ---------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"metadata store {self.path} is closed")
        return self._conn

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("rollback failed")

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; rolled back on any exception.

        A ``sqlite3.Error`` becomes :class:`StoreWriteError`; our own errors
        (validation) propagate unchanged.
        """
        conn = self._connection()
        try:
            self._enforce_foreign_keys(conn, on=True)
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            self._rollback(conn)
            if isinstance(exc, sqlite3.Error):
                raise StoreWriteError(f"{what} failed and was rolled back: {exc}") from exc
            raise

    def _enforce_foreign_keys(self, conn: sqlite3.Connection, *, on: bool) -> None:
        """Turn foreign-key enforcement on or off for the next transactions, if it is not.

        On for every mutation but ``write_events`` (``ON DELETE CASCADE``
        needs it); switched only when it changes, because the pragma (valid
        only outside a transaction) expires every prepared statement, and a
        batch's large ``INSERT`` statements cost more to prepare again than
        to run.
        """
        if self._foreign_keys_on != on:
            conn.execute("PRAGMA foreign_keys = ON" if on else "PRAGMA foreign_keys = OFF")
            self._foreign_keys_on = on

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        conn = self._connection()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"reading {self.path} failed: {exc}") from exc

    def close(self) -> None:
        """Close the connection (and stop the checkpoint thread); idempotent."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._rollback(conn)
            conn.close()

    # -- schema -----------------------------------------------------------------

    def migrate(self) -> int:
        """Apply every migration the database lacks, each in its own transaction.

        Idempotent, and safe against another process migrating concurrently
        (each step re-reads the version under the write lock). Returns the
        schema version (``len(MIGRATIONS)``). Raises :class:`StoreError` when
        the database was migrated by a newer sharedstream.
        """
        with self._write("creating schema_version") as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
            )
        for version, statements in enumerate(MIGRATIONS, start=1):
            with self._write(f"migration {version}") as conn:
                current = self._schema_version(conn)
                if current >= version:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, _now()),
                )
        return len(MIGRATIONS)

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
        current = int(version)
        if current > len(MIGRATIONS):
            raise StoreError(
                f"metadata database {self.path} has schema version {current}, newer than"
                f" the {len(MIGRATIONS)} this sharedstream supports; upgrade sharedstream"
            )
        return current

    def schema_status(self) -> SchemaStatus:
        """The file's schema version (0 before any migration) and this code's."""
        (row,) = self._read(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        )
        current = 0
        if row[0]:
            ((version,),) = self._read("SELECT coalesce(max(version), 0) FROM schema_version")
            current = int(version)
        return SchemaStatus(current=current, latest=len(MIGRATIONS))

    # -- definitions ------------------------------------------------------------

    def sync_definitions(
        self,
        triggers: Sequence[TriggerSpec],
        watchers: Sequence[WatcherSpec],
        dags: Sequence[DagSpec],
    ) -> dict[str, int]:
        """Register the definitions in one transaction; returns fingerprint -> trigger id.

        Triggers are upserted by fingerprint (classpath and blob updated; the
        last spec wins for a repeated fingerprint). A trigger some watcher
        references is active: an orphaned or failed one is reactivated with
        its error history kept, a finished one stays finished. Every other
        trigger (given or only in the database) becomes orphaned. Watchers and
        DAGs are replaced wholesale; a DAG that stays keeps the queue entries
        of assets its schedule still mentions. Raises :class:`StoreError`
        (nothing changed) for a watcher naming a trigger not in ``triggers``,
        a repeated watcher ``(asset, name)`` or ``dag_id``, or an invalid
        schedule.
        """
        specs, referenced, schedules, asset_names = check_definitions(triggers, watchers, dags)
        now = _now()
        with self._write("sync_definitions") as conn:
            # Update the known triggers and insert only the new ones: an upsert that
            # takes its UPDATE branch still burns an AUTOINCREMENT id in SQLite, and
            # ids would skip numbers at every restart.
            known = {
                str(fingerprint): int(trigger_id)
                for trigger_id, fingerprint in conn.execute(
                    "SELECT id, fingerprint FROM triggers"
                    " WHERE fingerprint IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(specs)),),
                )
            }
            ids: dict[str, int] = {}
            for spec in specs.values():
                state = "active" if spec.fingerprint in referenced else "orphaned"
                if spec.fingerprint in known:
                    conn.execute(
                        "UPDATE triggers SET classpath = CASE WHEN ? THEN classpath ELSE ? END,"
                        " kwargs_blob = CASE WHEN ? THEN kwargs_blob ELSE ? END,"
                        " state = CASE WHEN ? = 'active' AND state = 'finished'"
                        "  THEN 'finished' ELSE ? END, queue = ?"
                        " WHERE id = ?",
                        (spec.pinned, spec.classpath, spec.pinned, spec.kwargs_blob, state, state,
                         spec.queue, known[spec.fingerprint]),
                    )
                    ids[spec.fingerprint] = known[spec.fingerprint]
                    continue
                (trigger_id,) = conn.execute(
                    "INSERT INTO triggers (fingerprint, classpath, kwargs_blob, state, created_at,"
                    " queue) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                    (spec.fingerprint, spec.classpath, spec.kwargs_blob, state, now, spec.queue),
                ).fetchone()
                ids[spec.fingerprint] = int(trigger_id)
            conn.execute(
                "UPDATE triggers SET state = 'orphaned' WHERE state != 'orphaned'"
                " AND fingerprint NOT IN (SELECT value FROM json_each(?))",
                (json.dumps(sorted(referenced)),),
            )
            known_assets = {
                str(name)
                for (name,) in conn.execute(
                    "SELECT name FROM assets WHERE name IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(asset_names)),),
                )
            }
            conn.executemany(  # only the new names, so no id is burned (see above)
                "INSERT INTO assets (name, created_at) VALUES (?, ?)",
                [(name, now) for name in asset_names if name not in known_assets],
            )
            asset_ids = {
                str(name): int(asset_id)
                for asset_id, name in conn.execute(
                    "SELECT id, name FROM assets WHERE name IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(asset_names)),),
                )
            }
            conn.execute("DELETE FROM watchers")
            conn.executemany(
                "INSERT INTO watchers (asset_id, name, trigger_id) VALUES (?, ?, ?)",
                [(asset_ids[w.asset], w.name, ids[w.trigger_fingerprint]) for w in watchers],
            )
            sync_dags(conn, DIALECT, dags, _parse(now))
            conn.execute("DELETE FROM dag_schedule_assets")
            conn.executemany(
                "INSERT INTO dag_schedule_assets (dag_id, asset_id) VALUES (?, ?)",
                [
                    (dag_id, asset_ids[name])
                    for dag_id, schedule in schedules.items()
                    for name in sorted(schedule.assets)
                ],
            )
            conn.execute(
                "DELETE FROM asset_dag_queue WHERE NOT EXISTS ("
                " SELECT 1 FROM dag_schedule_assets s WHERE s.dag_id = asset_dag_queue.dag_id"
                " AND s.asset_id = asset_dag_queue.asset_id)"
            )
            conn.execute(
                "UPDATE store_meta SET value = value + 1 WHERE key = 'definitions_generation'"
            )
        return ids

    def _definitions(self, conn: sqlite3.Connection) -> Definitions:
        """The cached definitions, reloaded if the generation moved (call inside a transaction)."""
        (generation,) = conn.execute(
            "SELECT value FROM store_meta WHERE key = 'definitions_generation'"
        ).fetchone()
        if generation != self._defs.generation:
            self._defs = load_definitions(conn, int(generation))
        return self._defs

    # -- events -----------------------------------------------------------------

    def write_events(self, batch: Sequence[PendingEvent]) -> WriteResult:
        """Store a batch in one transaction (group commit) and derive asset events and runs.

        Per event, in batch order: a non-``None`` ``idem_key`` that is already
        stored (earlier in this batch or before) makes it a duplicate and
        nothing else happens for it. Otherwise the trigger event is stored,
        one asset event is created per asset watching its trigger, each joins
        the queue of every DAG whose schedule mentions the asset. Then (once
        per event, after all its asset events are queued) every such DAG whose
        schedule is satisfied by the assets in its queue gets one queued run
        consuming the whole queue, with run id
        ``asset_triggered__{max consumed asset event id:012d}``.

        Durable when it returns. Any exception rolls the whole batch back and
        is raised as :class:`StoreWriteError` (``retryable``) chained to the
        cause; an unknown ``trigger_id`` is such a failure (foreign key).
        """
        conn = self._connection()
        if not batch:
            return WriteResult(stored=0, duplicates=0, asset_events=0, dag_runs=())
        # Foreign keys hold by construction here (write_batch checks the one
        # reference it is given, the trigger ids; every other id it writes it
        # has just read or created), and checking them again per row was an
        # eighth of the batch's cost. See _enforce_foreign_keys.
        self._enforce_foreign_keys(conn, on=self._foreign_keys_per_row)
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = self._write_batch(conn, batch)
            conn.execute("COMMIT")
        except Exception as exc:
            self._rollback(conn)
            raise StoreWriteError(
                f"write_events: batch of {len(batch)} events rolled back: {exc}"
            ) from exc
        except BaseException:
            self._rollback(conn)
            raise
        self._poke_checkpointer(conn)
        return result

    def _poke_checkpointer(self, conn: sqlite3.Connection) -> None:
        """After a ``write_events`` commit: let the checkpoint thread copy the log back.

        The thread starts on first use; from then on this connection
        checkpoints by itself only past
        :data:`~sharedstream.store._sqlite_checkpoints.BACKSTOP_PAGES`. When
        it cannot start, this connection keeps checkpointing as SQLite does
        by default (logged once); the batch is stored either way, so nothing
        here may raise: a batch reported failed after its commit would be
        written again, and events without an idempotency key twice.
        """
        if self._checkpointer is None:
            if self._checkpointer_failed:
                return
            checkpointer = None
            try:
                # The file this connection has open, however the process moved since.
                main = next(row[2] for row in conn.execute("PRAGMA database_list")
                            if row[1] == "main")
                checkpointer = Checkpointer(Path(main))
                conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
                self._checkpointer = checkpointer
            except Exception as exc:  # noqa: BLE001 - the batch is committed (see above)
                if checkpointer is not None:
                    checkpointer.close()
                self._checkpointer_failed = True
                log.warning("WAL checkpoints stay in the writer's commits", error=str(exc))
                return
        self._checkpointer.poke()

    def _write_batch(self, conn: sqlite3.Connection, batch: Sequence[PendingEvent]) -> WriteResult:
        """:func:`~sharedstream.store._sqlite_events.write_batch` with the cached definitions.

        Definitions found stale (the watchers table changed behind
        ``sync_definitions``' back) fail the batch and are reloaded on the retry.
        """
        try:
            return write_batch(conn, self._definitions(conn), batch, _now())
        except StaleDefinitions:
            self._defs = Definitions()
            raise

    # -- triggerers -------------------------------------------------------------

    def heartbeat(
        self, triggerer_id: str, hostname: str, pid: int, running: Sequence[int] = ()
    ) -> None:
        """Record that the triggerer is alive and what it runs; the first sets ``started_at``."""
        now = _now()
        with self._write("heartbeat") as conn:
            conn.execute(
                "INSERT INTO triggerers (id, hostname, pid, started_at, heartbeat_at, running)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                "  hostname = excluded.hostname, pid = excluded.pid,"
                "  heartbeat_at = excluded.heartbeat_at, running = excluded.running",
                (triggerer_id, hostname, pid, now, now, json.dumps(sorted(running))),
            )

    def claim_triggers(
        self, triggerer_id: str, candidates: Sequence[int], capacity: int, threshold: float
    ) -> Claim:
        """Keep and take standalone triggers; the rules of the protocol, in one transaction.

        ``BEGIN IMMEDIATE`` serializes it with every other writer, so no
        trigger gets two owners; a triggerer is alive when its heartbeat is
        within ``threshold`` seconds of this machine's clock.
        """
        wanted = sorted(set(candidates))
        cutoff = _fmt(datetime.now(UTC) - timedelta(seconds=threshold))
        with self._write("claim_triggers") as conn:
            rows = conn.execute(
                "SELECT t.id, t.triggerer_id, t.triggerer_id IS NULL OR t.triggerer_id = ?"
                "  OR NOT EXISTS (SELECT 1 FROM triggerers r WHERE r.id = t.triggerer_id"
                "   AND r.heartbeat_at > ?)"
                " FROM triggers t, json_each(?) c WHERE t.id = c.value AND t.state = 'active'"
                " ORDER BY t.id",
                (triggerer_id, cutoff, json.dumps(wanted)),
            ).fetchall()
            owned = [int(row[0]) for row in rows if row[1] == triggerer_id]
            free = [int(row[0]) for row in rows if row[1] != triggerer_id and row[2]]
            taken = free[: max(0, capacity - len(owned))]
            conn.executemany(
                "UPDATE triggers SET triggerer_id = ? WHERE id = ?",
                [(triggerer_id, trigger_id) for trigger_id in taken],
            )
        mine = sorted([*owned, *taken])
        return Claim(owned=tuple(mine), elsewhere=len(rows) - len(mine))

    def release_triggers(self, triggerer_id: str) -> None:
        """Give up every trigger ``triggerer_id`` owns; idempotent."""
        with self._write("release_triggers") as conn:
            conn.execute(
                "UPDATE triggers SET triggerer_id = NULL WHERE triggerer_id = ?", (triggerer_id,)
            )

    # -- dead letters -----------------------------------------------------------

    def add_dead_letter(self, letter: DeadLetter) -> bool:
        """Keep the letter unless its ``(stream, source, reason)`` is kept; ``True`` if new.

        One transaction, durable when it returns; the payload is cut to
        ``DEAD_LETTER_PAYLOAD_LIMIT`` bytes, its whole size kept. An SQLite
        failure rolls back and raises :class:`StoreWriteError` (``retryable``).
        """
        with self._write("add_dead_letter") as conn:
            return insert_dead_letter(conn, letter, _now())

    # -- time-based schedules ---------------------------------------------------

    def list_dags(self) -> list[DagRow]:
        """Every DAG, by id, with its time-schedule bookkeeping and newest run."""
        conn = self._connection()
        try:
            return list_dags(conn, DIALECT)
        except sqlite3.Error as exc:
            raise StoreError(f"reading {self.path} failed: {exc}") from exc

    def queue_timed_runs(
        self, dag_id: str, revision: int, runs: Sequence[TimedRun], next_run: TimedRun | None
    ) -> QueuedRuns:
        """Queue due time-based runs and advance the bookkeeping if ``revision`` is current.

        ``BEGIN IMMEDIATE`` makes the compare-and-set and the inserts one
        writer's: no other connection changes the DAG in between.
        """
        with self._write("queue_timed_runs") as conn:
            return queue_runs(conn, DIALECT, dag_id, revision, runs, next_run, datetime.now(UTC))
