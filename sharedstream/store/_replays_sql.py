"""The replays' SQL, the same for both stores (:mod:`sharedstream.store.replays`).

:class:`ReplaySql` is a base of :class:`~sharedstream.store._shared_sql.SharedSql`,
given the store's ``_write`` transaction, ``_read``, ``_clock`` and
:class:`~sharedstream.store._dag_schedules.Dialect`. JSON columns are
text in both stores. Every value is a bound parameter; only constant
fragments are concatenated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sharedstream.store._rows import check_limit
from sharedstream.store._sql_access import SqlAccess
from sharedstream.store.base import StoreError
from sharedstream.store.replays import (
    ACTIVE_REPLAY_STATES,
    FINISHED_REPLAY_STATES,
    ReplayProgress,
    ReplayRow,
)

__all__ = ["ReplaySql"]

_COLUMNS = ("id, trigger_id, watcher, state, request, plan, positions, total, done, matched,"
            " stored, rejected, triggerer_id, error, created_at, updated_at, finished_at")
_ACTIVE = "state IN ('pending', 'running', 'cancelling')"
assert {"pending", "running", "cancelling"} == ACTIVE_REPLAY_STATES  # noqa: S101
# Of ``replays r`` (aliased ``r``: PostgreSQL's ``FOR UPDATE OF r SKIP LOCKED`` names it).
_NOBODY_LIVE = (
    "(r.triggerer_id IS NULL OR (r.triggerer_id != ? AND NOT EXISTS ("
    " SELECT 1 FROM triggerers t WHERE t.id = r.triggerer_id AND t.heartbeat_at > ?)))"
)


class ReplaySql(SqlAccess):
    """The replay methods of a store (:class:`~sharedstream.store.replays.ReplayStore`)."""

    def _row(self, row: Sequence[Any]) -> ReplayRow:
        d = self._dialect
        plan = json.loads(row[5]) if row[5] is not None else None
        return ReplayRow(
            id=int(row[0]), trigger_id=int(row[1]), watcher=str(row[2]), state=str(row[3]),
            request=json.loads(row[4]),
            plan=None if plan is None else {
                lane: (int(start), int(end)) for lane, (start, end) in plan.items()},
            positions={lane: int(p) for lane, p in json.loads(row[6]).items()},
            total=None if row[7] is None else int(row[7]), done=int(row[8]),
            matched=int(row[9]), stored=int(row[10]), rejected=int(row[11]),
            triggerer_id=row[12], error=row[13], created_at=d.read_time(row[14]),
            updated_at=d.read_time(row[15]),
            finished_at=None if row[16] is None else d.read_time(row[16]),
        )

    def _one(self, conn: Any, replay_id: int) -> ReplayRow | None:
        row = conn.execute(self._dialect.sql(f"SELECT {_COLUMNS} FROM replays WHERE id = ?"),  # noqa: S608
                           (replay_id,)).fetchone()
        return None if row is None else self._row(row)

    def create_replay(self, trigger_id: int, watcher: str, request: Mapping[str, Any]) -> int:
        """Write a ``pending`` replay; see :meth:`ReplayStore.create_replay`."""
        d = self._dialect
        with self._write("create_replay") as conn:
            if conn.execute(d.sql("SELECT 1 FROM triggers WHERE id = ?"),
                            (trigger_id,)).fetchone() is None:
                raise StoreError(f"no trigger with id {trigger_id}")
            busy = conn.execute(d.sql(
                f"SELECT id, state FROM replays WHERE trigger_id = ? AND {_ACTIVE}"),  # noqa: S608
                (trigger_id,)).fetchone()
            if busy is not None:
                raise StoreError(
                    f"watcher {watcher!r} already has replay {busy[0]} ({busy[1]}); wait for it "
                    f"or cancel it: sharedstream watchers cancel-replay {busy[0]}")
            now = d.write_time(self._clock(conn))
            row = conn.execute(d.sql(
                "INSERT INTO replays (trigger_id, watcher, state, request, positions, created_at,"
                " updated_at) VALUES (?, ?, 'pending', ?, '{}', ?, ?) RETURNING id"),
                (trigger_id, watcher, json.dumps(dict(request), sort_keys=True), now, now),
            ).fetchone()
            return int(row[0])

    def claim_replay(
        self, triggerer_id: str, trigger_ids: Sequence[int], threshold: float
    ) -> ReplayRow | None:
        """Claim one replay; see :meth:`ReplayStore.claim_replay`."""
        if not trigger_ids:
            return None
        d = self._dialect
        # Asked every few seconds by every triggerer: a read first, so an idle store sees no
        # write transaction (SQLite's write lock is the persistence gate's too).
        if not self._read(d.sql(f"SELECT 1 FROM replays WHERE {_ACTIVE} LIMIT 1")):  # noqa: S608
            return None
        with self._write("claim_replay") as conn:
            now = self._clock(conn)
            row = conn.execute(d.sql(
                "SELECT r.id FROM replays r WHERE r.state IN ('pending', 'running', 'cancelling')"  # noqa: S608
                f" AND {d.one_of('r.trigger_id')} AND {_NOBODY_LIVE}"
                f" ORDER BY r.id LIMIT 1{d.skip_locked}"),
                (d.bind_list(sorted(set(trigger_ids))), triggerer_id,
                 d.write_time(now - timedelta(seconds=threshold))),
            ).fetchone()
            if row is None:
                return None
            conn.execute(d.sql(
                "UPDATE replays SET triggerer_id = ?, updated_at = ?,"
                " state = CASE WHEN state = 'pending' THEN 'running' ELSE state END WHERE id = ?"),
                (triggerer_id, d.write_time(now), int(row[0])))
            return self._one(conn, int(row[0]))

    def plan_replay(
        self, replay_id: int, triggerer_id: str, plan: Mapping[str, tuple[int, int]]
    ) -> bool:
        """Record the plan; see :meth:`ReplayStore.plan_replay`."""
        d = self._dialect
        lanes = {lane: [int(start), int(end)] for lane, (start, end) in plan.items()}
        total = sum(max(0, end - start) for start, end in lanes.values())
        with self._write("plan_replay") as conn:
            return bool(conn.execute(d.sql(
                "UPDATE replays SET plan = ?, positions = ?, total = ?, updated_at = ?"
                " WHERE id = ? AND triggerer_id = ?"),
                (json.dumps(lanes, sort_keys=True),
                 json.dumps({lane: start for lane, (start, _) in lanes.items()}, sort_keys=True),
                 total, d.write_time(self._clock(conn)), replay_id, triggerer_id),
            ).rowcount == 1)

    def record_replay(self, replay_id: int, triggerer_id: str,
                      progress: ReplayProgress) -> str | None:
        """Record progress; see :meth:`ReplayStore.record_replay`."""
        d = self._dialect
        with self._write("record_replay") as conn:
            changed = conn.execute(d.sql(
                "UPDATE replays SET positions = ?, done = ?, matched = ?, stored = ?,"
                " rejected = ?, updated_at = ? WHERE id = ? AND triggerer_id = ?"
                " AND state IN ('pending', 'running', 'cancelling')"),
                (json.dumps(progress.positions, sort_keys=True), progress.done,
                 progress.matched, progress.stored, progress.rejected,
                 d.write_time(self._clock(conn)), replay_id, triggerer_id),
            ).rowcount
            if changed != 1:
                return None
            state = conn.execute(d.sql("SELECT state FROM replays WHERE id = ?"),
                                 (replay_id,)).fetchone()
            return str(state[0])

    def finish_replay(
        self, replay_id: int, triggerer_id: str, state: str, error: str | None = None
    ) -> bool:
        """End the replay; see :meth:`ReplayStore.finish_replay`."""
        if state not in FINISHED_REPLAY_STATES:
            raise StoreError(f"a replay ends {sorted(FINISHED_REPLAY_STATES)}, not {state!r}")
        d = self._dialect
        with self._write("finish_replay") as conn:
            now = d.write_time(self._clock(conn))
            return bool(conn.execute(d.sql(
                "UPDATE replays SET state = ?, error = ?, updated_at = ?, finished_at = ?"
                " WHERE id = ? AND triggerer_id = ?"
                " AND state IN ('pending', 'running', 'cancelling')"),
                (state, error, now, now, replay_id, triggerer_id)).rowcount == 1)

    def cancel_replay(self, replay_id: int) -> ReplayRow:
        """Ask to cancel; see :meth:`ReplayStore.cancel_replay`."""
        d = self._dialect
        with self._write("cancel_replay") as conn:
            row = self._one(conn, replay_id)
            if row is None:
                raise StoreError(f"no replay with id {replay_id}")
            if not row.active:
                raise StoreError(f"replay {replay_id} already ended: {row.state}")
            now = d.write_time(self._clock(conn))
            if row.state == "pending":
                conn.execute(d.sql("UPDATE replays SET state = 'cancelled', updated_at = ?,"
                                   " finished_at = ? WHERE id = ?"), (now, now, replay_id))
            else:
                conn.execute(d.sql("UPDATE replays SET state = 'cancelling', updated_at = ?"
                                   " WHERE id = ?"), (now, replay_id))
            cancelled = self._one(conn, replay_id)
            assert cancelled is not None  # noqa: S101 - read in the same transaction
            return cancelled

    def get_replay(self, replay_id: int) -> ReplayRow | None:
        """The replay with this id, or ``None``."""
        rows = self._read(self._dialect.sql(f"SELECT {_COLUMNS} FROM replays WHERE id = ?"),  # noqa: S608
                          (replay_id,))
        return self._row(rows[0]) if rows else None

    def list_replays(self, limit: int, *, trigger_id: int | None = None,
                     active: bool = False) -> list[ReplayRow]:
        """Replays, newest first; see :meth:`ReplayStore.list_replays`."""
        check_limit(limit)
        where = [sql for sql, on in (("trigger_id = ?", trigger_id is not None),
                                     (_ACTIVE, active)) if on]
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        params: list[Any] = [trigger_id] if trigger_id is not None else []
        rows = self._read(self._dialect.sql(
            f"SELECT {_COLUMNS} FROM replays{clause} ORDER BY id DESC LIMIT ?"),  # noqa: S608
            (*params, limit))
        return [self._row(row) for row in rows]
