"""The schedule loop: queues the runs of time-scheduled DAGs, one triggerer task.

Terms: a DAG's *bookkeeping* is what the store keeps for its time schedule
(contract 5 of :mod:`sharedstream.store.base`): the data interval of the
last run the loop queued, the *next run* as last computed, and a
``revision``. A *pass* reads every DAG from the store, plans each
time-scheduled one (:func:`plan_dag`, pure) and writes each plan with
:meth:`~sharedstream.store.base.MetadataStore.queue_timed_runs`.

Invariants:

1. Nothing but the store carries a schedule across passes: a pass starts
   from what the store says, so a restarted triggerer (or another one on
   the same PostgreSQL) continues exactly where the last decision left it.
2. A plan is written as a compare-and-set on the DAG's revision, runs and
   bookkeeping in one transaction: however many triggerers plan the same
   DAG at once, one plan is applied and each run is queued once (run ids
   are deterministic, so even a lost race never stores a run twice). A
   plan that lost is dropped; the next pass plans again from the store.
3. A stored next run is not recomputed: once due, it is queued as stored
   (catch-up off: unless later runs are due as well, see 4), so a timetable
   that consults the clock cannot move it away at the last moment.
4. Catch-up on: the due runs are queued in logical-date order, at most
   ``max_runs`` per DAG per pass (the next pass follows at once). Catch-up
   off: of the due runs only the latest is queued, the missed ones are
   skipped (found by a walk of at most :data:`WALK_LIMIT` steps per pass).
5. A DAG whose timetable cannot be rebuilt or raises is logged (once per
   distinct error) and skipped; the other DAGs are planned as usual.

Sleep: until the earliest next run is due, at most ``max_sleep`` seconds
(so runs a schedule change or another triggerer left are seen soon). The
clock and the sleep are injected: tests never wait.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.runtime.definitions import Dag, Definitions
from sharedstream.store import DagRow, DagSpec, MetadataStore, StoreError, TimedRun
from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    TimetableRegistry,
    deserialize_timetable,
    use_clock,
)

__all__ = ["WALK_LIMIT", "Plan", "ScheduleLoop", "dag_specs", "plan_dag", "restriction_of"]

log = key_value_logger("sharedstream.runtime")

T = TypeVar("T")

WALK_LIMIT = 1000
"""Most timetable steps one pass takes over a catch-up-off DAG's missed runs."""


class RunsInDb(Protocol):
    """Runs a store call where the store's connection lives (the triggerer's database thread)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


def dag_specs(
    definitions: Definitions, targets: Callable[[str], dict[str, Any] | None] = lambda _: None,
    *, batch_asset_events: bool = False,
) -> list[DagSpec]:
    """What the store keeps of each DAG of ``definitions`` (its asset tree and timetable).

    ``targets`` gives a DAG's target as the store keeps it
    (:meth:`~sharedstream.runtime.dispatch_setup.DispatchPlan.stored_target`);
    ``batch_asset_events`` is ``[scheduler] batch_asset_events``, for DAGs that
    leave it to the configuration.
    """
    return [_spec(dag, definitions.timetables.get(dag.dag_id), targets(dag.dag_id),
                  batch_asset_events)
            for dag in definitions.dags.values()]


def batching_of(dag: Dag, default: bool) -> dict[str, Any] | None:
    """What the store keeps of a DAG's batching (``None``: a run per satisfying event)."""
    batched = default if dag.batch_asset_events is None else dag.batch_asset_events
    if not batched or dag.asset_condition is None:
        return None
    return {"max_events": dag.max_events, "max_wait": dag.max_wait}


def _spec(dag: Dag, timetable: dict[str, Any] | None, target: dict[str, Any] | None,
          batch_asset_events: bool) -> DagSpec:
    condition = dag.asset_condition
    return DagSpec(
        dag.dag_id,
        None if condition is None else condition.to_tree(),
        timetable,
        summary=None if dag.timetable is None else dag.timetable.summary,
        start_date=dag.start_date,
        end_date=dag.end_date,
        catchup=dag.catchup,
        target=target,
        batching=batching_of(dag, batch_asset_events),
    )


def restriction_of(row: DagRow) -> TimeRestriction:
    """The DAG's :class:`TimeRestriction`: its start date, end date and catch-up."""
    return TimeRestriction(row.start_date, row.end_date, row.catchup)


def timed_run(timetable: Timetable, info: DagRunInfo) -> TimedRun:
    """The run ``info`` describes, with the timetable's (deterministic) run id."""
    run_id = timetable.generate_run_id(
        run_type="scheduled", run_after=info.run_after, data_interval=info.data_interval)
    return TimedRun(run_id, info.logical_date, info.data_interval.start, info.data_interval.end,
                    info.run_after)


@dataclass(frozen=True)
class Plan:
    """What one pass decided for one DAG: the runs to queue now and the next one after them.

    ``more`` says runs are still due (the catch-up bound or the walk limit
    stopped the plan): the next pass should follow at once.
    """

    runs: tuple[TimedRun, ...]
    next_run: TimedRun | None
    more: bool = False


def plan_dag(
    row: DagRow, timetable: Timetable, now: dt.datetime, *, max_runs: int,
    walk_limit: int = WALK_LIMIT,
) -> Plan:
    """The runs of ``row`` due at ``now`` and its next run (module invariants 3 and 4).

    Pure given the timetable and the clock it sees (callers run it under
    :func:`~sharedstream.timetables.base.use_clock` with the same ``now``).
    Raises whatever the timetable raises.
    """
    restriction = restriction_of(row)
    walk = restriction._replace(catchup=True)  # each missed run in order, ignoring the clock

    def after(interval: tuple[dt.datetime, dt.datetime] | None, how: TimeRestriction
              ) -> TimedRun | None:
        last = None if interval is None else DataInterval(*interval)
        info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=how)
        return None if info is None else timed_run(timetable, info)

    upcoming = row.next_run if row.next_run is not None else after(row.last_interval, restriction)
    if row.catchup:
        runs: list[TimedRun] = []
        while upcoming is not None and upcoming.run_after <= now and len(runs) < max_runs:
            runs.append(upcoming)
            upcoming = after(_interval(upcoming), walk)
        more = upcoming is not None and upcoming.run_after <= now
        return Plan(tuple(runs), upcoming, more)
    latest: TimedRun | None = None
    steps = 0
    while upcoming is not None and upcoming.run_after <= now:
        if steps == walk_limit:  # more missed runs than one pass walks: skip these, go on
            return Plan((), upcoming, more=True)
        latest, upcoming = upcoming, after(_interval(upcoming), walk)
        steps += 1
    if latest is None:
        return Plan((), upcoming)
    return Plan((latest,), after(_interval(latest), restriction))


def _interval(run: TimedRun) -> tuple[dt.datetime, dt.datetime]:
    return (run.data_interval_start, run.data_interval_end)


class ScheduleLoop:
    """Plans and queues the time-based runs of every time-scheduled DAG in the store.

    ``db`` runs a store call on the store's thread; ``registry`` rebuilds
    stored timetables (only registered classes: a class path read from the
    database is never imported); ``clock`` gives the current aware time and
    ``sleep`` waits (both injected for tests). ``max_runs`` bounds the runs
    one DAG gets per pass (catch-up), ``max_sleep`` the time between passes.
    """

    def __init__(
        self,
        store: MetadataStore,
        db: RunsInDb,
        registry: TimetableRegistry,
        *,
        clock: Callable[[], dt.datetime] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_runs: int = 16,
        max_sleep: float = 5.0,
    ) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {max_runs}")
        self._store = store
        self._db = db
        self._registry = registry
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._sleep = sleep
        self.max_runs = max_runs
        self.max_sleep = max_sleep
        self.queued = 0
        """Runs this loop queued (across passes)."""
        self._timetables: dict[str, Timetable] = {}  # by serialized form
        self._errors: dict[str, str] = {}  # dag id -> the error last logged for it

    async def run(self) -> None:
        """Pass, sleep, pass ... until cancelled. A failed pass is logged and retried later.

        A failed pass never stops the triggerer: what it wrote is whole
        transactions (a failed one wrote nothing), and the next pass decides
        again from the store.
        """
        while True:
            try:
                wait = await self.run_once()
            except StoreError as exc:
                # The store is unreachable or failing (said in one line).
                log.warning("schedule loop: the store failed; retrying", error=exc,
                            delay_s=self.max_sleep)
                wait = self.max_sleep
            except Exception:
                # Anything else is a bug here; the watchers keep running meanwhile.
                log.exception("schedule loop: a pass failed; retrying", delay_s=self.max_sleep)
                wait = self.max_sleep
            await self._sleep(wait)

    async def run_once(self) -> float:
        """One pass over every DAG; returns the seconds to sleep before the next one."""
        rows = await self._db(self._store.list_dags)
        wake = self.max_sleep
        for row in rows:
            if row.timetable is None:
                continue
            now = self._clock()
            plan = self._plan(row, now)
            if plan is None:
                continue
            if plan.runs or plan.next_run != row.next_run:
                done = await self._db(self._store.queue_timed_runs, row.dag_id, row.revision,
                                      plan.runs, plan.next_run)
                if not done.applied:
                    # Another triggerer queued first (or a sync changed the schedule):
                    # nothing was written; plan again from the store.
                    log.debug("schedule loop: the DAG moved on under this plan; planning again",
                              dag_id=row.dag_id, revision=row.revision)
                    wake = 0.0
                    continue
                if done.queued:
                    self.queued += len(done.queued)
                    log.info("queued scheduled runs", dag_id=row.dag_id,
                             count=len(done.queued), first=done.queued[0], last=done.queued[-1])
            if plan.more:
                wake = 0.0
            elif plan.next_run is not None:
                due_in = (plan.next_run.run_after - self._clock()).total_seconds()
                wake = min(wake, max(0.0, due_in))
        return wake

    def _plan(self, row: DagRow, now: dt.datetime) -> Plan | None:
        """:func:`plan_dag` for ``row``, or ``None`` (logged) if its timetable fails."""
        try:
            timetable = self._timetable(row.timetable or {})
            with use_clock(now):
                plan = plan_dag(row, timetable, now, max_runs=self.max_runs)
        except Exception as exc:  # noqa: BLE001 - see the comment
            # Any failure of a (possibly user-written) timetable: this DAG waits, the
            # others go on; said once until the error changes.
            said = f"{type(exc).__name__}: {exc}"
            if self._errors.get(row.dag_id) != said:
                log.error("schedule loop: the DAG cannot be planned",  # noqa: TRY400 - one line
                          dag_id=row.dag_id, error=said)
                self._errors[row.dag_id] = said
            return None
        self._errors.pop(row.dag_id, None)
        return plan

    def _timetable(self, data: dict[str, Any]) -> Timetable:
        key = json.dumps(data, sort_keys=True)
        timetable = self._timetables.get(key)
        if timetable is None:
            timetable = self._timetables[key] = deserialize_timetable(data, self._registry)
        return timetable
