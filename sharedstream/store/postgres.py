"""The PostgreSQL metadata store: several triggerers, on several machines, on one database.

Driver: psycopg 3 (synchronous, like the store contract) with a
``psycopg_pool.ConnectionPool``. Every method borrows a connection for one
transaction and gives it back, so an instance may be shared between threads,
although the runtime uses it from its one database thread. Connections are
set up with ``TimeZone = UTC`` and, should the server have it off,
``synchronous_commit = on``: a ``COMMIT`` that returned is on disk.

Isolation: ``READ COMMITTED`` (PostgreSQL's default), with the constraints
and row locks that :mod:`sharedstream.store._postgres_events` lists making
concurrent writers from several processes safe: a unique idempotency key is
stored once cluster-wide, a DAG's queue is changed under a lock on its
``dags`` row, so no run is created twice; a time-scheduled DAG's
bookkeeping is compared and set under the same row lock
(``queue_timed_runs``), so of several triggerers deciding the same runs one
queues them. ``sync_definitions`` first updates the
``definitions_generation`` row, which every writer share-locks, so
definitions never change under a batch.

Schema: the same tables and versions as the SQLite store
(:mod:`sharedstream.store._postgres_schema`), ids from sequences (never
reused: newest first is id descending; ids of concurrent writers need not
be in commit order), times as ``TIMESTAMPTZ``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter
from sharedstream.store._dag_schedules import (
    Dialect,
    list_dags,
    queue_runs,
    sync_dags,
)
from sharedstream.store._postgres_events import definitions, write_batch
from sharedstream.store._postgres_schema import MIGRATION_LOCK, MIGRATIONS
from sharedstream.store._rows import (
    dead_letter_values,
)
from sharedstream.store._shared_sql import SharedSql, check_definitions
from sharedstream.store._write_plan import Definitions
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
    redact_url,
)

__all__ = ["MIGRATIONS", "PostgresStore"]

log = key_value_logger("sharedstream.store")

def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


DIALECT = Dialect(param="%s", write_time=_utc, read_time=_utc, lock=" FOR UPDATE",
                  aggregate="array(SELECT {column} {rest})", items=list,
                  member="{column} = ANY(?)", list_param=list,
                  skip_locked=" FOR UPDATE OF r SKIP LOCKED")
"""Times as ``TIMESTAMPTZ``; a DAG row being changed is locked; lists as arrays; claims skip
rows another transaction holds."""


def _configure(conn: psycopg.Connection) -> None:
    """Every pooled connection: UTC times, and commits that wait for the disk."""
    conn.autocommit = True
    conn.execute("SET TIME ZONE 'UTC'")
    row = conn.execute("SHOW synchronous_commit").fetchone()
    if row is not None and row[0] == "off":
        conn.execute("SET synchronous_commit = on")
    conn.autocommit = False


class PostgresStore(SharedSql):
    """The :class:`~sharedstream.store.base.MetadataStore` on a PostgreSQL database.

    ``url`` is a libpq URL (``postgresql://user:password@host:port/database``);
    the database must exist, :meth:`migrate` creates the tables. Connecting
    checks the server answers within ``connect_timeout`` seconds
    (:class:`StoreError` naming the URL, password hidden, otherwise). The pool
    keeps at most ``pool_size`` connections; borrowing one waits at most
    ``pool_timeout`` seconds (then the operation fails, retryable for writes).
    Close it (or use it as a context manager); a closed store raises
    :class:`StoreError`.
    """

    _dialect = DIALECT

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        pool_timeout: float = 30.0,
    ) -> None:
        self.location = redact_url(url)
        self._defs = Definitions()
        try:
            # One plain connection first: its error says why (refused, no such
            # database, authentication) where a pool would only time out.
            psycopg.connect(url, connect_timeout=max(1, round(connect_timeout))).close()
        except psycopg.Error as exc:
            reason = " ".join(str(exc).split())
            raise StoreError(f"cannot connect to {self.location}: {reason}") from exc
        self._pool: ConnectionPool | None = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            timeout=pool_timeout,
            configure=_configure,
            kwargs={"connect_timeout": max(1, round(connect_timeout))},
            name="sharedstream-store",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except psycopg.Error as exc:
            self._pool.close()
            raise StoreError(f"cannot connect to {self.location}: {exc}") from exc

    # -- plumbing ---------------------------------------------------------------

    def _connections(self) -> ConnectionPool:
        if self._pool is None:
            raise StoreError(f"metadata store {self.location} is closed")
        return self._pool

    @contextmanager
    def _write(self, what: str) -> Iterator[psycopg.Connection]:
        """One transaction on a pooled connection; rolled back on any exception.

        A ``psycopg.Error`` becomes :class:`StoreWriteError`; our own errors
        (validation) propagate unchanged.
        """
        pool = self._connections()
        try:
            with pool.connection() as conn, conn.transaction():
                yield conn
        except psycopg.Error as exc:
            raise StoreWriteError(f"{what} failed and was rolled back: {exc}") from exc

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        pool = self._connections()
        try:
            with pool.connection() as conn:
                return conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"reading {self.location} failed: {exc}") from exc

    def _clock(self, conn: psycopg.Connection) -> datetime:
        """The server's time (its transaction's), as heartbeats are stamped: claims compare it."""
        row = conn.execute("SELECT now()").fetchone()
        return datetime.now(UTC) if row is None else _utc(row[0])

    def close(self) -> None:
        """Close the pool and its connections; idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- schema -----------------------------------------------------------------

    def migrate(self) -> int:
        """Apply every migration the database lacks, each in its own transaction.

        Idempotent, and safe against other processes migrating concurrently
        (each step holds an advisory lock and re-reads the version). Returns
        the schema version (``len(MIGRATIONS)``). Raises :class:`StoreError`
        when the database was migrated by a newer sharedstream.
        """
        with self._write("creating schema_version") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)"
            )
        for version, statements in enumerate(MIGRATIONS, start=1):
            with self._write(f"migration {version}") as conn:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                if self._schema_version(conn) >= version:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
                    (version, datetime.now(UTC)),
                )
        return len(MIGRATIONS)

    def _schema_version(self, conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
        current = int(row[0]) if row else 0
        if current > len(MIGRATIONS):
            raise StoreError(
                f"metadata database {self.location} has schema version {current}, newer than"
                f" the {len(MIGRATIONS)} this sharedstream supports; upgrade sharedstream"
            )
        return current

    def schema_status(self) -> SchemaStatus:
        """The database's schema version (0 before any migration) and this code's."""
        (row,) = self._read("SELECT to_regclass('schema_version') IS NOT NULL")
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
        """Register the definitions in one transaction; the same rules as the SQLite store.

        Takes the ``definitions_generation`` row first (waiting for batches
        being written, making later ones wait), so two triggerers syncing at
        once take turns. Raises :class:`StoreError` (nothing changed) for a
        watcher naming a trigger not in ``triggers``, a repeated watcher
        ``(asset, name)`` or ``dag_id``, or an invalid schedule.
        """
        specs, referenced, schedules, asset_names = check_definitions(triggers, watchers, dags)
        now = datetime.now(UTC)
        with self._write("sync_definitions") as conn:
            conn.execute(
                "UPDATE store_meta SET value = value + 1 WHERE key = 'definitions_generation'"
            )
            # Update the known triggers and insert only the new ones, so that ids
            # are not used up by every restart (an upsert takes one each time).
            known = {
                str(fingerprint): int(trigger_id)
                for trigger_id, fingerprint in conn.execute(
                    "SELECT id, fingerprint FROM triggers WHERE fingerprint = ANY(%s)",
                    (sorted(specs),),
                )
            }
            ids: dict[str, int] = {}
            for spec in specs.values():
                state = "active" if spec.fingerprint in referenced else "orphaned"
                if spec.fingerprint in known:
                    conn.execute(
                        "UPDATE triggers SET classpath = CASE WHEN %s THEN classpath ELSE %s END,"
                        " kwargs_blob = CASE WHEN %s THEN kwargs_blob ELSE %s END,"
                        " state = CASE WHEN %s = 'active' AND state = 'finished'"
                        "  THEN 'finished' ELSE %s END, queue = %s"
                        " WHERE id = %s",
                        (spec.pinned, spec.classpath, spec.pinned, spec.kwargs_blob, state, state,
                         spec.queue, known[spec.fingerprint]),
                    )
                    ids[spec.fingerprint] = known[spec.fingerprint]
                    continue
                row = conn.execute(
                    "INSERT INTO triggers (fingerprint, classpath, kwargs_blob, state, created_at,"
                    " queue) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                    (spec.fingerprint, spec.classpath, spec.kwargs_blob, state, now, spec.queue),
                ).fetchone()
                assert row is not None  # noqa: S101 - INSERT ... RETURNING returns the row
                ids[spec.fingerprint] = int(row[0])
            conn.execute(
                "UPDATE triggers SET state = 'orphaned' WHERE state != 'orphaned'"
                " AND NOT (fingerprint = ANY(%s))",
                (sorted(referenced),),
            )
            known_assets = {
                str(name)
                for (name,) in conn.execute(
                    "SELECT name FROM assets WHERE name = ANY(%s)", (asset_names,)
                )
            }
            conn.execute(  # only the new names, so no id is used up (see above)
                "INSERT INTO assets (name, created_at) SELECT n, %s FROM unnest(%s::text[]) AS n",
                (now, [name for name in asset_names if name not in known_assets]),
            )
            asset_ids = {
                str(name): int(asset_id)
                for asset_id, name in conn.execute(
                    "SELECT id, name FROM assets WHERE name = ANY(%s)", (asset_names,)
                )
            }
            conn.execute("DELETE FROM watchers")
            if watchers:
                conn.cursor().executemany(
                    "INSERT INTO watchers (asset_id, name, trigger_id) VALUES (%s, %s, %s)",
                    [(asset_ids[w.asset], w.name, ids[w.trigger_fingerprint]) for w in watchers],
                )
            sync_dags(conn, DIALECT, dags, now)
            conn.execute("DELETE FROM dag_schedule_assets")
            pairs = [
                (dag_id, asset_ids[name])
                for dag_id, schedule in schedules.items()
                for name in sorted(schedule.assets)
            ]
            if pairs:
                conn.cursor().executemany(
                    "INSERT INTO dag_schedule_assets (dag_id, asset_id) VALUES (%s, %s)", pairs
                )
            conn.execute(
                "DELETE FROM asset_dag_queue WHERE NOT EXISTS ("
                " SELECT 1 FROM dag_schedule_assets s WHERE s.dag_id = asset_dag_queue.dag_id"
                " AND s.asset_id = asset_dag_queue.asset_id)"
            )
        return ids

    # -- events -----------------------------------------------------------------

    def write_events(self, batch: Sequence[PendingEvent]) -> WriteResult:
        """Store a batch in one transaction (group commit); see the protocol for the semantics.

        Safe against other processes writing at once (module
        :mod:`sharedstream.store._postgres_events`): a key stored by any of
        them is a duplicate here, and a DAG gets no run twice. Durable when it
        returns. Any exception rolls the whole batch back and is raised as
        :class:`StoreWriteError` (``retryable``) chained to the cause; an
        unknown ``trigger_id`` is such a failure (foreign key).
        """
        pool = self._connections()
        if not batch:
            return WriteResult(stored=0, duplicates=0, asset_events=0, dag_runs=())
        try:
            with pool.connection() as conn, conn.transaction():
                defs = self._defs = definitions(conn, self._defs)
                return write_batch(conn, defs, batch, datetime.now(UTC))
        except Exception as exc:
            raise StoreWriteError(
                f"write_events: batch of {len(batch)} events rolled back: {exc}"
            ) from exc

    # -- triggerers -------------------------------------------------------------

    def heartbeat(
        self, triggerer_id: str, hostname: str, pid: int, running: Sequence[int] = ()
    ) -> None:
        """Record that the triggerer is alive and what it runs, stamped with the server's clock.

        The server's clock (``now()``), so that :meth:`claim_triggers` compares
        heartbeats of triggerers on several machines with one clock. The first
        call also sets ``started_at``.
        """
        with self._write("heartbeat") as conn:
            conn.execute(
                "INSERT INTO triggerers (id, hostname, pid, started_at, heartbeat_at, running)"
                " VALUES (%s, %s, %s, now(), now(), %s) ON CONFLICT (id) DO UPDATE SET"
                "  hostname = excluded.hostname, pid = excluded.pid,"
                "  heartbeat_at = excluded.heartbeat_at, running = excluded.running",
                (triggerer_id, hostname, pid, json.dumps(sorted(running))),
            )

    def claim_triggers(
        self, triggerer_id: str, candidates: Sequence[int], capacity: int, threshold: float
    ) -> Claim:
        """Keep and take standalone triggers; the rules of the protocol, in one transaction.

        What it owns is read without locks (only a taker changes an owner, and
        only once the owner's heartbeat is stale). What it may take is
        selected ``FOR UPDATE SKIP LOCKED``: a row another triggerer is
        claiming, or one whose ``events_stored`` a write is updating, is
        skipped this round rather than waited for. A taken row is re-checked
        under its lock (``READ COMMITTED`` re-evaluates the condition on the
        newest version), so two claimers never both take it.
        """
        wanted = sorted(set(candidates))
        with self._write("claim_triggers") as conn:
            owned = [
                int(trigger_id)
                for (trigger_id,) in conn.execute(
                    "SELECT id FROM triggers WHERE id = ANY(%s) AND state = 'active'"
                    " AND triggerer_id = %s ORDER BY id",
                    (wanted, triggerer_id),
                )
            ]
            room = max(0, capacity - len(owned))
            taken: list[int] = []
            if room:
                taken = [
                    int(trigger_id)
                    for (trigger_id,) in conn.execute(
                        "SELECT t.id FROM triggers t WHERE t.id = ANY(%s) AND t.state = 'active'"
                        " AND (t.triggerer_id IS NULL OR (t.triggerer_id != %s AND NOT EXISTS ("
                        "  SELECT 1 FROM triggerers r WHERE r.id = t.triggerer_id"
                        "  AND r.heartbeat_at > now() - make_interval(secs => %s))))"
                        " ORDER BY t.id LIMIT %s FOR UPDATE OF t SKIP LOCKED",
                        (wanted, triggerer_id, threshold, room),
                    )
                ]
                if taken:
                    conn.execute(
                        "UPDATE triggers SET triggerer_id = %s WHERE id = ANY(%s)",
                        (triggerer_id, taken),
                    )
            row = conn.execute(
                "SELECT count(*) FROM triggers WHERE id = ANY(%s) AND state = 'active'",
                (wanted,),
            ).fetchone()
        active = int(row[0]) if row else 0
        mine = sorted([*owned, *taken])
        return Claim(owned=tuple(mine), elsewhere=max(0, active - len(mine)))

    def release_triggers(self, triggerer_id: str) -> None:
        """Give up every trigger ``triggerer_id`` owns; idempotent."""
        with self._write("release_triggers") as conn:
            conn.execute(
                "UPDATE triggers SET triggerer_id = NULL WHERE triggerer_id = %s", (triggerer_id,)
            )

    # -- dead letters -----------------------------------------------------------

    def add_dead_letter(self, letter: DeadLetter) -> bool:
        """Keep the letter unless its ``(stream, source, reason)`` is kept; ``True`` if new.

        One transaction, durable when it returns; formats as in the SQLite
        store (:mod:`sharedstream.store._rows`). A failure
        rolls back and raises :class:`StoreWriteError` (``retryable``).
        """
        with self._write("add_dead_letter") as conn:
            cur = conn.execute(
                "INSERT INTO dead_letters (created_at, stream, source, reason, triggers, payload,"
                " payload_size, headers) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (stream, source, reason) DO NOTHING",
                dead_letter_values(letter, datetime.now(UTC)),
            )
            return cur.rowcount == 1

    # -- time-based schedules ---------------------------------------------------

    def list_dags(self) -> list[DagRow]:
        """Every DAG, by id, with its time-schedule bookkeeping and newest run."""
        pool = self._connections()
        try:
            with pool.connection() as conn:
                return list_dags(conn, DIALECT)
        except psycopg.Error as exc:
            raise StoreError(f"reading {self.location} failed: {exc}") from exc

    def queue_timed_runs(
        self, dag_id: str, revision: int, runs: Sequence[TimedRun], next_run: TimedRun | None
    ) -> QueuedRuns:
        """Queue due time-based runs and advance the bookkeeping if ``revision`` is current.

        The DAG's row is locked (``FOR UPDATE``) before the revision is
        compared: a second triggerer waits for the first to commit, then
        finds the revision moved and writes nothing.
        """
        with self._write("queue_timed_runs") as conn:
            return queue_runs(conn, DIALECT, dag_id, revision, runs, next_run, datetime.now(UTC))
