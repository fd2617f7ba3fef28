"""What every backend's ``write_events`` derives from the definitions, without touching a database.

Two pieces, shared by the SQLite and PostgreSQL write paths:

* :class:`Definitions` and :func:`load_definitions` - the watcher and
  schedule maps a batch needs, read in the write transaction and cached per
  ``definitions_generation``;
* :func:`plan_runs` - the pending-queue and run logic over one batch, a pure
  function of the definitions, the queues as stored and the asset events the
  batch created. The caller reads the queues first and writes the plan after.

Invariant (the store contract, module :mod:`sharedstream.store.base`): per
stored event in batch order, its asset events join the queue of every DAG
of their asset, then each DAG the event touched whose schedule the queue
satisfies gets one run consuming the whole queue; its run id is
``asset_triggered__{largest consumed asset event id:012d}``, so a DAG's run
ids are unique as long as an asset event is consumed at most once per DAG,
and its trace parent is that event's (the one being planned, not the one
with the largest id: on PostgreSQL a queued entry may have a larger id).
A *batched* DAG (``dags.batching`` set) only queues here: its runs are made
later, in batches, by :mod:`sharedstream.store._batches`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sharedstream.store.base import Schedule

__all__ = ["Definitions", "Immediate", "Queue", "RunPlan", "load_definitions", "plan_runs"]


class _Executes(Protocol):
    """A DB-API-like connection: ``execute(sql)`` gives an iterable of rows."""

    def execute(self, sql: str, /) -> Iterable[Any]: ...


@dataclass(frozen=True, slots=True)
class Immediate:
    """The runs one event of a trigger makes whatever is queued: see :func:`plan_runs`."""

    # the DAGs the event touches
    dags: frozenset[str]
    # (dag id, positions in assets_by_trigger[trigger id] of the assets that queue on
    # it), in the order plan_runs touches the DAGs
    runs: tuple[tuple[str, tuple[int, ...]], ...]
    # (dag id, position) when runs is one DAG queued on by one asset
    single: tuple[str, int] | None = None


@dataclass(slots=True)
class Definitions:
    """What a batch write needs from the definitions, as of one generation."""

    generation: int = -1
    # trigger id -> (asset id, asset name, ids of the DAGs whose schedule mentions the
    # asset, sorted) of every asset watching it, by asset id: the asset events one
    # stored event of the trigger creates, in creation order
    assets_by_trigger: dict[int, tuple[tuple[int, str, tuple[str, ...]], ...]] = field(
        default_factory=dict
    )
    # the triggers watched by at least one asset some DAG is scheduled on: only
    # their events need the queue and run logic
    scheduled_triggers: frozenset[int] = frozenset()
    schedules: dict[str, Schedule] = field(default_factory=dict)
    # DAGs whose runs are made in batches, never here (they only queue)
    batched: frozenset[str] = frozenset()
    # the scheduled triggers one event of which satisfies every DAG it touches on its
    # own (schedules are monotone: more queued assets never unsatisfy one): the runs
    # such an event makes when those DAGs' queues are empty (plan_runs' fast path)
    immediate: dict[int, Immediate] = field(default_factory=dict)

    def dags_of(self, trigger_ids: Iterable[int]) -> list[str]:
        """The DAGs an event of any of these triggers may queue on, sorted (a lock order)."""
        return sorted({
            dag_id
            for trigger_id in set(trigger_ids) & self.scheduled_triggers
            for _, _, dag_ids in self.assets_by_trigger[trigger_id]
            for dag_id in dag_ids
        })


def load_definitions(conn: _Executes, generation: int) -> Definitions:
    """What a batch write needs from the stored definitions (read in its transaction)."""
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
        str(dag_id): Schedule.parse(json.loads(text), where=f"dag {dag_id!r}: schedule")
        for dag_id, text in conn.execute(  # 'null': a DAG only time schedules
            "SELECT dag_id, schedule FROM dags WHERE schedule != 'null'"
        )
    }
    batched = frozenset(str(dag_id) for (dag_id,) in conn.execute(
        "SELECT dag_id FROM dags WHERE batching IS NOT NULL"))
    by_trigger = {
        trigger_id: tuple(
            (asset_id, name, tuple(dags_by_asset.get(asset_id, ())))
            for asset_id, name in assets.items()
        )
        for trigger_id, assets in assets_by_trigger.items()
    }
    scheduled = frozenset(
        trigger_id
        for trigger_id, assets in assets_by_trigger.items()
        if any(asset_id in dags_by_asset for asset_id in assets)
    )
    return Definitions(
        generation=generation,
        assets_by_trigger=by_trigger,
        scheduled_triggers=scheduled,
        schedules=schedules,
        batched=batched,
        immediate=_immediate(by_trigger, scheduled, schedules, batched),
    )


def _immediate(
    by_trigger: Mapping[int, tuple[tuple[int, str, tuple[str, ...]], ...]],
    scheduled: frozenset[int],
    schedules: Mapping[str, Schedule],
    batched: frozenset[str],
) -> dict[int, Immediate]:
    """:attr:`Definitions.immediate`: the triggers whose one event satisfies all it touches.

    None that touches a batched DAG (its event only queues there).
    """
    immediate = {}
    for trigger_id in scheduled:
        positions: dict[str, list[int]] = {}  # in first-touched order, as plan_runs touches
        names: dict[str, set[str]] = {}
        for position, (_, name, dag_ids) in enumerate(by_trigger[trigger_id]):
            for dag_id in dag_ids:
                positions.setdefault(dag_id, []).append(position)
                names.setdefault(dag_id, set()).add(name)
        if not batched.intersection(positions) and all(
                schedules[dag_id].satisfied(names[dag_id]) for dag_id in positions):
            runs = tuple((dag_id, tuple(found)) for dag_id, found in positions.items())
            single = None
            if len(runs) == 1 and len(runs[0][1]) == 1:
                single = (runs[0][0], runs[0][1][0])
            immediate[trigger_id] = Immediate(frozenset(positions), runs, single)
    return immediate


@dataclass(slots=True)
class Queue:
    """One DAG's pending queue while a batch is planned."""

    # the asset event ids queued (not necessarily ascending: concurrent writers
    # of a PostgreSQL store allocate ids in one order and commit in another)
    ids: list[int] = field(default_factory=list)
    # the asset names among them: what the schedule is evaluated against
    names: set[str] = field(default_factory=set)
    # (asset event id, asset id) queued by this batch: rows to write at the end
    unwritten: list[tuple[int, int]] = field(default_factory=list)
    # whether the stored queue holds rows of this queue (to delete when it is consumed)
    in_table: bool = False


@dataclass(slots=True)
class RunPlan:
    """What to write after :func:`plan_runs`: queue changes and runs, in creation order."""

    # DAGs whose stored queue rows were consumed: delete them
    consumed_from_table: list[str]
    # (dag id, asset event id, asset id) queue rows to insert (after the deletes)
    queue_rows: list[tuple[str, int, int]]
    # (dag id, run id, consumed asset event ids ascending, trace parent of the event
    # that completed it), in creation order
    runs: list[tuple[str, str, list[int], str | None]]


def plan_runs(
    defs: Definitions,
    stored: Iterable[tuple[int, Sequence[int], str | None]],
    stored_queues: Mapping[str, Sequence[tuple[int, str]]],
) -> RunPlan:
    """Queue a batch's asset events on their DAGs and plan the runs that satisfies.

    ``stored`` holds, per stored event in batch order, its trigger id, the
    ids of its asset events (in the order of ``defs.assets_by_trigger``) and
    its trace parent, which every run the event completes takes.
    ``stored_queues`` maps every DAG the batch may touch to its stored queue,
    ``(asset event id, asset name)`` rows; a DAG missing from it has an empty
    queue. Queue changes stay in memory: an entry queued and consumed within
    the batch is never written.
    """
    queues: dict[str, Queue] = {}
    consumed_from_table: list[str] = []
    runs: list[tuple[str, str, list[int], str | None]] = []
    immediate = defs.immediate
    empty: set[str] = set()  # DAGs whose queue is known to be empty now
    for trigger_id, asset_event_ids, trace_parent in stored:
        if trigger_id not in defs.scheduled_triggers:
            continue
        fast = immediate.get(trigger_id)
        if fast is not None and (
            fast.dags <= empty or _queues_empty(fast.dags, queues, stored_queues, empty)
        ):
            # The general path's outcome without its bookkeeping: every DAG the
            # event touches runs on exactly this event's asset events (its queue
            # was empty, and stays so), ids ascending as the assets are ordered.
            if fast.single is not None:  # the common shape: one DAG, one asset
                dag_id, position = fast.single
                last = asset_event_ids[position]
                runs.append((dag_id, f"asset_triggered__{last:012d}", [last], trace_parent))
                continue
            for dag_id, positions in fast.runs:
                consumed = [asset_event_ids[position] for position in positions]
                runs.append(
                    (dag_id, f"asset_triggered__{consumed[-1]:012d}", consumed, trace_parent)
                )
            continue
        touched: dict[str, Queue] = {}  # in first-touched order
        assets = defs.assets_by_trigger[trigger_id]
        for (asset_id, asset_name, dag_ids), asset_event_id in zip(
            assets, asset_event_ids, strict=True
        ):
            for dag_id in dag_ids:
                queue = queues.get(dag_id)
                if queue is None:
                    queue = queues[dag_id] = _stored_queue(stored_queues.get(dag_id, ()))
                queue.ids.append(asset_event_id)
                queue.names.add(asset_name)
                queue.unwritten.append((asset_event_id, asset_id))
                touched[dag_id] = queue
                empty.discard(dag_id)
        for dag_id, queue in touched.items():
            if dag_id not in defs.batched and defs.schedules[dag_id].satisfied(queue.names):
                consumed = queue.ids if len(queue.ids) == 1 else sorted(queue.ids)
                runs.append(
                    (dag_id, f"asset_triggered__{consumed[-1]:012d}", consumed, trace_parent)
                )
                if queue.in_table:
                    consumed_from_table.append(dag_id)
                queues[dag_id] = Queue()
                empty.add(dag_id)
    queue_rows = [
        (dag_id, queued_id, asset_id)
        for dag_id, queue in queues.items()
        for queued_id, asset_id in queue.unwritten
    ]
    return RunPlan(consumed_from_table, queue_rows, runs)


def _queues_empty(
    dags: frozenset[str],
    queues: dict[str, Queue],
    stored_queues: Mapping[str, Sequence[tuple[int, str]]],
    empty: set[str],
) -> bool:
    """Whether every queue of ``dags`` is empty; loads stored ones, notes empty ones."""
    for dag_id in dags:
        queue = queues.get(dag_id)
        if queue is None:
            queue = queues[dag_id] = _stored_queue(stored_queues.get(dag_id, ()))
        if queue.ids:
            return False
        empty.add(dag_id)
    return True


def _stored_queue(rows: Sequence[tuple[int, str]]) -> Queue:
    queue = Queue()
    for asset_event_id, name in rows:
        queue.ids.append(asset_event_id)
        queue.names.add(name)
    queue.in_table = bool(queue.ids)
    return queue
