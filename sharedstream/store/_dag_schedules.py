"""DAG rows and time-based runs: the same SQL for both stores.

Both stores keep the same ``dags`` and ``dag_runs`` columns (schema v4);
they differ in their parameter style, how a time is written and read, and
how a row is locked. A :class:`Dialect` carries those differences and the
functions here take it with a connection inside the caller's transaction.

Bookkeeping columns of ``dags`` (contract 5 of :mod:`sharedstream.store.base`):

* ``last_interval_start``/``last_interval_end`` - the data interval of the
  last time-based run the schedule loop queued;
* ``next_logical_date``, ``next_interval_start``, ``next_interval_end``,
  ``next_run_after``, ``next_run_id`` - the next run as last computed;
* ``revision`` - bumped by every change of the above or of the schedule.

Invariant: those columns change only in :func:`queue_runs` (a
compare-and-set on ``revision``, under the row's lock) and in
:func:`sync_dags` (in the caller's ``sync_definitions`` transaction).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sharedstream.store.base import (
    RUN_STATE_QUEUED,
    DagRow,
    DagSpec,
    QueuedRuns,
    StoreError,
    TimedRun,
)

__all__ = ["RUN_COLUMNS", "Dialect", "list_dags", "queue_runs", "sync_dags", "timed_fields"]


class _Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class _Connection(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...


@dataclass(frozen=True)
class Dialect:
    """What differs between the stores: ``?`` or ``%s``, times on disk, the row lock, lists.

    ``aggregate`` makes a list of a subquery's column, given ``{column}`` and
    the rest of the subquery (``{rest}``: from ``FROM`` on); ``items`` reads
    such a list back as a sequence.
    """

    param: str
    write_time: Callable[[datetime], Any]
    read_time: Callable[[Any], datetime]
    lock: str  # appended to the SELECT of a DAG row about to be changed
    aggregate: str
    items: Callable[[Any], Sequence[Any]]
    member: str = "{column} IN (SELECT value FROM json_each(?))"
    """A condition: ``{column}`` is one of a list bound as one parameter (:meth:`bind_list`)."""
    list_param: Callable[[Sequence[Any]], Any] = lambda values: json.dumps(list(values))
    """A list as that one parameter."""
    skip_locked: str = ""
    """Appended to a ``SELECT`` of rows to claim: take them, skipping any another claimer holds."""

    def one_of(self, column: str) -> str:
        """The condition ``column`` is in a list given by :meth:`bind_list`, ``?`` style."""
        return self.member.format(column=column)

    def bind_list(self, values: Sequence[Any]) -> Any:
        """``values`` as the parameter of :meth:`one_of`."""
        return self.list_param(values)

    def sql(self, text: str) -> str:
        """``text`` with its ``?`` placeholders in this dialect's style."""
        return text.replace("?", self.param)

    def array(self, column: str, rest: str) -> str:
        """The expression listing ``column`` of ``SELECT column rest`` (see :attr:`aggregate`)."""
        return self.aggregate.format(column=column, rest=rest)

    def time(self, value: datetime | None) -> Any:
        """A time to bind (``None`` stays ``None``)."""
        return None if value is None else self.write_time(value)

    def when(self, value: Any) -> datetime | None:
        """A stored time, or ``None``."""
        return None if value is None else self.read_time(value)


_SCHEDULE_FIELDS = "timetable, start_date, end_date, catchup"

RUN_COLUMNS = "r.run_type, r.logical_date, r.data_interval_start, r.data_interval_end, r.run_after"
"""The time-based columns of ``dag_runs`` (alias ``r``) a run listing selects after its own."""


def timed_fields(row: Sequence[Any], dialect: Dialect) -> dict[str, Any]:
    """The :data:`RUN_COLUMNS` of a listing row as :class:`~sharedstream.store.base.RunRow` fields.

    An asset-triggered run stores no ``run_after``: it is its ``created_at``
    (set by the caller when this leaves it ``None``).
    """
    return {
        "run_type": str(row[0]),
        "logical_date": dialect.when(row[1]),
        "data_interval_start": dialect.when(row[2]),
        "data_interval_end": dialect.when(row[3]),
        "run_after": dialect.when(row[4]),
    }


def _timetable_text(spec: DagSpec) -> str | None:
    if spec.timetable is None:
        return None
    try:
        return json.dumps(spec.timetable, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"dag {spec.dag_id!r}: timetable is not JSON-able: {exc}") from exc


def _json_text(spec: DagSpec, field: str) -> str | None:
    """The DAG's ``target`` or ``batching`` as the store keeps it: JSON text, or ``None``."""
    value = getattr(spec, field)
    if value is None:
        return None
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"dag {spec.dag_id!r}: {field} is not JSON-able: {exc}") from exc


def sync_dags(conn: _Connection, dialect: Dialect, dags: Sequence[DagSpec], now: datetime) -> None:
    """Replace the stored DAGs with ``dags``, keeping or resetting each one's bookkeeping.

    Inside the caller's ``sync_definitions`` transaction, after the assets
    are registered. The rules are :meth:`MetadataStore.sync_definitions`'.
    """
    q = dialect.sql
    if not dags:
        conn.execute("DELETE FROM dags")
        return
    ids = [dag.dag_id for dag in dags]
    if len(set(ids)) != len(ids):
        raise StoreError("a dag id is defined twice")
    stored: dict[str, tuple[Any, ...]] = {}
    for row in conn.execute(f"SELECT dag_id, {_SCHEDULE_FIELDS} FROM dags").fetchall():  # noqa: S608
        stored[str(row[0])] = (row[1], dialect.when(row[2]), dialect.when(row[3]), bool(row[4]))
    gone = sorted(set(stored) - set(ids))
    for dag_id in gone:
        conn.execute(q("DELETE FROM dags WHERE dag_id = ?"), (dag_id,))
    stamp = dialect.time(now)
    for dag in dags:
        text = _timetable_text(dag)
        schedule = json.dumps(dag.schedule, sort_keys=True)  # "null": no asset schedules it
        target, batching = _json_text(dag, "target"), _json_text(dag, "batching")
        fields = (text, dialect.time(dag.start_date), dialect.time(dag.end_date), dag.catchup)
        old = stored.get(dag.dag_id)
        if old is None:
            conn.execute(
                q("INSERT INTO dags (dag_id, schedule, updated_at, timetable_summary, target,"
                  " batching, timetable, start_date, end_date, catchup)"
                  " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                (dag.dag_id, schedule, stamp, dag.summary, target, batching, *fields),
            )
            if text is not None:
                _resume_from_runs(conn, dialect, dag.dag_id)
            continue
        conn.execute(  # paused is a person's choice: kept
            q("UPDATE dags SET schedule = ?, updated_at = ?, timetable_summary = ?, target = ?,"
              " batching = ? WHERE dag_id = ?"),
            (schedule, stamp, dag.summary, target, batching, dag.dag_id),
        )
        if old != (text, dag.start_date, dag.end_date, dag.catchup):
            # The schedule changed: the new one continues after the last automated
            # interval (kept); the next run is recomputed by the schedule loop.
            conn.execute(
                q("UPDATE dags SET timetable = ?, start_date = ?, end_date = ?, catchup = ?,"
                  " next_logical_date = NULL, next_interval_start = NULL,"
                  " next_interval_end = NULL, next_run_after = NULL, next_run_id = NULL,"
                  " revision = revision + 1 WHERE dag_id = ?"),
                (*fields, dag.dag_id),
            )


def _resume_from_runs(conn: _Connection, dialect: Dialect, dag_id: str) -> None:
    """A DAG new to the store continues after its newest stored time-based run, if any."""
    row = conn.execute(
        dialect.sql(
            "SELECT data_interval_start, data_interval_end FROM dag_runs"
            " WHERE dag_id = ? AND run_type = 'scheduled' AND data_interval_end IS NOT NULL"
            " ORDER BY data_interval_end DESC, id DESC LIMIT 1"
        ),
        (dag_id,),
    ).fetchone()
    if row is not None:
        conn.execute(
            dialect.sql(
                "UPDATE dags SET last_interval_start = ?, last_interval_end = ? WHERE dag_id = ?"
            ),
            (row[0], row[1], dag_id),
        )


_DAG_COLUMNS = (
    "d.dag_id, d.schedule, d.timetable, d.timetable_summary, d.start_date, d.end_date,"
    " d.catchup, d.last_interval_start, d.last_interval_end, d.next_logical_date,"
    " d.next_interval_start, d.next_interval_end, d.next_run_after, d.next_run_id, d.revision,"
    " (SELECT r.run_id FROM dag_runs r WHERE r.dag_id = d.dag_id ORDER BY r.id DESC LIMIT 1),"
    " (SELECT r.created_at FROM dag_runs r WHERE r.dag_id = d.dag_id ORDER BY r.id DESC LIMIT 1),"
    " d.paused, d.target, d.batching"
)


def list_dags(conn: _Connection, dialect: Dialect) -> list[DagRow]:
    """Every stored DAG, by id (a read; any transaction or none)."""
    rows = conn.execute(f"SELECT {_DAG_COLUMNS} FROM dags d ORDER BY d.dag_id").fetchall()  # noqa: S608
    return [_dag_row(row, dialect) for row in rows]


def _dag_row(row: Sequence[Any], dialect: Dialect) -> DagRow:
    when = dialect.when
    last_start, last_end = when(row[7]), when(row[8])
    next_run = None
    if row[13] is not None:
        logical, start, end, after = (dialect.read_time(row[i]) for i in (9, 10, 11, 12))
        next_run = TimedRun(str(row[13]), logical, start, end, after)  # written together
    schedule = json.loads(row[1])
    return DagRow(
        dag_id=str(row[0]),
        schedule=schedule,
        timetable=None if row[2] is None else json.loads(row[2]),
        summary=row[3],
        start_date=when(row[4]),
        end_date=when(row[5]),
        catchup=bool(row[6]),
        last_interval=None if last_start is None or last_end is None else (last_start, last_end),
        next_run=next_run,
        revision=int(row[14]),
        last_run_id=row[15],
        last_run_at=when(row[16]),
        paused=bool(row[17]),
        target=None if row[18] is None else json.loads(row[18]),
        batching=None if row[19] is None else json.loads(row[19]),
    )


def queue_runs(  # noqa: PLR0917 - the store method's arguments, passed through
    conn: _Connection,
    dialect: Dialect,
    dag_id: str,
    revision: int,
    runs: Sequence[TimedRun],
    next_run: TimedRun | None,
    now: datetime,
) -> QueuedRuns:
    """:meth:`MetadataStore.queue_timed_runs`, inside the caller's write transaction."""
    q = dialect.sql
    row = conn.execute(
        q(f"SELECT revision FROM dags WHERE dag_id = ?{dialect.lock}"),  # noqa: S608 - a constant
        (dag_id,),
    ).fetchone()
    if row is None or int(row[0]) != revision:
        return QueuedRuns(applied=False)
    queued: list[str] = []
    stamp = dialect.time(now)
    t = dialect.time
    for run in runs:
        inserted = conn.execute(
            q("INSERT INTO dag_runs (dag_id, run_id, state, created_at, run_type, logical_date,"
              " data_interval_start, data_interval_end, run_after)"
              " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (dag_id, run_id) DO NOTHING"),
            (dag_id, run.run_id, RUN_STATE_QUEUED, stamp, run.run_type, t(run.logical_date),
             t(run.data_interval_start), t(run.data_interval_end), t(run.run_after)),
        ).rowcount
        if inserted == 1:
            queued.append(run.run_id)
    nxt = (None,) * 5 if next_run is None else (
        t(next_run.logical_date), t(next_run.data_interval_start), t(next_run.data_interval_end),
        t(next_run.run_after), next_run.run_id)
    if runs:
        last = runs[-1]
        conn.execute(
            q("UPDATE dags SET last_interval_start = ?, last_interval_end = ? WHERE dag_id = ?"),
            (t(last.data_interval_start), t(last.data_interval_end), dag_id),
        )
    conn.execute(
        q("UPDATE dags SET next_logical_date = ?, next_interval_start = ?, next_interval_end = ?,"
          " next_run_after = ?, next_run_id = ?, revision = revision + 1 WHERE dag_id = ?"),
        (*nxt, dag_id),
    )
    return QueuedRuns(applied=True, queued=tuple(queued))
