"""The outbox's SQL, the same for both stores (:mod:`sharedstream.store.outbox`).

:class:`OutboxSql` is a base of :class:`~sharedstream.store._shared_sql.SharedSql`:
every store gets the dispatch methods from it, given its ``_write``
transaction, its ``_read`` and its :class:`~sharedstream.store._dag_schedules.Dialect`.
What differs per backend is in the dialect (placeholders, times, lists,
``FOR UPDATE ... SKIP LOCKED``) and in :meth:`OutboxSql._clock`, the time a
transaction compares heartbeats and retry times with: this process's clock
for SQLite (one machine), the server's for PostgreSQL (several machines,
one clock, as for heartbeats themselves).

Every value is a bound parameter; only constant fragments are concatenated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sharedstream.store._sql_access import SqlAccess
from sharedstream.store.base import StoreError
from sharedstream.store.outbox import (
    ATTEMPT_OUTPUT_LIMIT,
    FINISHED_STATES,
    RUN_STATES,
    AttemptRow,
    ClaimedRun,
    DispatchResult,
    PruneResult,
    RunEvent,
)

__all__ = ["OutboxSql"]

_DOC_COLUMNS = (
    "r.id, r.dag_id, r.run_id, r.run_type, r.state, r.attempts, r.attempt_base, r.target,"
    " r.created_at, r.logical_date, r.data_interval_start, r.data_interval_end, r.run_after,"
    " r.conf, r.trace_parent, r.external_id, r.external_url"
)
_EVENTS = (
    "SELECT l.dag_run_id, ae.id, a.name, te.id, te.payload, te.created_at, te.trace_parent"
    " FROM dag_run_asset_events l JOIN asset_events ae ON ae.id = l.asset_event_id"
    " JOIN assets a ON a.id = ae.asset_id JOIN trigger_events te ON te.id = ae.trigger_event_id"
    " WHERE {runs} ORDER BY l.dag_run_id, ae.id"
)
# A claim whose triggerer is gone: no heartbeat within the threshold.
_DEAD_CLAIM = (
    "(r.claimed_by IS NULL OR (r.claimed_by != ? AND NOT EXISTS ("
    " SELECT 1 FROM triggerers t WHERE t.id = r.claimed_by AND t.heartbeat_at > ?)))"
)
# The run's last attempt has no outcome yet: a delivery under way (dispatching), or a run
# its target runs in place (the local command target's running) - not one a target took.
_OPEN_ATTEMPT = (
    "EXISTS (SELECT 1 FROM dag_run_attempts a WHERE a.dag_run_id = r.id"
    " AND a.attempt = r.attempts AND a.outcome IS NULL)"
)
_OUTCOME_UNKNOWN = "its triggerer stopped before recording what the target answered"
_FOLLOWED = ("dispatched", "running")


def _cut(output: str | None) -> str | None:
    """The end of ``output``, at most :data:`ATTEMPT_OUTPUT_LIMIT` characters."""
    if output is None or len(output) <= ATTEMPT_OUTPUT_LIMIT:
        return output
    return "[...]" + output[-(ATTEMPT_OUTPUT_LIMIT - 5):]


class OutboxSql(SqlAccess):
    """The dispatch methods of a store (:class:`~sharedstream.store.outbox.OutboxStore`)."""

    # -- helpers -------------------------------------------------------------------

    def _documents(
        self, conn: Any, ids: Sequence[int], *, recovered: frozenset[int] = frozenset(),
        events: bool = True,
    ) -> list[ClaimedRun]:
        """The runs of ``ids`` (in id order), with their events unless ``events`` is false."""
        if not ids:
            return []
        d = self._dialect
        rows = conn.execute(
            self._q(f"SELECT {_DOC_COLUMNS} FROM dag_runs r WHERE {d.one_of('r.id')}"  # noqa: S608
                    " ORDER BY r.id"), (d.bind_list(list(ids)),)).fetchall()
        found: dict[int, list[RunEvent]] = {int(row[0]): [] for row in rows}
        if events:
            for run, ae_id, asset, te_id, payload, created, trace in conn.execute(
                    self._q(_EVENTS.format(runs=d.one_of("l.dag_run_id"))),
                    (d.bind_list(list(ids)),)).fetchall():
                found[int(run)].append(RunEvent(int(ae_id), str(asset), int(te_id),
                                                bytes(payload), d.read_time(created), trace))
        return [self._document(row, tuple(found[int(row[0])]), int(row[0]) in recovered)
                for row in rows]

    def _document(self, row: Sequence[Any], events: tuple[RunEvent, ...],
                  recovered: bool) -> ClaimedRun:
        when = self._dialect.when
        created = self._dialect.read_time(row[8])
        return ClaimedRun(
            id=int(row[0]), dag_id=str(row[1]), run_id=str(row[2]), run_type=str(row[3]),
            state=str(row[4]), attempt=int(row[5]), tries=int(row[5]) - int(row[6]),
            target=row[7], queued_at=created, logical_date=when(row[9]),
            data_interval_start=when(row[10]), data_interval_end=when(row[11]),
            run_after=when(row[12]) or created,
            conf=None if row[13] is None else json.loads(row[13]), trace_parent=row[14],
            external_id=row[15], external_url=row[16], recovered=recovered, events=events,
        )

    # -- the dispatcher's side -----------------------------------------------------------

    def claim_runs(
        self, triggerer_id: str, targets: Mapping[str, str], limit: int, threshold: float
    ) -> list[ClaimedRun]:
        """Claim runs due for delivery; see :meth:`OutboxStore.claim_runs`."""
        if limit <= 0 or not targets:
            return []
        d = self._dialect
        with self._write("claim_runs") as conn:
            now = self._clock(conn)
            rows = conn.execute(self._q(
                "SELECT r.id, r.state, r.attempts, r.dag_id FROM dag_runs r"  # noqa: S608
                f" WHERE r.state IN ('queued', 'dispatching', 'running')"
                f" AND {d.one_of('r.dag_id')}"
                " AND ((r.state = 'queued' AND (r.next_attempt_at IS NULL"
                "  OR r.next_attempt_at <= ?))"
                f"  OR (r.state != 'queued' AND {_DEAD_CLAIM} AND {_OPEN_ATTEMPT}))"
                " AND NOT EXISTS (SELECT 1 FROM dags p WHERE p.dag_id = r.dag_id AND p.paused)"
                f" ORDER BY r.id LIMIT ?{d.skip_locked}"),
                (d.bind_list(sorted(targets)), d.write_time(now), triggerer_id,
                 d.write_time(now - timedelta(seconds=threshold)), limit),
            ).fetchall()
            if not rows:
                return []
            stamp = d.write_time(now)
            recovered = frozenset(int(r[0]) for r in rows if r[1] != "queued")
            cursor = conn.cursor()
            if recovered:
                cursor.executemany(self._q(
                    "UPDATE dag_run_attempts SET ended_at = ?, outcome = 'unknown', detail = ?"
                    " WHERE dag_run_id = ? AND attempt = ? AND outcome IS NULL"),
                    [(stamp, _OUTCOME_UNKNOWN, int(r[0]), int(r[2]))
                     for r in rows if int(r[0]) in recovered])
            cursor.executemany(self._q(
                "UPDATE dag_runs SET state = 'dispatching', claimed_by = ?, target = ?,"
                " attempts = attempts + 1, next_attempt_at = NULL, updated_at = ? WHERE id = ?"),
                [(triggerer_id, targets[str(r[3])], stamp, int(r[0])) for r in rows])
            cursor.executemany(self._q(
                "INSERT INTO dag_run_attempts (dag_run_id, attempt, triggerer_id, target,"
                " started_at) VALUES (?, ?, ?, ?, ?)"),
                [(int(r[0]), int(r[2]) + 1, triggerer_id, targets[str(r[3])], stamp)
                 for r in rows])
            return self._documents(conn, [int(r[0]) for r in rows], recovered=recovered)

    def follow_runs(
        self, triggerer_id: str, targets: Mapping[str, str], limit: int, threshold: float
    ) -> list[ClaimedRun]:
        """Dispatched and running runs to ask about; see :meth:`OutboxStore.follow_runs`."""
        if limit <= 0 or not targets:
            return []
        d = self._dialect
        with self._write("follow_runs") as conn:
            now = self._clock(conn)
            rows = conn.execute(self._q(
                "SELECT r.id, r.claimed_by FROM dag_runs r"  # noqa: S608
                f" WHERE r.state IN ('dispatched', 'running') AND {d.one_of('r.dag_id')}"
                f" AND (r.claimed_by = ? OR {_DEAD_CLAIM})"
                f" ORDER BY r.updated_at, r.id LIMIT ?{d.skip_locked}"),
                (d.bind_list(sorted(targets)), triggerer_id, triggerer_id,
                 d.write_time(now - timedelta(seconds=threshold)), limit),
            ).fetchall()
            taken = [int(row[0]) for row in rows if row[1] != triggerer_id]
            if taken:
                conn.execute(self._q(
                    f"UPDATE dag_runs SET claimed_by = ? WHERE {d.one_of('id')}"),  # noqa: S608
                    (triggerer_id, d.bind_list(taken)))
            return self._documents(conn, [int(row[0]) for row in rows], events=False)

    def record_dispatch(self, triggerer_id: str, results: Sequence[DispatchResult]) -> int:
        """Apply what the targets answered, fenced by the claim; see the protocol."""
        if not results:
            return 0
        for result in results:
            if result.state not in RUN_STATES or result.state == "dispatching":
                raise StoreError(f"a dispatch result cannot set state {result.state!r}")
        d = self._dialect
        with self._write("record_dispatch") as conn:
            now = d.write_time(self._clock(conn))
            ids = sorted({result.run for result in results})
            held = {
                int(row[0]): (row[1], row[2])
                for row in conn.execute(self._q(
                    "SELECT r.id, r.dispatched_at, r.state FROM dag_runs r"  # noqa: S608
                    f" WHERE {d.one_of('r.id')} AND r.claimed_by = ?"
                    " AND r.state IN ('dispatching', 'dispatched', 'running')"
                    f" ORDER BY r.id{d.lock}"),
                    (d.bind_list(ids), triggerer_id)).fetchall()
            }
            runs, attempts = [], []
            for result in results:
                if result.run not in held:
                    continue  # fenced: no longer ours (taken over, or marked by a person)
                first_seen, _ = held[result.run]
                final = result.state in FINISHED_STATES
                release = final or result.state == "queued"
                reached = result.state not in ("queued", "undeliverable")
                if reached and first_seen is None:
                    first_seen = now
                held[result.run] = (first_seen, result.state)
                failing = result.state in ("queued", "undeliverable", "failed")
                runs.append((
                    result.state, now, d.time(result.next_attempt_at),
                    None if release else triggerer_id,
                    result.detail if failing and result.detail else None,
                    result.external_id, result.external_url, first_seen,
                    now if final else None, result.run,
                ))
                if result.attempt is not None:
                    attempts.append((now, result.state, result.detail, _cut(result.output),
                                     result.run, result.attempt))
            cursor = conn.cursor()
            cursor.executemany(self._q(
                "UPDATE dag_runs SET state = ?, updated_at = ?, next_attempt_at = ?,"
                " claimed_by = ?, last_error = coalesce(?, last_error),"
                " external_id = coalesce(?, external_id), external_url = coalesce(?, external_url),"
                " dispatched_at = ?, ended_at = ? WHERE id = ?"), runs)
            if attempts:
                cursor.executemany(self._q(
                    "UPDATE dag_run_attempts SET ended_at = ?, outcome = ?, detail = ?, output = ?"
                    " WHERE dag_run_id = ? AND attempt = ?"), attempts)
            return len(runs)

    def unclaim_runs(self, triggerer_id: str, runs: Sequence[tuple[int, int]]) -> int:
        """Hand back claimed, never-started runs; see :meth:`OutboxStore.unclaim_runs`."""
        if not runs:
            return 0
        d = self._dialect
        with self._write("unclaim_runs") as conn:
            stamp = d.write_time(self._clock(conn))
            handed = 0
            for run, attempt in runs:
                cursor = conn.execute(self._q(
                    "UPDATE dag_runs SET state = 'queued', claimed_by = NULL,"
                    " attempts = attempts - 1, updated_at = ?"
                    " WHERE id = ? AND claimed_by = ? AND state = 'dispatching' AND attempts = ?"),
                    (stamp, run, triggerer_id, attempt))
                if cursor.rowcount:
                    conn.execute(self._q(
                        "DELETE FROM dag_run_attempts WHERE dag_run_id = ? AND attempt = ?"
                        " AND outcome IS NULL"), (run, attempt))
                    handed += 1
            return handed

    def release_runs(self, triggerer_id: str) -> None:
        """Stop following this triggerer's dispatched and running runs; see the protocol."""
        with self._write("release_runs") as conn:
            conn.execute(self._q(
                "UPDATE dag_runs SET claimed_by = NULL WHERE claimed_by = ?"
                " AND state IN ('dispatched', 'running')"), (triggerer_id,))

    # -- what a person does, through the CLI ----------------------------------------------

    def get_run(self, dag_id: str, run_id: str) -> ClaimedRun | None:
        """One run with its events, or ``None``."""
        with self._write("get_run") as conn:  # one snapshot for the run and its events
            row = conn.execute(self._q("SELECT id FROM dag_runs WHERE dag_id = ? AND run_id = ?"),
                               (dag_id, run_id)).fetchone()
            if row is None:
                return None
            (run,) = self._documents(conn, [int(row[0])])
            return run

    def run_attempts(self, run: int) -> list[AttemptRow]:
        """The attempts of run ``run`` (its row id), in order."""
        when = self._dialect.when
        return [
            AttemptRow(run=int(row[0]), attempt=int(row[1]), triggerer_id=row[2],
                       target=row[3], started_at=self._dialect.read_time(row[4]),
                       ended_at=when(row[5]), outcome=row[6], detail=row[7], output=row[8])
            for row in self._read(self._q(
                "SELECT dag_run_id, attempt, triggerer_id, target, started_at, ended_at, outcome,"
                " detail, output FROM dag_run_attempts WHERE dag_run_id = ? ORDER BY attempt"),
                (run,))
        ]

    def retry_runs(self, runs: Sequence[int]) -> int:
        """Queue finished runs again, with a new retry budget; see the protocol."""
        if not runs:
            return 0
        d = self._dialect
        with self._write("retry_runs") as conn:
            return int(conn.execute(self._q(
                "UPDATE dag_runs SET state = 'queued', attempt_base = attempts,"  # noqa: S608
                " next_attempt_at = NULL, claimed_by = NULL, ended_at = NULL, updated_at = ?"
                f" WHERE {d.one_of('id')} AND state IN ('success', 'failed', 'undeliverable')"),
                (d.write_time(self._clock(conn)), d.bind_list(sorted(set(runs))))).rowcount)

    def mark_runs(self, runs: Sequence[int], state: str, note: str) -> int:
        """Set runs to ``success`` or ``failed`` by a person's word; see the protocol."""
        if state not in ("success", "failed"):
            raise StoreError(f"a run can be marked success or failed, not {state!r}")
        if not runs:
            return 0
        d = self._dialect
        ids = d.bind_list(sorted(set(runs)))
        with self._write("mark_runs") as conn:
            now = d.write_time(self._clock(conn))
            conn.execute(self._q(
                "UPDATE dag_run_attempts SET ended_at = ?, outcome = 'unknown', detail = ?"  # noqa: S608
                f" WHERE {d.one_of('dag_run_id')} AND outcome IS NULL"),
                (now, f"the run was marked {state} while this attempt was under way", ids))
            return int(conn.execute(self._q(
                "UPDATE dag_runs SET state = ?, claimed_by = NULL, next_attempt_at = NULL,"  # noqa: S608
                " last_error = ?, ended_at = ?, updated_at = ?"
                f" WHERE {d.one_of('id')} AND state != ?"),
                (state, note, now, now, ids, state)).rowcount)

    def queue_manual_run(self, dag_id: str, run_id: str, conf: Mapping[str, Any]) -> bool:
        """Queue a manual run of a known DAG; ``False`` if the run id exists."""
        try:
            text = json.dumps(dict(conf), sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"a run's conf must be JSON-able: {exc}") from exc
        d = self._dialect
        with self._write("queue_manual_run") as conn:
            if conn.execute(self._q("SELECT 1 FROM dags WHERE dag_id = ?"),
                            (dag_id,)).fetchone() is None:
                raise StoreError(f"no DAG {dag_id!r} in the store (see `sharedstream dags list`)")
            now = d.write_time(self._clock(conn))
            return int(conn.execute(self._q(
                "INSERT INTO dag_runs (dag_id, run_id, state, created_at, run_type, run_after,"
                " conf, updated_at) VALUES (?, ?, 'queued', ?, 'manual', ?, ?, ?)"
                " ON CONFLICT (dag_id, run_id) DO NOTHING"),
                (dag_id, run_id, now, now, text, now)).rowcount) == 1

    def set_dag_paused(self, dag_id: str, paused: bool) -> bool:
        """Pause or unpause a DAG's dispatching; ``False`` if it is not stored."""
        with self._write("set_dag_paused") as conn:
            return int(conn.execute(self._q("UPDATE dags SET paused = ? WHERE dag_id = ?"),
                                    (paused, dag_id)).rowcount) == 1

    def run_counts(self) -> dict[tuple[str, str, str], int]:
        """Unfinished runs per ``(dag_id, target or "", state)`` (the index on state serves it)."""
        return {
            (str(dag_id), str(target or ""), str(state)): int(count)
            for dag_id, target, state, count in self._read(
                "SELECT dag_id, target, state, count(*) FROM dag_runs"
                " WHERE state IN ('queued', 'dispatching', 'dispatched', 'running')"
                " GROUP BY dag_id, target, state")
        }

    def prune(self, before: datetime, limit: int = 10_000) -> PruneResult:
        """Delete what finished before ``before``, ``limit`` rows a kind; see the protocol."""
        d = self._dialect
        cutoff = d.write_time(before)
        with self._write("prune") as conn:
            runs = [int(row[0]) for row in conn.execute(self._q(
                "SELECT id FROM dag_runs WHERE state IN ('success', 'failed', 'undeliverable')"
                " AND coalesce(ended_at, created_at) < ? ORDER BY id LIMIT ?"),
                (cutoff, limit)).fetchall()]
            if runs:
                chosen = d.bind_list(runs)
                for table in ("dag_run_attempts", "dag_run_asset_events"):
                    conn.execute(self._q(
                        f"DELETE FROM {table} WHERE {d.one_of('dag_run_id')}"), (chosen,))  # noqa: S608
                conn.execute(self._q(f"DELETE FROM dag_runs WHERE {d.one_of('id')}"), (chosen,))  # noqa: S608
            # Asset events of old trigger events that no run left consumes and no queue holds.
            asset_events = self._delete_ids(conn, "asset_events", (
                "SELECT ae.id FROM asset_events ae JOIN trigger_events te"
                " ON te.id = ae.trigger_event_id WHERE te.created_at < ?"
                " AND NOT EXISTS (SELECT 1 FROM dag_run_asset_events l"
                "  WHERE l.asset_event_id = ae.id)"
                " AND NOT EXISTS (SELECT 1 FROM asset_dag_queue q WHERE q.asset_event_id = ae.id)"
                " ORDER BY ae.id LIMIT ?"), (cutoff, limit))
            events = self._delete_ids(conn, "trigger_events", (
                "SELECT te.id FROM trigger_events te WHERE te.created_at < ? AND NOT EXISTS ("
                " SELECT 1 FROM asset_events ae WHERE ae.trigger_event_id = te.id)"
                " ORDER BY te.id LIMIT ?"), (cutoff, limit))
            letters = self._delete_ids(conn, "dead_letters", (
                "SELECT id FROM dead_letters WHERE created_at < ? ORDER BY id LIMIT ?"),
                (cutoff, limit))
            triggerers = conn.execute(self._q("DELETE FROM triggerers WHERE heartbeat_at < ?"),
                                      (cutoff,)).rowcount
            counts = conn.execute(self._q(
                "DELETE FROM raw_event_failures WHERE name IN (SELECT name FROM raw_event_failures"
                " WHERE updated_at < ? ORDER BY updated_at LIMIT ?)"), (cutoff, limit)).rowcount
            replays = self._delete_ids(conn, "replays", (
                "SELECT id FROM replays WHERE state IN ('done', 'cancelled', 'failed')"
                " AND finished_at < ? ORDER BY id LIMIT ?"), (cutoff, limit))
        return PruneResult(dag_runs=len(runs), trigger_events=events, asset_events=asset_events,
                           dead_letters=letters, triggerers=int(triggerers),
                           failure_counts=int(counts), replays=replays,
                           more=limit in (len(runs), events, asset_events, letters, counts,
                                          replays))

    def _delete_ids(self, conn: Any, table: str, select: str, params: Sequence[Any]) -> int:
        """Delete the rows of ``table`` whose ids ``select`` lists; how many."""
        ids = [int(row[0]) for row in conn.execute(self._q(select), params).fetchall()]
        if ids:
            conn.execute(self._q(f"DELETE FROM {table} WHERE {self._dialect.one_of('id')}"),  # noqa: S608
                         (self._dialect.bind_list(ids),))
        return len(ids)
