"""Persistence-gate benchmark: events/s stored and persist-confirmation latency.

Runs the runtime's :class:`PersistGate` against a real SQLite store (WAL,
``synchronous=FULL``) on its own database thread, exactly as the triggerer
does, and compares two policies in the same run:

* ``group`` - the default group commit (up to 500 events per transaction,
  2 ms linger);
* ``per-event`` - one transaction per event (``batch_max=1``, no linger),
  what storing each event as it comes would cost.

Each event is a trigger event of a watched asset with a DAG scheduled on
it, so every event also writes an asset event and a queued DAG run.
Producers put events at a fixed offered rate (or as fast as they can);
latency is measured per event from ``put`` to the ``confirm`` call that
carries its seq. Writes ``benchmarks/results/persist.{json,csv,png}``.

Usage: ``python benchmarks/persist.py [--events N] [--quick] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sharedstream.persist import PersistGate
from sharedstream.serde import pack_kwargs
from sharedstream.store.base import DagSpec, PendingEvent, TriggerSpec, WatcherSpec, WriteResult
from sharedstream.store.sqlite import SqliteStore

RESULTS = Path(__file__).resolve().parent / "results"


async def run_policy(
    name: str, events: int, batch_max: int, linger: float, rate: float | None
) -> dict[str, Any]:
    """Push ``events`` through a gate with this policy; return throughput and latency.

    ``rate`` paces the producer (events/s offered); ``None`` offers as fast as
    the gate takes them (saturation: latency is then mostly queueing).
    """
    with tempfile.TemporaryDirectory() as tmp:
        db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-db")
        loop = asyncio.get_running_loop()
        store: SqliteStore = await loop.run_in_executor(db, SqliteStore, Path(tmp) / "b.db")
        await loop.run_in_executor(db, store.migrate)
        ids = await loop.run_in_executor(
            db,
            store.sync_definitions,
            [TriggerSpec("fp", "bench.Trigger", b"kwargs")],
            [WatcherSpec("orders", "w", "fp")],
            [DagSpec("process", {"asset": "orders"})],
        )
        trigger_id = ids["fp"]
        put_at: dict[int, float] = {}
        latencies: list[float] = []
        done = asyncio.Event()

        async def write(batch: Sequence[PendingEvent]) -> WriteResult:
            return await loop.run_in_executor(db, store.write_events, batch)

        def confirm(seqs: list[int]) -> None:
            now = time.perf_counter()
            latencies.extend(now - put_at.pop(seq) for seq in seqs)
            if len(latencies) == events:
                done.set()

        gate = PersistGate(write=write, confirm=confirm, batch_max=batch_max, linger=linger)
        writer = asyncio.create_task(gate.run())
        payload = pack_kwargs({"payload": {"order": 1, "amount": 100}})
        started = time.perf_counter()
        for seq in range(events):
            put_at[seq] = time.perf_counter()
            await gate.put(PendingEvent(trigger_id, f"k/{seq}", payload), seq)
            if rate is not None:
                await asyncio.sleep(max(0.0, started + (seq + 1) / rate - time.perf_counter()))
            elif seq % 64 == 63:
                await asyncio.sleep(0)  # producers interleave with the writer, as in the triggerer
        await done.wait()
        elapsed = time.perf_counter() - started
        gate.stop()
        await writer
        counts = await loop.run_in_executor(db, store.counts)
        await loop.run_in_executor(db, store.close)
        db.shutdown()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "policy": name,
        "offered_per_s": rate or "max",
        "events": events,
        "batch_max": batch_max,
        "linger_ms": linger * 1000,
        "seconds": elapsed,
        "events_per_s": events / elapsed,
        "confirm_ms_p50": pct(0.50),
        "confirm_ms_p95": pct(0.95),
        "confirm_ms_p99": pct(0.99),
        "confirm_ms_mean": statistics.fmean(latencies) * 1000,
        "stored": counts["trigger_events"],
        "dag_runs": counts["dag_runs"],
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bar charts of throughput and confirm latency per policy."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    saturated = [r for r in rows if r["offered_per_s"] == "max"]
    left.bar([r["policy"] for r in saturated], [r["events_per_s"] for r in saturated],
             color=["tab:blue", "tab:gray"])
    left.set_ylabel("events stored per second")
    left.set_title("throughput (event + asset event + DAG run)")
    names = [f"{r['policy']}\n@{r['offered_per_s']}/s" for r in rows]
    for i, key in enumerate(("confirm_ms_p50", "confirm_ms_p99")):
        right.bar([x + i * 0.35 for x in range(len(rows))], [r[key] for r in rows], 0.35,
                  label=key.removeprefix("confirm_ms_"))
    right.set_xticks([x + 0.175 for x in range(len(rows))], names, fontsize=8)
    right.set_yscale("log")
    right.set_ylabel("put -> confirm_persisted (ms)")
    right.set_title("confirmation latency")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="events for group commit")
    parser.add_argument("--per-event-events", type=int, default=2_000,
                        help="events for one-commit-per-event (it is slow)")
    parser.add_argument("--rate", type=float, default=300.0,
                        help="offered events/s for the latency runs (both policies; default 300)")
    parser.add_argument("--quick", action="store_true", help="a few seconds: 5,000 / 300 events")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    group_n, single_n = (5_000, 300) if args.quick else (args.events, args.per_event_events)
    rows = []
    paced_n = 300 if args.quick else 1_500
    for name, n, batch_max, linger, rate in (
        ("group", group_n, 500, 0.002, None),
        ("per-event", single_n, 1, 0.0, None),
        ("group", paced_n, 500, 0.002, args.rate),
        ("per-event", paced_n, 1, 0.0, args.rate),
    ):
        row = asyncio.run(run_policy(name, n, batch_max, linger, rate))
        print(f"{name:>9} @{rate or 'max'}/s: {row['events_per_s']:>9,.0f} events/s, confirm p50 "
              f"{row['confirm_ms_p50']:.2f} ms p99 {row['confirm_ms_p99']:.2f} ms "
              f"({row['stored']} stored, {row['dag_runs']} runs)", file=sys.stderr)
        if row["stored"] != n or row["dag_runs"] != n:
            print(f"error: {name} stored {row['stored']} of {n}", file=sys.stderr)
            return 1
        rows.append(row)
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = "persist-quick" if args.quick else "persist"
    result = {"python": sys.version.split()[0], "machine": platform.machine(), "rows": rows,
              "speedup_group_vs_per_event": rows[0]["events_per_s"] / rows[1]["events_per_s"]}
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png")
    print(f"group commit: {result['speedup_group_vs_per_event']:.1f}x the per-event rate; "
          f"results in {out}/{stem}.*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
