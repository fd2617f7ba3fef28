"""Batched DAGs: runs made from a DAG's queue in batches, after the write that queued them.

Airflow 3.4 makes one DAG run per asset event by default, and
``batch_asset_events = True`` brings back 3.3's way: one run consumes
everything the DAG's queue holds when the scheduler looks. A DAG whose
``dags.batching`` is set is batched here: ``write_events`` only queues its
asset events (:mod:`sharedstream.store._write_plan`), and
:func:`release_batches`, called every second or so by the triggerer, turns
queues into runs. ``batching`` is ``{"max_events": n or null,
"max_wait": seconds or null}``.

A batched DAG's queue becomes a run when its schedule holds for the
batch, and either the batch is full (``max_events`` asset events) or its
oldest event has waited ``max_wait`` seconds (no ``max_wait``: at once, at
the next pass, as Airflow 3.3's scheduler did). A batch is the queue's
oldest ``max_events`` entries (all of them without ``max_events``); a
longer queue makes several runs in one pass, and what is left waits.

Invariants (the store contract's, kept here too):

1. Run ids are ``asset_triggered__{largest consumed asset event id:012d}``
   and each queue entry is consumed once, in the transaction that deletes
   it, so a run id is never made twice (``UNIQUE (dag_id, run_id)`` backs
   it up).
2. PostgreSQL: the batched DAGs' rows are locked (in id order, as writers
   lock them) before their queues are read, so a writer queueing on one, or
   another triggerer's pass, waits: no entry is consumed twice.
3. The run takes the trace parent of its newest event.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sharedstream.store._dag_schedules import Dialect
from sharedstream.store.base import RUN_STATE_QUEUED, Schedule

__all__ = ["release_batches"]

_QUEUE = (
    "SELECT q.asset_event_id, a.name, ae.created_at, te.trace_parent FROM asset_dag_queue q"
    " JOIN assets a ON a.id = q.asset_id JOIN asset_events ae ON ae.id = q.asset_event_id"
    " JOIN trigger_events te ON te.id = ae.trigger_event_id WHERE q.dag_id = ?"
    " ORDER BY q.asset_event_id"
)


def release_batches(conn: Any, dialect: Dialect, now: datetime) -> list[str]:
    """Make the runs of every batched DAG whose batch is due; ``"dag_id/run_id"`` of each.

    Inside the caller's write transaction; ``now`` is compared with the
    queued asset events' ``created_at``.
    """
    q = dialect.sql
    made: list[str] = []
    dags = conn.execute(q(
        "SELECT dag_id, schedule, batching FROM dags WHERE batching IS NOT NULL"  # noqa: S608
        f" AND schedule != 'null' ORDER BY dag_id{dialect.lock}")).fetchall()
    for dag_id, schedule_text, batching_text in dags:
        schedule = Schedule.parse(json.loads(schedule_text), where=f"dag {dag_id!r}: schedule")
        batching = json.loads(batching_text)
        queue = conn.execute(q(_QUEUE), (dag_id,)).fetchall()
        made.extend(f"{dag_id}/{_make_run(conn, dialect, str(dag_id), batch, now)}"
                    for batch in _due(queue, schedule, batching, now, dialect))
    return made


def _due(queue: Sequence[Any], schedule: Schedule, batching: dict[str, Any], now: datetime,
         dialect: Dialect) -> list[Sequence[Any]]:
    """The batches of ``queue`` (rows of :data:`_QUEUE`) to make runs of now, oldest first."""
    size = batching.get("max_events")
    wait = batching.get("max_wait")
    batches: list[Sequence[Any]] = []
    rest = list(queue)
    while rest:
        batch = rest[:size] if size else rest
        if not schedule.satisfied({str(row[1]) for row in batch}):
            break
        full = bool(size) and len(batch) == size
        oldest = dialect.read_time(batch[0][2])
        if not full and wait is not None and now - oldest < timedelta(seconds=float(wait)):
            break
        batches.append(batch)
        rest = rest[len(batch):]
    return batches


def _make_run(conn: Any, dialect: Dialect, dag_id: str, batch: Sequence[Any],
              now: datetime) -> str:
    """Insert the run consuming ``batch`` and delete its queue entries; its run id."""
    q = dialect.sql
    ids = [int(row[0]) for row in batch]
    run_id = f"asset_triggered__{ids[-1]:012d}"
    row = conn.execute(q(
        "INSERT INTO dag_runs (dag_id, run_id, state, created_at, trace_parent)"
        " VALUES (?, ?, ?, ?, ?) RETURNING id"),
        (dag_id, run_id, RUN_STATE_QUEUED, dialect.write_time(now), batch[-1][3])).fetchone()
    conn.cursor().executemany(q(
        "INSERT INTO dag_run_asset_events (dag_run_id, asset_event_id) VALUES (?, ?)"),
        [(int(row[0]), asset_event_id) for asset_event_id in ids])
    conn.execute(q(f"DELETE FROM asset_dag_queue WHERE dag_id = ?"  # noqa: S608
                   f" AND {dialect.one_of('asset_event_id')}"), (dag_id, dialect.bind_list(ids)))
    return run_id
