"""How the SQLite store writes a batch of trigger events: set-based, in one transaction.

``SqliteStore.write_events`` opens the ``BEGIN IMMEDIATE`` transaction and
calls :func:`write_batch`; this module is the rest. The cost per event is a
few rows bound and stepped in C, not statements run from Python: the
database thread shares the GIL with the event loop, so every statement and
Python step here is time the runtime's event loop waits.

Invariants relied on throughout: the caller holds the write lock, so nobody
else inserts meanwhile, ids assigned in the transaction exceed every stored
one (``AUTOINCREMENT``), and they follow statement order. The caller also
turns foreign-key enforcement off for the transaction: the trigger ids of
the batch are checked once (:func:`_check_triggers`), and every other id
written is one this transaction read or created (asset events join stored
trigger events and watchers; queue rows and run links name those asset
events and the runs just inserted), so each reference holds by construction.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from itertools import accumulate, chain, islice, repeat
from operator import attrgetter
from typing import Any

from sharedstream.store._write_plan import Definitions, load_definitions, plan_runs
from sharedstream.store.base import (
    RUN_STATE_QUEUED,
    PendingEvent,
    StoreError,
    WriteResult,
)

__all__ = [
    "VALUES_CHUNK",
    "Definitions",
    "StaleDefinitions",
    "insert_rows",
    "load_definitions",
    "rowid",
    "values_chunk",
    "write_batch",
]


class StaleDefinitions(StoreError):
    """The watchers table no longer matches the cached definitions: reload, then retry."""


def rowid(cur: sqlite3.Cursor) -> int:
    """The id of the last row ``cur`` inserted."""
    last = cur.lastrowid
    if last is None:  # pragma: no cover - only after a statement that inserted nothing
        raise StoreError("INSERT reported no rowid")
    return last


VALUES_CHUNK = 4096
"""Most rows one ``INSERT`` of :func:`insert_rows` carries.

Fewer statements matter most for the GIL: every execution releases it and
has to take it back, and while the event loop is busy that wait can last
up to the interpreter's switch interval - per statement, so a batch pays it
as many times as it runs statements. Builds whose limit on bound parameters
per statement is lower (999 before SQLite 3.32) get smaller chunks
(:func:`values_chunk`).
"""

PADDED_MIN = 16
"""Fewest rows a padded statement of :func:`insert_rows` is prepared for."""


def bind_as_is() -> None:
    """Give :mod:`sqlite3` identity adapters for ``bytes`` and ``None``, where it has none.

    The module binds exact ``int``, ``float``, ``str`` and ``bytearray``
    parameters directly. Any other type, ``bytes`` and ``None`` included,
    is first looked up among the registered adapters, and on a miss the
    ``PrepareProtocol`` type is asked for ``__adapt__``: an ``AttributeError``
    is raised, its message formatted, then discarded. For a batch that was
    about a tenth of the store writer's instructions (3.2 such parameters
    per event: the payload, an absent trace parent, padding rows), all of
    it holding the interpreter lock the event loop waits for. A registered
    adapter is found and called instead, here two in C: ``bytes`` (an exact
    ``bytes`` comes back as is) and an empty dict's ``get`` (``None``). The
    values bound are the same either way. Adapters registered before (by
    the application) are kept. Idempotent.
    """
    if (bytes, sqlite3.PrepareProtocol) not in sqlite3.adapters:
        sqlite3.register_adapter(bytes, bytes)
    if (type(None), sqlite3.PrepareProtocol) not in sqlite3.adapters:
        nothing: dict[None, None] = {}
        sqlite3.register_adapter(type(None), nothing.get)


def values_chunk(conn: sqlite3.Connection, width: int, constants: int = 0) -> int:
    """The most rows per statement for rows of ``width`` bound columns: a power of two."""
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - constants
    size = VALUES_CHUNK
    while size > 1 and size * width > limit:
        size //= 2
    return size


@cache
def _values_statement(head: str, width: int, constants: int, rows: int, tail: str) -> str:
    # ?1..?constants are bound once; the VALUES parameters number on from there
    columns = [f"column{i}" for i in range(1, width + 1)]
    columns += [f"?{i}" for i in range(1, constants + 1)]
    row = "(" + ", ".join("?" * width) + ")"
    # head and tail are the caller's constant SQL; every value is a bound parameter
    return (f"{head} SELECT {', '.join(columns)} FROM (VALUES {', '.join([row] * rows)})"  # noqa: S608
            f" WHERE column1 IS NOT NULL{tail}")


def insert_rows(
    cur: sqlite3.Cursor,
    head: str,
    rows: Sequence[tuple[Any, ...]],
    tail: str = "",
    constants: tuple[Any, ...] = (),
) -> int:
    """``INSERT`` the rows in order, in few statements; returns how many were inserted.

    ``head`` names the columns of a row then those of ``constants`` (values
    the same in every row, bound once per statement). The first value of a
    row must not be ``NULL``. The effect is that of
    ``cur.executemany(f"{head} VALUES (?, ..., ?){tail}", [row + constants for row in rows])``:
    the rows of a ``VALUES`` list are inserted one after the other, ids are
    assigned in that order, and a conflict clause in ``tail`` applies to each
    row, also against rows earlier in the same statement. The cost is not:
    the overhead of a statement (binding from Python, step, reset, releasing
    and retaking the GIL) is paid per chunk of up to :func:`values_chunk`
    rows, and the last, shorter chunk is one statement too - prepared for the
    next power of two rows (at least :data:`PADDED_MIN`) and padded with rows
    of ``NULL`` that its ``WHERE column1 IS NOT NULL`` drops - so a batch of
    up to the chunk size is a single statement, and a handful of cached
    statements serve every batch size.
    """
    if not rows:
        return 0
    width = len(rows[0])
    size = values_chunk(cur.connection, width, len(constants))
    full = len(rows) // size * size
    inserted = 0
    if full:
        cur.executemany(
            _values_statement(head, width, len(constants), size, tail),
            [(*constants, *chain.from_iterable(rows[i : i + size])) for i in range(0, full, size)],
        )
        inserted += cur.rowcount  # executemany sums the rows each execution inserted
    left = len(rows) - full
    if left:
        padded = min(size, max(PADDED_MIN, 1 << (left - 1).bit_length()))
        cur.execute(
            _values_statement(head, width, len(constants), padded, tail),
            (*constants, *chain.from_iterable(rows[full:]), *(None,) * ((padded - left) * width)),
        )
        inserted += cur.rowcount
    return inserted


_trace_parent = attrgetter("trace_parent")


def write_batch(
    conn: sqlite3.Connection, defs: Definitions, batch: Sequence[PendingEvent], now: str
) -> WriteResult:
    """Do what ``SqliteStore.write_events`` promises, inside its ``BEGIN IMMEDIATE`` transaction.

    Set-based, so the cost per event is a few rows bound and stepped in C
    rather than several statements run from Python: chunked multi-row
    inserts (:func:`insert_rows`) for the trigger events, one ``INSERT ...
    SELECT`` for all their asset events, and the queue/run logic in Python
    only for events of triggers whose assets have DAGs
    (:func:`_queue_and_run`).

    This relies on holding the write lock: nobody else inserts meanwhile,
    so every id assigned in this transaction is larger than any stored
    before it (``AUTOINCREMENT`` assigns one more than the largest id ever
    used), and ids follow statement order. The rows are the ones the
    one-statement-per-event algorithm produced, ids included (a duplicate
    still burns a trigger event id, as a conflicting insert always did).
    Events stored under a new key (:func:`_store_renamed`) are inserted
    last, so they take the batch's last ids and their asset events and runs
    come after the others'.
    """
    cur = conn.cursor()
    trigger_ids = {event.trigger_id for event in batch}
    before, known = cur.execute(
        "SELECT (SELECT coalesce(max(id), 0) FROM trigger_events),"
        " (SELECT count(*) FROM triggers WHERE id IN (SELECT value FROM json_each(?)))",
        (json.dumps(sorted(trigger_ids)),),
    ).fetchone()
    inserted = insert_rows(
        cur,
        _INSERT_EVENTS,
        [(event.trigger_id, event.idem_key, event.payload, event.trace_parent, event.fingerprint)
         for event in batch],
        " ON CONFLICT (idem_key) DO NOTHING",
        (now,),
    )
    renamed = [] if inserted == len(batch) else _store_renamed(cur, batch, before, now)
    stored = inserted + len(renamed)
    if known != len(trigger_ids):
        _check_triggers(cur, before)
    stored_traces: Iterable[str | None]
    if inserted == len(batch):
        stored_triggers = [event.trigger_id for event in batch]
        stored_traces = map(_trace_parent, batch)  # lazy: only runs need them
    else:
        # Some were duplicates (already stored, or earlier in the batch with
        # the same key) or stored under a new key after the others (renamed):
        # the rows this batch stored, in id order, say which events remain.
        rows = cur.execute(
            "SELECT trigger_id, trace_parent FROM trigger_events WHERE id > ? ORDER BY id",
            (before,),
        ).fetchall()
        stored_triggers = [int(trigger_id) for trigger_id, _ in rows]
        stored_traces = [trace_parent for _, trace_parent in rows]
    per_trigger = Counter(stored_triggers)
    asset_event_count = sum(
        count * len(defs.assets_by_trigger.get(trigger_id, ()))
        for trigger_id, count in per_trigger.items()
    )
    runs: list[str] = []
    if asset_event_count:
        # One asset event per (stored event, distinct watching asset), ordered
        # by event then asset id: the order of defs.assets_by_trigger, so the
        # ids are consecutive in that order (DISTINCT: an asset may watch a
        # trigger under two watcher names, and still gets one event).
        cur.execute(
            "INSERT INTO asset_events (asset_id, trigger_event_id, created_at)"
            " SELECT DISTINCT w.asset_id, te.id, ?1 FROM trigger_events te"
            " JOIN watchers w ON w.trigger_id = te.trigger_id"
            " WHERE te.id > ?2 ORDER BY te.id, w.asset_id",
            (now, before),
        )
        if cur.rowcount != asset_event_count:
            # The watchers table no longer matches definitions_generation
            # (changed behind sync_definitions' back): fail the batch; the
            # store reloads the definitions when it is retried.
            raise StaleDefinitions(
                f"expected {asset_event_count} asset events from the cached definitions"
                f" (generation {defs.generation}), the watchers table gave {cur.rowcount}"
            )
        if not defs.scheduled_triggers.isdisjoint(per_trigger):
            first_asset_event_id = rowid(cur) - asset_event_count + 1
            runs = _queue_and_run(cur, defs, stored_triggers, stored_traces,
                                  first_asset_event_id=first_asset_event_id, now=now)
    if stored:
        # one statement, not one per trigger: each statement releases and
        # retakes the GIL, which the event loop is waiting for
        cur.execute(
            "UPDATE triggers SET events_stored = events_stored + (SELECT count(*)"
            "  FROM trigger_events te WHERE te.trigger_id = triggers.id AND te.id > ?1)"
            " WHERE id IN (SELECT trigger_id FROM trigger_events WHERE id > ?1)",
            (before,),
        )
    return WriteResult(
        stored=stored,
        duplicates=len(batch) - stored,
        asset_events=asset_event_count,
        dag_runs=tuple(runs),
        renamed=tuple(renamed),
    )


_INSERT_EVENTS = ("INSERT INTO trigger_events"
                  " (trigger_id, idem_key, payload, trace_parent, fingerprint, created_at)")


def _store_renamed(
    cur: sqlite3.Cursor, batch: Sequence[PendingEvent], before: int, now: str
) -> list[tuple[int, str]]:
    """Store the batch's new messages whose keys an earlier message holds; name them.

    Called after the batch's insert, when some of its events were not
    stored. An event is such a message when it has a fingerprint and its
    key belongs to an event stored before the batch (id at most
    ``before``) with another, non-``NULL`` fingerprint. It is inserted
    under ``f"{idem_key}#{fingerprint}"`` (a conflict there is a duplicate:
    that message was renamed before). Returns ``(trigger_id, idem_key)`` of
    the events stored so, in batch order; their ids follow every id the
    batch's insert assigned. Cost when nothing was renamed: one indexed
    lookup per fingerprinted key of the batch.
    """
    keys = {event.idem_key for event in batch
            if event.fingerprint is not None and event.idem_key is not None}
    if not keys:
        return []
    held = {
        str(key): str(fingerprint)
        for key, fingerprint, event_id in cur.execute(
            # The id is filtered here, not in SQL, so the lookup stays on the key's index.
            "SELECT idem_key, fingerprint, id FROM trigger_events"
            " WHERE idem_key IN (SELECT value FROM json_each(?)) AND fingerprint IS NOT NULL",
            (json.dumps(sorted(keys)),),
        )
        if event_id <= before
    }
    renamed: list[tuple[int, str]] = []
    for event in batch:
        key, fingerprint = event.idem_key, event.fingerprint
        if fingerprint is None or key is None or held.get(key, fingerprint) == fingerprint:
            continue
        cur.execute(
            f"{_INSERT_EVENTS} VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (idem_key) DO NOTHING",
            (event.trigger_id, f"{key}#{fingerprint}", event.payload, event.trace_parent,
             fingerprint, now),
        )
        if cur.rowcount:
            renamed.append((event.trigger_id, key))
    return renamed


def _check_triggers(cur: sqlite3.Cursor, before: int) -> None:
    """Raise ``sqlite3.IntegrityError`` if an event stored after ``before`` names no trigger.

    The foreign key ``trigger_events.trigger_id``: ``write_events`` runs with
    foreign keys off, and :func:`write_batch` counts the batch's distinct
    trigger ids that are stored before it inserts; when some are not, this
    fails the batch as the per-row check did - if an event naming one was
    stored: a duplicate was skipped before SQLite would have checked it.
    """
    if cur.execute(
        "SELECT 1 FROM trigger_events te WHERE te.id > ? AND NOT EXISTS"
        " (SELECT 1 FROM triggers t WHERE t.id = te.trigger_id) LIMIT 1",
        (before,),
    ).fetchone():
        raise sqlite3.IntegrityError(
            "FOREIGN KEY constraint failed: the batch names a trigger id that is not stored"
        )


def _queue_and_run(
    cur: sqlite3.Cursor,
    defs: Definitions,
    stored_triggers: Sequence[int],
    stored_traces: Iterable[str | None],
    *,
    first_asset_event_id: int,
    now: str,
) -> list[str]:
    """Queue a batch's asset events on their DAGs and create the runs that satisfies.

    ``stored_triggers`` and ``stored_traces`` hold the trigger id and the
    trace parent of each stored event, in batch order; the batch's asset
    events have consecutive ids from
    ``first_asset_event_id``, per event in the order of
    ``defs.assets_by_trigger``. The queue and run logic is
    :func:`~sharedstream.store._write_plan.plan_runs`, shared with the
    PostgreSQL store; this reads the queues it needs (the write lock is
    ours, so nobody changes them meanwhile) and writes its plan. Returns the
    runs created, as ``dag_id/run_id``, in creation order.
    """
    # each event's asset event ids: consecutive ranges, built in C rather than per event
    counts = {trigger_id: len(assets) for trigger_id, assets in defs.assets_by_trigger.items()}
    bounds = list(accumulate(map(counts.get, stored_triggers, repeat(0)),
                             initial=first_asset_event_id))
    per_event = zip(stored_triggers, map(range, bounds, islice(bounds, 1, None)), stored_traces,
                    strict=True)
    stored_queues: dict[str, list[tuple[int, str]]] = {}
    for dag_id, queued_id, name in cur.execute(
        "SELECT q.dag_id, q.asset_event_id, a.name FROM asset_dag_queue q"
        " JOIN assets a ON a.id = q.asset_id"
        " WHERE q.dag_id IN (SELECT value FROM json_each(?))"
        " ORDER BY q.dag_id, q.asset_event_id",
        (json.dumps(defs.dags_of(stored_triggers)),),
    ):
        stored_queues.setdefault(str(dag_id), []).append((int(queued_id), str(name)))
    plan = plan_runs(defs, per_event, stored_queues)
    cur.executemany(
        "DELETE FROM asset_dag_queue WHERE dag_id = ?",
        [(dag_id,) for dag_id in plan.consumed_from_table],
    )
    insert_rows(cur, "INSERT INTO asset_dag_queue (dag_id, asset_event_id, asset_id)",
                plan.queue_rows)
    _create_runs(cur, plan.runs, now)
    return [f"{dag_id}/{run_id}" for dag_id, run_id, _, _ in plan.runs]


def _create_runs(
    cur: sqlite3.Cursor, runs: Sequence[tuple[str, str, list[int], str | None]], now: str
) -> None:
    """Insert queued runs ``(dag id, run id, consumed asset event ids, trace parent)``, in order."""
    if not runs:
        return
    insert_rows(
        cur,
        "INSERT INTO dag_runs (dag_id, run_id, trace_parent, state, created_at)",
        [(dag_id, run_id, trace_parent) for dag_id, run_id, _, trace_parent in runs],
        constants=(RUN_STATE_QUEUED, now),
    )
    # Consecutive ids ending at the last one inserted: AUTOINCREMENT under our
    # write lock, and a conflict would have raised. (After executemany alone
    # the cursor does not know the last id; the connection does.)
    last = cur.lastrowid
    if last is None:
        (last,) = cur.execute("SELECT last_insert_rowid()").fetchone()
    first = int(last) - len(runs) + 1
    insert_rows(
        cur,
        "INSERT INTO dag_run_asset_events (dag_run_id, asset_event_id)",
        [
            (first + index, asset_event_id)
            for index, (_, _, consumed, _) in enumerate(runs)
            for asset_event_id in consumed
        ],
    )
