"""PostgreSQL driver choice for the store: psycopg 3 (sync, pooled, on a DB thread) vs asyncpg.

The persistence gate awaits one ``write_events`` batch at a time; this runs
that loop for batches of 1, 10, 100 and 1000 events against one durable
PostgreSQL cluster (``fsync`` and ``synchronous_commit`` on: a batch is on
disk when it returns), with each driver:

* ``psycopg`` - :class:`~sharedstream.store.postgres.PostgresStore` as the
  triggerer uses it: ``write_events`` on the single database thread, awaited
  from the event loop (``run_in_executor``);
* ``asyncpg`` - the same statements (the store's write path, set-based over
  arrays, with its row locks) issued from the event loop on an asyncpg pool.

Every event is a trigger event of a watched asset with a DAG scheduled on
it, so each also writes an asset event, a queue pass and a queued DAG run,
as in ``persist.py``. Reports events/s and the mean time per batch (what a
``confirm`` waits). Writes ``benchmarks/results/pg_drivers.{json,csv}``.

Usage: ``python benchmarks/pg_drivers.py [--events N] [--quick] [--output-dir D]``
(needs ``pip install asyncpg``, which no extra of sharedstream installs).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import importlib
import json
import platform
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sharedstream.store import DagSpec, PendingEvent, TriggerSpec, WatcherSpec, open_store
from sharedstream.store._postgres_events import definitions
from sharedstream.store._write_plan import Definitions, plan_runs
from sharedstream.testing.brokers.postgres import fresh_database, postgres_server

RESULTS = Path(__file__).resolve().parent / "results"
BATCHES = (1, 10, 100, 1000)


def _prepare(url: str) -> int:
    """Migrate and define one watched asset with a DAG on it; return the trigger id."""
    with open_store(url) as store:
        store.migrate()
        ids = store.sync_definitions(
            [TriggerSpec("fp", "bench.Trigger", b"kw")],
            [WatcherSpec("orders", "all", "fp")],
            [DagSpec("process", {"asset": "orders"})],
        )
    return ids["fp"]


def _batch(trigger_id: int, size: int, start: int) -> list[PendingEvent]:
    return [PendingEvent(trigger_id, f"k{start + i}", b"x" * 64) for i in range(size)]


async def _run_psycopg(url: str, trigger_id: int, size: int, events: int) -> float:
    store = open_store(url)
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sharedstream-db")
    loop = asyncio.get_running_loop()
    try:
        started = time.perf_counter()
        for start in range(0, events, size):
            await loop.run_in_executor(thread, store.write_events,
                                       _batch(trigger_id, size, start))
        return time.perf_counter() - started
    finally:
        thread.shutdown()
        store.close()


async def _asyncpg_write(conn: Any, defs: Definitions,
                         batch: list[PendingEvent]) -> int:
    """The store's write path (events, asset events, queue, runs, counters) on asyncpg."""
    now = datetime.now(UTC)
    async with conn.transaction():
        await conn.fetchval("SELECT value FROM store_meta"
                            " WHERE key = 'definitions_generation' FOR SHARE")
        ids = sorted(r[0] for r in await conn.fetch(
            "SELECT nextval(pg_get_serial_sequence('trigger_events', 'id'))"
            " FROM generate_series(1, $1)", len(batch)))
        returned = await conn.fetch(
            "INSERT INTO trigger_events (id, trigger_id, idem_key, payload, created_at)"
            " SELECT b.id, b.trigger_id, b.idem_key, b.payload, $1"
            " FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::bytea[])"
            "  AS b (id, trigger_id, idem_key, payload)"
            " ORDER BY b.idem_key, b.id ON CONFLICT (idem_key) DO NOTHING"
            " RETURNING id, trigger_id",
            now, ids, [e.trigger_id for e in batch], [e.idem_key for e in batch],
            [e.payload for e in batch])
        stored = sorted((r[0], r[1]) for r in returned)
        rows = [(event_id, asset_id) for event_id, trigger_id in stored
                for asset_id, _, _ in defs.assets_by_trigger.get(trigger_id, ())]
        asset_ids = sorted(r[0] for r in await conn.fetch(
            "SELECT nextval(pg_get_serial_sequence('asset_events', 'id'))"
            " FROM generate_series(1, $1)", len(rows)))
        await conn.execute(
            "INSERT INTO asset_events (id, asset_id, trigger_event_id, created_at)"
            " SELECT u.id, u.asset_id, u.event_id, $1"
            " FROM unnest($2::bigint[], $3::bigint[], $4::bigint[]) AS u (id, asset_id, event_id)",
            now, asset_ids, [a for _, a in rows], [e for e, _ in rows])
        dag_ids = defs.dags_of(t for _, t in stored)
        await conn.execute("SELECT dag_id FROM dags WHERE dag_id = ANY($1)"
                           " ORDER BY dag_id FOR NO KEY UPDATE", dag_ids)
        queues: dict[str, list[tuple[int, str]]] = {}
        for r in await conn.fetch(
                "SELECT q.dag_id, q.asset_event_id, a.name FROM asset_dag_queue q"
                " JOIN assets a ON a.id = q.asset_id WHERE q.dag_id = ANY($1)"
                " ORDER BY q.dag_id, q.asset_event_id", dag_ids):
            queues.setdefault(r[0], []).append((r[1], r[2]))
        taken = iter(asset_ids)
        per_event = [(t, [next(taken) for _ in defs.assets_by_trigger.get(t, ())], None)
                     for _, t in stored]
        plan = plan_runs(defs, per_event, queues)
        if plan.consumed_from_table:
            await conn.execute("DELETE FROM asset_dag_queue WHERE dag_id = ANY($1)",
                               plan.consumed_from_table)
        if plan.queue_rows:
            await conn.execute(
                "INSERT INTO asset_dag_queue (dag_id, asset_event_id, asset_id)"
                " SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])",
                *(list(c) for c in zip(*plan.queue_rows, strict=True)))
        if plan.runs:
            run_ids = sorted(r[0] for r in await conn.fetch(
                "SELECT nextval(pg_get_serial_sequence('dag_runs', 'id'))"
                " FROM generate_series(1, $1)", len(plan.runs)))
            await conn.execute(
                "INSERT INTO dag_runs (id, dag_id, run_id, state, created_at)"
                " SELECT u.id, u.dag_id, u.run_id, 'queued', $1"
                " FROM unnest($2::bigint[], $3::text[], $4::text[]) AS u (id, dag_id, run_id)",
                now, run_ids, [d for d, _, _, _ in plan.runs], [r for _, r, _, _ in plan.runs])
            links = [(run, ae) for run, (_, _, consumed, _) in zip(run_ids, plan.runs, strict=True)
                     for ae in consumed]
            await conn.execute(
                "INSERT INTO dag_run_asset_events (dag_run_id, asset_event_id)"
                " SELECT * FROM unnest($1::bigint[], $2::bigint[])",
                [r for r, _ in links], [a for _, a in links])
        per_trigger = sorted(Counter(t for _, t in stored).items())
        await conn.execute("SELECT id FROM triggers WHERE id = ANY($1) ORDER BY id"
                           " FOR NO KEY UPDATE", [t for t, _ in per_trigger])
        await conn.execute(
            "UPDATE triggers SET events_stored = events_stored + c.n"
            " FROM unnest($1::bigint[], $2::bigint[]) AS c (id, n) WHERE triggers.id = c.id",
            [t for t, _ in per_trigger], [n for _, n in per_trigger])
    return len(stored)


async def _run_asyncpg(url: str, trigger_id: int, size: int, events: int) -> float:
    import psycopg  # noqa: PLC0415 - only to read the definitions the way the store does

    with psycopg.connect(url) as conn, conn.transaction():
        defs = definitions(conn, Definitions())
    asyncpg: Any = importlib.import_module("asyncpg")  # untyped; only this benchmark uses it
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    try:
        started = time.perf_counter()
        for start in range(0, events, size):
            async with pool.acquire() as conn:
                await _asyncpg_write(conn, defs, _batch(trigger_id, size, start))
        return time.perf_counter() - started
    finally:
        await pool.close()


async def _measure(admin: str, events: int) -> list[dict[str, Any]]:
    rows = []
    for size in BATCHES:
        count = max(size, min(events, size * 400))  # batch 1: 400 commits, enough for a mean
        for driver, run in (("psycopg", _run_psycopg), ("asyncpg", _run_asyncpg)):
            with fresh_database(admin) as url:
                trigger_id = _prepare(url)
                elapsed = await run(url, trigger_id, size, count)
                with open_store(url) as store:
                    counts = store.counts()
            if not counts["trigger_events"] == count == counts["dag_runs"]:
                raise RuntimeError(f"{driver}, batch {size}: stored {counts}, sent {count}")
            row = {"driver": driver, "batch": size, "events": count,
                   "events_per_s": round(count / elapsed),
                   "ms_per_batch": round(elapsed / (count / size) * 1000, 3)}
            print(row, flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 events per batch size")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    events = 2_000 if args.quick else args.events
    with postgres_server(durable=True) as admin:
        rows = asyncio.run(_measure(admin, events))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "durability": "fsync on, synchronous_commit on", "rows": rows}
    (args.output_dir / "pg_drivers.json").write_text(json.dumps(meta, indent=2) + "\n")
    with (args.output_dir / "pg_drivers.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
