"""Persistence-gate benchmark: events/s stored and persist-confirmation latency.

Runs the runtime's :class:`PersistGate` against a real SQLite store (WAL,
``synchronous=FULL``) on its own database thread, exactly as the triggerer
does, and compares these policies in the same run (``persist_stores.py``
runs the same measurement, :func:`run_policy`, on SQLite and PostgreSQL):

* ``group`` - the default group commit (``[store] persist_batch_max``
  events per transaction at most, ``persist_linger_ms`` linger);
* ``per-event`` - one transaction per event (``batch_max=1``, no linger),
  what storing each event as it comes would cost;
* ``group, busy loop`` - the group commit while another task keeps the
  event loop busy (2 ms slices of pure Python; the loop never idles: the
  worst case of filters under load), once with Python's default 5 ms thread switch interval and once
  with the triggerer's ``[store] switch_interval_ms`` (0.5 ms): the database
  thread takes the GIL back after each SQLite statement, and how long that
  waits is what the two rows compare.

Each event is a trigger event of a watched asset with a DAG scheduled on
it, so every event also writes an asset event and a queued DAG run.
Producers put events at a fixed offered rate (or as fast as they can);
latency is measured per event from ``put`` to the ``confirm`` call that
carries its seq. Writes ``benchmarks/results/persist.{json,csv,png}``.

``--ours-rev REV`` measures instead the gate as committed at ``REV`` against
the working tree, side by side: ``REV``'s ``sharedstream/`` is exported
(``_revisions.export_revision``) and each measurement runs in a child
process of this script (``PYTHONPATH`` = the export for ``REV``; nothing for
the working tree), alternating which goes first from round to round. It
writes ``persist-vs-<rev>.{json,csv,png}`` with every run, the medians and
the median of each round's own working tree / ``REV`` ratio (see
:mod:`_persist_compare`).

Usage: ``python benchmarks/persist.py [--events N] [--quick] [--output-dir D]``
``[--ours-rev REV [--rounds N]]``
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

from sharedstream.runtime.config import StoreConfig
from sharedstream.runtime.persist import PersistGate
from sharedstream.runtime.serde import pack_kwargs
from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    TriggerSpec,
    WatcherSpec,
    WriteResult,
    open_store,
)

RESULTS = Path(__file__).resolve().parent / "results"


async def run_policy(
    name: str, events: int, batch_max: int, linger: float, rate: float | None,
    *, busy: bool = False, switch_interval: float | None = None, url: str | None = None,
) -> dict[str, Any]:
    """Push ``events`` through a gate with this policy; return throughput and latency.

    ``rate`` paces the producer (events/s offered); ``None`` offers as fast as
    the gate takes them (saturation: latency is then mostly queueing).
    ``busy`` adds a task that keeps the loop busy; ``switch_interval`` (s)
    is set for the run (``None``: Python's current one). ``url`` names an
    empty store to write to (a fresh PostgreSQL database, say); ``None``: a
    new SQLite file in a temporary directory, removed afterwards.
    """
    previous = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    try:
        if url is not None:
            return await _run_policy(name, events, batch_max, linger, rate, busy=busy, url=url)
        with tempfile.TemporaryDirectory() as tmp:
            return await _run_policy(name, events, batch_max, linger, rate, busy=busy,
                                     url=f"sqlite:///{Path(tmp) / 'b.db'}")
    finally:
        sys.setswitchinterval(previous)


async def _spin() -> None:
    """Keep the event loop busy: 2 ms slices of Python; it never waits in select."""
    while True:
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


async def _run_policy(
    name: str, events: int, batch_max: int, linger: float, rate: float | None, *, busy: bool,
    url: str,
) -> dict[str, Any]:
    db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-db")
    loop = asyncio.get_running_loop()
    store: MetadataStore = await loop.run_in_executor(db, lambda: open_store(url, create=True))
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
    spinner = asyncio.create_task(_spin()) if busy else None
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
    if spinner is not None:
        spinner.cancel()
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
        "switch_interval_ms": sys.getswitchinterval() * 1000,
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
    labels = [r["policy"].replace(", ", "\n") + (
        f"\nswitch {r['switch_interval_ms']:g} ms" if "busy" in r["policy"] else "")
        for r in saturated]
    left.bar(labels, [r["events_per_s"] for r in saturated],
             color=["tab:blue", "tab:gray", "tab:orange", "tab:green"][:len(saturated)])
    left.tick_params(axis="x", labelsize=8)
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
    parser.add_argument("--ours-rev", help="compare the working tree with this git revision")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --ours-rev (default 3)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one case as JSON (--ours-rev)
    args = parser.parse_args(argv)
    if args.child is not None:
        import sharedstream  # noqa: PLC0415 - which copy ran, for the record

        row = asyncio.run(run_policy(**json.loads(args.child)))
        print(json.dumps({**row, "sharedstream": str(Path(sharedstream.__file__).parent)}))
        return 0
    if args.ours_rev is not None:
        from _persist_compare import compare  # noqa: PLC0415 - only this mode needs it

        return compare(args.ours_rev, rounds=1 if args.quick else args.rounds,
                       events=10_000 if args.quick else args.events, out=args.output_dir,
                       stem="persist-quick-vs" if args.quick else "persist-vs")
    group_n, single_n = (5_000, 300) if args.quick else (args.events, args.per_event_events)
    rows = []
    paced_n = 300 if args.quick else 1_500
    busy_n = 1_000 if args.quick else 5_000  # Python's 5 ms interval makes this one slow
    store = StoreConfig()
    batch, linger = store.persist_batch_max, store.persist_linger_ms / 1000
    for name, n, batch_max, wait, rate, busy, interval in (
        ("group", group_n, batch, linger, None, False, None),
        ("per-event", single_n, 1, 0.0, None, False, None),
        ("group", paced_n, batch, linger, args.rate, False, None),
        ("per-event", paced_n, 1, 0.0, args.rate, False, None),
        ("group, busy loop", busy_n, batch, linger, None, True, 0.005),
        ("group, busy loop", busy_n, batch, linger, None, True, store.switch_interval_ms / 1000),
    ):
        row = asyncio.run(run_policy(name, n, batch_max, wait, rate, busy=busy,
                                     switch_interval=interval))
        print(f"{name:>16} @{rate or 'max'}/s (switch {row['switch_interval_ms']:g} ms): "
              f"{row['events_per_s']:>9,.0f} events/s, confirm p50 "
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
              "speedup_group_vs_per_event": rows[0]["events_per_s"] / rows[1]["events_per_s"],
              "busy_loop_speedup_short_switch_interval":
                  rows[5]["events_per_s"] / rows[4]["events_per_s"]}
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png")
    print(f"group commit: {result['speedup_group_vs_per_event']:.1f}x the per-event rate; "
          f"busy loop: {result['busy_loop_speedup_short_switch_interval']:.1f}x with a "
          f"{store.switch_interval_ms:g} ms switch interval; results in {out}/{stem}.*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
