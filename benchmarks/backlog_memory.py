"""Memory of a shared K = 100 consumer against the backlog it starts with (issue 19, item 2).

With K = 100 watchers every Kafka record yields ten events, and the store
is the bottleneck: the broker holds a backlog the triggerer cannot keep up
with. What bounds the triggerer's memory then is the producer's read-ahead
(unadvanced records), the subscribers' queues and the persistence gate's
intake pause (20,000 queued events), not the backlog. This benchmark shows
it: for each backlog N (``--backlogs``, records pre-produced to a fresh
3-partition topic on Tansu) a fresh child process runs the in-process
triggerer on K watchers (``kafka_e2e.run_shared``: watcher j keeps bucket
``j % 10``) until every record is committed, sampling its own resident set
(``VmRSS``) every 20 ms. Reported per run: RSS before the triggerer starts,
its peak during the run, the growth, the median over the run's second half
(a plateau, if memory is bounded, whatever the backlog), msgs/s and events
stored (all of them, or the run fails); the plot draws RSS over time, one
line per backlog. The records are produced by the parent, so the child's
memory holds only what the triggerer keeps.

``--rounds R`` repeats the list (each round in the opposite order of the
last); the medians per backlog are printed and written. Writes
``benchmarks/results/backlog_memory.{json,csv,png}``.

Usage: ``python benchmarks/backlog_memory.py [--backlogs 20000,100000,300000,1000000]
[--k 100] [--rounds 2] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import importlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLE_SECONDS = 0.02
SERIES_SECONDS = 0.5


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class PeakSampler:
    """The highest ``VmRSS`` seen by a thread sampling every :data:`SAMPLE_SECONDS`.

    ``series`` keeps ``(seconds since start, MB)`` every :data:`SERIES_SECONDS`.
    """

    def __init__(self) -> None:
        self.peak = _rss_mb()
        self.series: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())

    def _run(self) -> None:
        started = last = time.perf_counter()
        while not self._stop.wait(SAMPLE_SECONDS):
            rss = _rss_mb()
            self.peak = max(self.peak, rss)
            now = time.perf_counter()
            if now - last >= SERIES_SECONDS:
                self.series.append((round(now - started, 2), round(rss, 1)))
                last = now


def child(bootstrap: str, topic: str, ends: dict[int, int], k: int) -> dict[str, Any]:
    """Run the shared case on ``topic`` in this process; its figures as a dict."""
    from kafka_e2e import run_shared  # noqa: PLC0415 - the child's own imports

    for module in ("aiokafka", "sharedstream.runtime.triggerer"):  # loaded before the baseline
        importlib.import_module(module)

    messages = sum(ends.values())
    with tempfile.TemporaryDirectory(prefix="sharedstream-backlog-") as workdir:
        before = _rss_mb()
        with PeakSampler() as sampler:
            result = asyncio.run(run_shared(bootstrap, topic, ends, messages, k=k,
                                            workdir=Path(workdir), limit=900.0))
    later = [mb for at, mb in sampler.series if at >= result.seconds / 2]
    return {"backlog": messages, "k": k, "rss_before_mb": round(before, 1),
            "rss_peak_mb": round(sampler.peak, 1),
            "rss_growth_mb": round(sampler.peak - before, 1),
            "rss_second_half_mb": round(statistics.median(later), 1) if later else None,
            "rss_series": sampler.series,
            "msgs_per_s": round(result.per_s, 1),
            "steady_msgs_per_s": round(result.steady_per_s, 1),
            "seconds": round(result.seconds, 2), "events_stored": result.events,
            "events_expected": result.expected_events}


def measure(bootstrap: str, backlog: int, k: int, round_: int) -> dict[str, Any]:
    """Produce ``backlog`` records to a fresh topic here, then run the child on them."""
    from kafka_e2e import create_topic, produce  # noqa: PLC0415

    topic = f"backlog.{round_}.{backlog}"

    async def prepare() -> dict[int, int]:
        await create_topic(bootstrap, topic, 3)
        return await produce(bootstrap, topic, backlog, 3)

    ends = asyncio.run(prepare())
    print(f"round {round_}: {backlog:,} records on {topic}; K = {k} consuming", file=sys.stderr,
          flush=True)
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(
            {"bootstrap": bootstrap, "topic": topic, "ends": ends, "k": k})],
        check=True, capture_output=True, text=True, cwd=Path(__file__).parent)
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["round"] = round_
    print(f"  RSS {row['rss_before_mb']:.0f} -> peak {row['rss_peak_mb']:.0f} MB "
          f"(+{row['rss_growth_mb']:.0f}), {row['msgs_per_s']:,.0f} msgs/s, "
          f"{row['events_stored']:,}/{row['events_expected']:,} events", file=sys.stderr,
          flush=True)
    return row


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backlog, the median of each figure over the rounds."""
    rows = []
    for backlog in sorted({r["backlog"] for r in runs}):
        mine = [r for r in runs if r["backlog"] == backlog]
        row = {"backlog": backlog, "k": mine[0]["k"], "rounds": len(mine)}
        for name in ("rss_before_mb", "rss_peak_mb", "rss_growth_mb", "rss_second_half_mb",
                     "msgs_per_s", "steady_msgs_per_s", "seconds"):
            values = [r[name] for r in mine if r[name] is not None]
            row[name] = round(statistics.median(values), 1) if values else None
        rows.append(row)
    return rows


def plot(rows: list[dict[str, Any]], runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run in (r for r in runs if r["round"] == 1):
        times = [0.0] + [at for at, _ in run["rss_series"]]
        sizes = [run["rss_before_mb"]] + [mb for _, mb in run["rss_series"]]
        left.plot(times, sizes, label=f"backlog {run['backlog']:,}")
    left.set_xlabel("seconds since the triggerer started")
    left.set_ylabel("resident set, MB")
    left.set_ylim(bottom=0)
    left.set_title(f"Memory over a run, shared K = {rows[0]['k']} (round 1)")
    left.legend()
    labels = [f"{r['backlog']:,}" for r in rows]
    bars = right.bar(labels, [r["msgs_per_s"] for r in rows])
    right.bar_label(bars, fmt="%.0f")
    right.set_xlabel("backlog (records)")
    right.set_ylabel("msgs/s, whole run")
    right.set_title("Throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backlogs", default="20000,100000,300000,1000000",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        ends = {int(p): int(e) for p, e in spec["ends"].items()}
        print(json.dumps(child(spec["bootstrap"], spec["topic"], ends, spec["k"])))
        return 0

    from sharedstream.testing.brokers import tansu_broker  # noqa: PLC0415

    runs: list[dict[str, Any]] = []
    with tansu_broker() as bootstrap:
        order = list(args.backlogs)
        for round_ in range(1, args.rounds + 1):
            runs += [measure(bootstrap, n, args.k, round_) for n in order]
            order.reverse()
    bad = [r for r in runs if r["events_stored"] != r["events_expected"]]
    rows = medians(runs)
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "backlog_memory.json").write_text(json.dumps({
        "python": platform.python_version(), "machine": platform.machine(), "broker": "tansu",
        "partitions": 3, "k": args.k, "sample_seconds": SAMPLE_SECONDS,
        "workload": "watcher j matches bucket == j % 10 (ten events per record)",
        "medians": rows, "runs": runs}, indent=2))
    with (out / "backlog_memory.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, runs, out / "backlog_memory.png")
    print("| backlog | run s | RSS before MB | peak MB | growth MB | second half MB | msgs/s |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        half = "-" if r["rss_second_half_mb"] is None else f"{r['rss_second_half_mb']:.0f}"
        print(f"| {r['backlog']:,} | {r['seconds']:.0f} | {r['rss_before_mb']:.0f} | "
              f"{r['rss_peak_mb']:.0f} | {r['rss_growth_mb']:.0f} | {half} | "
              f"{r['msgs_per_s']:,.0f} |")
    print(f"wrote {out}/backlog_memory.json, .csv, .png", file=sys.stderr)
    if bad:
        print(f"error: wrong event counts in {len(bad)} run(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    status = main()
    print(f"took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    sys.exit(status)
