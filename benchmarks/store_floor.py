"""How close the SQLite store's writes are to SQLite's own cost for the same rows.

``SqliteStore.write_events`` stores each trigger event with its asset event
(and, when a DAG is scheduled on the asset, a queued DAG run and its link
row) in one transaction per batch. This measures it against the least any
code could spend on those rows in SQLite: the same rows, with the same
schema (made by the store's own ``migrate``), the same pragmas (WAL,
``synchronous=FULL``) and the same batches per transaction, produced by SQL
statements alone - a recursive CTE generates each batch's rows inside
SQLite, so nothing is bound or built in Python per row.

Two shapes:

* ``event + asset event`` - one watcher, no DAG: what the end-to-end broker
  benchmarks store per matched message;
* ``event + asset event + run`` - a DAG scheduled on the asset: what
  ``persist.py`` stores per event.

Per case and round: microseconds per event of wall time and of the writing
thread's CPU (``time.thread_time``), over ``--events`` events in batches of
``--batch``, on a fresh database file. Idempotency keys have the shape and
length of a Pub/Sub raw event's (``<trigger>/projects/<p>/subscriptions/<s>/
<message id>#0``, ascending) and payloads are 160 bytes, as in the Pub/Sub
benchmark. Cases alternate within each round; the medians and the median of
the per-round ratios (SQL alone / ``write_events``) are reported. Writes
``benchmarks/results/store_floor.{json,csv,png}``.

Usage: ``python benchmarks/store_floor.py [--events N] [--rounds R]
[--batch B] [--quick] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sharedstream.store import DagSpec, PendingEvent, TriggerSpec, WatcherSpec, open_store
from sharedstream.store.sqlite import SqliteStore

RESULTS = Path(__file__).resolve().parent / "results"
PREFIX = "projects/bench/subscriptions/e2e-0-0-shared-10-0/"
PAYLOAD = bytes(range(160))
CREATED_AT = "2026-11-24T13:00:00.000000+00:00"
SHAPES = ("event + asset event", "event + asset event + run")


def _fresh(directory: Path, shape: str) -> tuple[Path, int]:
    """A migrated store file with one trigger, one watching asset and maybe a DAG on it."""
    path = directory / f"floor-{time.monotonic_ns()}.db"
    with open_store(f"sqlite:///{path}", create=True) as store:
        store.migrate()
        dags = [DagSpec("process", {"asset": "orders"})] if shape.endswith("run") else []
        ids = store.sync_definitions([TriggerSpec("fp", "bench.Trigger", b"kwargs")],
                                     [WatcherSpec("orders", "w", "fp")], dags)
    return path, ids["fp"]


def _key(trigger_id: int, n: int) -> str:
    return f"{trigger_id}/{PREFIX}{n}#0"


def through_store(path: Path, trigger_id: int, events: int, batch: int) -> tuple[float, float]:
    """``write_events`` on batches of ``batch`` events; (wall s, thread CPU s)."""
    batches = [[PendingEvent(trigger_id, _key(trigger_id, n), PAYLOAD)
                for n in range(start, min(start + batch, events))]
               for start in range(0, events, batch)]
    with SqliteStore(path) as store:
        started, cpu = time.perf_counter(), time.thread_time()
        for chunk in batches:
            store.write_events(chunk)
        return time.perf_counter() - started, time.thread_time() - cpu


def sql_only(path: Path, trigger_id: int, events: int, batch: int,
             runs: bool) -> tuple[float, float]:
    """The same rows from SQL statements alone, one transaction per batch; (wall s, CPU s)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute("PRAGMA synchronous = FULL")
        (asset_id,) = conn.execute("SELECT id FROM assets").fetchone()
        started, cpu = time.perf_counter(), time.thread_time()
        for start in range(0, events, batch):
            last = min(start + batch, events) - 1
            conn.execute("BEGIN IMMEDIATE")
            (before,) = conn.execute(
                "SELECT coalesce(max(id), 0) FROM trigger_events").fetchone()
            conn.execute(
                "WITH RECURSIVE s(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM s WHERE n < ?2)"
                " INSERT INTO trigger_events (trigger_id, idem_key, payload, trace_parent,"
                " created_at) SELECT ?3, ?3 || '/' || ?4 || n || '#0', ?5, NULL, ?6 FROM s"
                " WHERE true ON CONFLICT (idem_key) DO NOTHING",
                (start, last, trigger_id, PREFIX, PAYLOAD, CREATED_AT))
            conn.execute(
                "INSERT INTO asset_events (asset_id, trigger_event_id, created_at)"
                " SELECT ?1, id, ?3 FROM trigger_events WHERE id > ?2 ORDER BY id",
                (asset_id, before, CREATED_AT))
            if runs:  # the batch's asset events: the last ones, consecutive ids
                (first_asset_event,) = conn.execute(
                    "SELECT max(id) - ?1 + 1 FROM asset_events", (last - start + 1,)).fetchone()
                (first_run,) = conn.execute(
                    "SELECT coalesce(max(id), 0) + 1 FROM dag_runs").fetchone()
                conn.execute(
                    "INSERT INTO dag_runs (dag_id, run_id, trace_parent, state, created_at)"
                    " SELECT 'process', printf('asset_triggered__%012d', id), NULL, 'queued', ?2"
                    " FROM asset_events WHERE id >= ?1 ORDER BY id",
                    (first_asset_event, CREATED_AT))
                conn.execute(
                    "INSERT INTO dag_run_asset_events (dag_run_id, asset_event_id)"
                    " SELECT id, ?2 + id - ?1 FROM dag_runs WHERE id >= ?1",
                    (first_run, first_asset_event))
            conn.execute(
                "UPDATE triggers SET events_stored = events_stored + ?1 WHERE id = ?2",
                (last - start + 1, trigger_id))
            conn.execute("COMMIT")
        return time.perf_counter() - started, time.thread_time() - cpu
    finally:
        conn.close()


def _counts(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # noqa: S608
                for table in ("trigger_events", "asset_events", "dag_runs",
                              "dag_run_asset_events")]
    finally:
        conn.close()


Case = Callable[[Path, int, int, int], tuple[float, float]]


def _cases(shape: str) -> dict[str, Case]:
    runs = shape.endswith("run")
    return {
        "write_events": through_store,
        "SQL alone": lambda path, trigger_id, events, batch: sql_only(
            path, trigger_id, events, batch, runs),
    }


def measure(events: int, batch: int, rounds: int, directory: Path) -> list[dict[str, Any]]:
    """Every case of every shape, ``rounds`` times, alternating the cases' order."""
    runs: list[dict[str, Any]] = []
    for round_ in range(1, rounds + 1):
        for shape in SHAPES:
            cases = list(_cases(shape).items())
            if round_ % 2 == 0:
                cases.reverse()
            for name, case in cases:
                path, trigger_id = _fresh(directory, shape)
                wall, cpu = case(path, trigger_id, events, batch)
                counts = _counts(path)
                expected = [events, events] + ([events, events] if shape.endswith("run")
                                               else [0, 0])
                runs.append({"round": round_, "shape": shape, "case": name, "events": events,
                             "batch": batch, "us_per_event": 1e6 * wall / events,
                             "cpu_us_per_event": 1e6 * cpu / events, "rows": counts,
                             "rows_ok": counts == expected})
                print(f"  round {round_} {shape:28s} {name:12s} "
                      f"{1e6 * wall / events:6.2f} us/event ({1e6 * cpu / events:.2f} CPU)",
                      file=sys.stderr, flush=True)
    return runs


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape: the medians of both cases and of the per-round ratios."""
    rows = []
    for shape in SHAPES:
        mine = [r for r in runs if r["shape"] == shape]
        store = {r["round"]: r for r in mine if r["case"] == "write_events"}
        alone = {r["round"]: r for r in mine if r["case"] == "SQL alone"}
        rounds = sorted(store.keys() & alone.keys())
        ratios = [alone[n]["us_per_event"] / store[n]["us_per_event"] for n in rounds]
        rows.append({
            "shape": shape, "rounds": len(rounds),
            "write_events_us": round(statistics.median(
                store[n]["us_per_event"] for n in rounds), 2),
            "write_events_cpu_us": round(statistics.median(
                store[n]["cpu_us_per_event"] for n in rounds), 2),
            "sql_alone_us": round(statistics.median(alone[n]["us_per_event"] for n in rounds), 2),
            "sql_alone_cpu_us": round(statistics.median(
                alone[n]["cpu_us_per_event"] for n in rounds), 2),
            "sql_alone_share": round(statistics.median(ratios), 3),
            "share_each_round": [round(r, 3) for r in ratios],
        })
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axis = plt.subplots(figsize=(8, 4))
    width = 0.38
    places = range(len(rows))
    for offset, (key, label) in enumerate((("write_events_us", "write_events"),
                                           ("sql_alone_us", "the same rows, SQL alone"))):
        bars = axis.bar([p + (offset - 0.5) * width for p in places], [r[key] for r in rows],
                        width, label=label)
        axis.bar_label(bars, fmt="%.2f")
    axis.set_xticks(list(places), [r["shape"] for r in rows])
    axis.set_ylabel("µs per event (wall, median)")
    axis.set_title("SQLite store writes against SQLite's own cost for the rows")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500,
                        help="events per transaction (the Pub/Sub benchmark's commits hold ~500)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="5,000 events, 1 round")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.rounds = 5_000, 1
    with tempfile.TemporaryDirectory() as scratch:
        runs = measure(args.events, args.batch, args.rounds, Path(scratch))
    rows = summarize(runs)
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = "store_floor-quick" if args.quick else "store_floor"
    (out / f"{stem}.json").write_text(json.dumps({
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "machine": platform.machine(), "events": args.events, "batch": args.batch,
        "rounds": args.rounds, "summary": rows, "runs": runs}, indent=2))
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[k for k in rows[0] if k != "share_each_round"],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png")
    print("| rows per event | write_events µs (CPU) | SQL alone µs (CPU) "
          "| SQL alone / write_events |")
    print("|---|--:|--:|--:|")
    for r in rows:
        print(f"| {r['shape']} | {r['write_events_us']:.2f} ({r['write_events_cpu_us']:.2f}) | "
              f"{r['sql_alone_us']:.2f} ({r['sql_alone_cpu_us']:.2f}) | "
              f"{r['sql_alone_share']:.2f} ({', '.join(map(str, r['share_each_round']))}) |")
    print(f"wrote {out}/{stem}.json, .csv, .png", file=sys.stderr)
    bad = [r for r in runs if not r["rows_ok"]]
    if bad:
        print(f"error: wrong row counts in {len(bad)} run(s): {bad[0]['rows']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
