"""What ``sharedstream dags list`` and ``sharedstream dags next-runs`` show, as records.

Both read the DAGs as the store keeps them (:meth:`MetadataStore.list_dags`).
``next-runs`` starts from the stored bookkeeping: the stored next run if the
schedule loop computed one, otherwise the timetable's answer after the last
queued interval; each further run is the timetable's answer after the one
before, under the DAG's start date, end date and catch-up, at the current
time. A stored timetable is rebuilt only from a registered class (the
built-ins, entry points, and - with ``--definitions FILE`` - the classes of
that file, which also supplies DAGs the store does not know yet, without
bookkeeping). Pure functions of their arguments and the clock; the CLI
prints what they return.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.definitions import Definitions, timetable_registry
from sharedstream.runtime.schedule_loop import dag_specs, restriction_of, timed_run
from sharedstream.store import DagRow, TimedRun
from sharedstream.timetables.base import (
    DataInterval,
    TimetableRegistry,
    deserialize_timetable,
    use_clock,
)

__all__ = ["DAG_COLUMNS", "NEXT_RUN_COLUMNS", "dag_records", "next_run_records", "next_runs"]

DAG_COLUMNS = ("dag_id", "schedule", "target", "paused", "next_run", "catchup", "last_run",
               "last_run_at")
NEXT_RUN_COLUMNS = ("logical_date", "data_interval_start", "data_interval_end", "run_after",
                    "run_id")


class UnknownDag(SharedStreamError):
    """``dags next-runs`` was asked about a DAG neither the store nor the file defines."""


def _condition_text(tree: dict[str, Any], top: bool = True) -> str:
    """A schedule tree as the expression a user wrote: ``orders & (refunds | fx)``."""
    if "asset" in tree:
        return str(tree["asset"])
    op = " & " if "all" in tree else " | "
    text = op.join(_condition_text(part, top=False) for part in tree.get("all") or tree["any"])
    return text if top else f"({text})"


def schedule_text(row: DagRow) -> str:
    """The timetable's summary, else the asset condition, else ``None`` (manual only)."""
    if row.summary is not None:
        return row.summary
    return "None" if row.schedule is None else f"assets: {_condition_text(row.schedule)}"


def next_runs(row: DagRow, registry: TimetableRegistry, count: int,
              now: dt.datetime | None = None) -> list[TimedRun]:
    """The next ``count`` runs of ``row`` from its bookkeeping (see the module docstring).

    Raises what rebuilding or asking its timetable raises; ``[]`` for a DAG
    no time schedules.
    """
    if row.timetable is None:
        return []
    timetable = deserialize_timetable(row.timetable, registry)
    now = now or dt.datetime.now(dt.UTC)
    restriction = restriction_of(row)
    runs: list[TimedRun] = []
    with use_clock(now):
        upcoming = row.next_run
        last = None if row.last_interval is None else DataInterval(*row.last_interval)
        while len(runs) < count:
            if upcoming is None:
                info = timetable.next_dagrun_info(last_automated_data_interval=last,
                                                  restriction=restriction)
                if info is None:
                    break
                upcoming = timed_run(timetable, info)
            runs.append(upcoming)
            last = DataInterval(upcoming.data_interval_start, upcoming.data_interval_end)
            upcoming = None
    return runs


def dag_records(rows: Sequence[DagRow], registry: TimetableRegistry) -> list[dict[str, Any]]:
    """One record per DAG for ``dags list``; the next run computed when none is stored yet."""
    records = []
    for row in rows:
        upcoming = row.next_run
        if upcoming is None and row.timetable is not None:
            try:
                upcoming = next(iter(next_runs(row, registry, 1)), None)
            except Exception:  # noqa: BLE001 - a listing shows "-" for a timetable that fails
                upcoming = None
        records.append({
            "dag_id": row.dag_id,
            "schedule": schedule_text(row),
            "timetable": row.timetable,
            "assets": row.schedule,
            "start_date": row.start_date,
            "end_date": row.end_date,
            "catchup": row.catchup,
            "next_run": None if upcoming is None else upcoming.run_after,
            "next_logical_date": None if upcoming is None else upcoming.logical_date,
            "last_interval": None if row.last_interval is None else list(row.last_interval),
            "last_run": row.last_run_id,
            "last_run_at": row.last_run_at,
            "target": None if row.target is None else row.target.get("name"),
            "target_options": None if row.target is None else row.target.get("options"),
            "paused": row.paused,
            "batching": row.batching,
        })
    return records


def next_run_records(
    rows: Sequence[DagRow], dag_id: str, count: int, definitions: Definitions | None = None
) -> tuple[list[dict[str, Any]], str]:
    """The next ``count`` runs of ``dag_id`` as records, and a line saying where they come from.

    Raises :class:`UnknownDag` when neither the store nor ``definitions``
    has the DAG, and what rebuilding its timetable raises (an unregistered
    class: :class:`~sharedstream.timetables.base.UnregisteredTimetableClass`).
    """
    registry = timetable_registry({} if definitions is None else definitions.timetable_classes)
    row = next((r for r in rows if r.dag_id == dag_id), None)
    source = "the store's bookkeeping"
    if row is None and definitions is not None and dag_id in definitions.dags:
        (spec,) = [s for s in dag_specs(definitions) if s.dag_id == dag_id]
        row = DagRow(spec.dag_id, spec.schedule, spec.timetable, spec.summary, spec.start_date,
                     spec.end_date, spec.catchup, last_interval=None, next_run=None, revision=0)
        source = f"{definitions.source} (not in the store yet: no run queued so far)"
    if row is None:
        raise UnknownDag(f"no DAG {dag_id!r} in the store" + (
            " (it has the DAGs of a triggerer that started; to read a definitions file or "
            "folder instead, pass --definitions PATH)" if definitions is None
            else f" nor in {definitions.source}"))
    if row.timetable is None:
        return [], f"DAG {dag_id!r} is not scheduled on time ({schedule_text(row)})"
    runs = next_runs(row, registry, count)
    records = [{"logical_date": r.logical_date, "data_interval_start": r.data_interval_start,
                "data_interval_end": r.data_interval_end, "run_after": r.run_after,
                "run_id": r.run_id} for r in runs]
    return records, f"next runs of {dag_id} ({schedule_text(row)}), from {source}"
