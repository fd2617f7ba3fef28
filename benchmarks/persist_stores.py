"""Persistence gate on SQLite and PostgreSQL, same run: events/s and confirm latency per store.

The measurement is ``persist.py``'s :func:`~persist.run_policy`: the
runtime's :class:`PersistGate` writing on its own database thread, exactly
as the triggerer does, every event a trigger event of a watched asset with
a DAG scheduled on it (so each also writes an asset event and a queued DAG
run). Only the store differs:

* ``sqlite`` - a new file (WAL, ``synchronous=FULL``) per run;
* ``postgres`` - a new database per run on one throwaway PostgreSQL cluster
  (:func:`~sharedstream.testing.brokers.postgres.postgres_server` with
  ``durable=True``: ``fsync`` and ``synchronous_commit`` on), on loopback,
  through :class:`~sharedstream.store.postgres.PostgresStore` (psycopg 3).

Policies: the default group commit offered as fast as it takes events
(throughput; latency is then queueing), the group commit at a fixed offered
rate (the latency a sustainable load sees), and one transaction per event
(what one fsync per event costs). Every run uses the triggerer's thread
switch interval (``[store] switch_interval_ms``).

``--repeat R`` runs R rounds; in each round every policy runs on every
store back to back, the store order alternating between rounds, so noise
that hits a round hits both stores. Reported per (policy, store): the
median of each metric over the rounds, and the median of the rounds' own
PostgreSQL / SQLite ratio. Numbers are reported, never asserted; a run that
stored the wrong count exits 1. Writes
``benchmarks/results/persist_stores.{json,csv,png}`` (``-quick`` with ``--quick``).

Usage: ``python benchmarks/persist_stores.py [--store sqlite,postgres] [--repeat 3] [--quick]
[--events N] [--rate R] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import platform
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from persist import RESULTS, run_policy

from sharedstream.runtime.config import StoreConfig
from sharedstream.testing.brokers.postgres import fresh_database, postgres_server

STORES = ("sqlite", "postgres")
METRICS = ("events_per_s", "confirm_ms_p50", "confirm_ms_p95", "confirm_ms_p99")


@dataclass(frozen=True)
class Policy:
    """One row of the table: how events are offered and committed."""

    name: str
    events: int
    batch_max: int
    linger: float
    rate: float | None  # offered events/s; None: as fast as the gate takes them

    @property
    def label(self) -> str:
        return f"{self.name} @{'max' if self.rate is None else f'{self.rate:g}'}/s"


def policies(args: argparse.Namespace) -> list[Policy]:
    """The rows: group commit saturated and paced, one commit per event saturated."""
    store = StoreConfig()
    batch, linger = store.persist_batch_max, store.persist_linger_ms / 1000
    quick = args.quick
    return [
        Policy("group", 5_000 if quick else args.events, batch, linger, None),
        Policy("group", 300 if quick else 1_500, batch, linger, args.rate),
        Policy("group", 1_000 if quick else 6_000, batch, linger, args.rate * 10),
        Policy("per-event", 200 if quick else 1_000, 1, 0.0, None),
    ]


@contextlib.contextmanager
def store_urls(stores: Sequence[str]) -> Iterator[dict[str, str | None]]:
    """Each store's admin URL for the block: PostgreSQL's cluster; ``None`` for SQLite."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str | None] = {}
        for store in stores:
            urls[store] = (stack.enter_context(postgres_server(durable=True))
                           if store == "postgres" else None)
        yield urls


def run_one(policy: Policy, store: str, admin: str | None, switch_interval: float,
            ) -> dict[str, Any]:
    """One run of ``policy`` on a fresh store (a new SQLite file or PostgreSQL database)."""
    with (fresh_database(admin, prefix="bench_persist") if admin is not None
          else contextlib.nullcontext()) as url:
        row = asyncio.run(run_policy(policy.name, policy.events, policy.batch_max,
                                     policy.linger, policy.rate,
                                     switch_interval=switch_interval, url=url))
    return {"store": store, "label": policy.label, **row}


def medians(runs: list[dict[str, Any]], stores: Sequence[str]) -> list[dict[str, Any]]:
    """Per (policy, store): each metric's median over the rounds, and the same-round ratio."""
    rows = []
    labels = list(dict.fromkeys(run["label"] for run in runs))
    for label in labels:
        by_store = {s: [r for r in runs if r["label"] == label and r["store"] == s]
                    for s in stores}
        for store in stores:
            mine = by_store[store]
            row: dict[str, Any] = {"policy": label, "store": store, "events": mine[0]["events"],
                                   "rounds": len(mine)}
            for metric in METRICS:
                row[metric] = round(statistics.median(r[metric] for r in mine), 2)
                row[f"runs_{metric}"] = [round(r[metric], 2) for r in mine]
            if store != stores[0]:
                base = by_store[stores[0]]
                ratios = [a["events_per_s"] / b["events_per_s"]
                          for a, b in zip(mine, base, strict=True)]
                row[f"events_per_s_vs_{stores[0]}"] = round(statistics.median(ratios), 3)
                row[f"runs_events_per_s_vs_{stores[0]}"] = [round(x, 3) for x in ratios]
            rows.append(row)
    return rows


def plot(rows: list[dict[str, Any]], stores: Sequence[str], path: Path) -> None:
    """Throughput of the saturated rows and confirm latency (p50/p95/p99) of every row."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = list(dict.fromkeys(r["policy"] for r in rows))
    width = 0.8 / len(stores)
    cell = {(r["policy"], r["store"]): r for r in rows}
    saturated = [label for label in labels if label.endswith("@max/s")]
    for i, store in enumerate(stores):
        values = [cell[label, store]["events_per_s"] for label in saturated]
        bars = left.bar([x + i * width for x in range(len(saturated))], values, width,
                        label=store)
        left.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
    left.set_xticks([x + width * (len(stores) - 1) / 2 for x in range(len(saturated))],
                    saturated, fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("events stored per second")
    left.set_title("throughput, offered as fast as possible")
    left.legend()
    xs = [f"{label.replace(' @', chr(10) + '@')}\n{store}" for label in labels
          for store in stores]
    for j, metric in enumerate(("confirm_ms_p50", "confirm_ms_p95", "confirm_ms_p99")):
        right.bar([x + j * 0.27 for x in range(len(xs))],
                  [cell[label, store][metric] for label in labels for store in stores], 0.27,
                  label=metric.removeprefix("confirm_ms_"))
    right.set_xticks([x + 0.27 for x in range(len(xs))], xs, fontsize=7)
    right.set_yscale("log")
    right.set_ylabel("put -> confirm_persisted (ms)")
    right.set_title("confirmation latency (medians of the rounds)")
    right.legend()
    fig.suptitle("Persistence gate: SQLite (WAL, synchronous=FULL) vs PostgreSQL (fsync on), "
                 "same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _stores(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or set(names) - set(STORES) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected names from {list(STORES)}, got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=_stores, default=list(STORES),
                        help="stores to compare, comma-separated (default sqlite,postgres)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--events", type=int, default=20_000,
                        help="events for the saturated group commit (default 20,000)")
    parser.add_argument("--rate", type=float, default=300.0,
                        help="offered events/s of the first paced row; the second offers 10x")
    parser.add_argument("--quick", action="store_true", help="small runs, one round")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    stores: list[str] = args.store
    rounds = 1 if args.quick else args.repeat
    switch_interval = StoreConfig().switch_interval_ms / 1000
    runs: list[dict[str, Any]] = []
    with store_urls(stores) as admins:
        for round_no in range(rounds):
            order = stores if round_no % 2 == 0 else stores[::-1]
            for policy in policies(args):
                for store in order:
                    run = {"round": round_no, **run_one(policy, store, admins[store],
                                                        switch_interval)}
                    print(f"round {round_no} {store:>8} {policy.label:>18}: "
                          f"{run['events_per_s']:>9,.0f} events/s, confirm p50 "
                          f"{run['confirm_ms_p50']:.2f} p95 {run['confirm_ms_p95']:.2f} p99 "
                          f"{run['confirm_ms_p99']:.2f} ms ({run['stored']} stored, "
                          f"{run['dag_runs']} runs)", file=sys.stderr, flush=True)
                    runs.append(run)
    bad = [f"{r['store']} {r['label']} round {r['round']}" for r in runs
           if not r["stored"] == r["dag_runs"] == r["events"]]
    rows = medians(runs, stores)
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = "persist_stores-quick" if args.quick else "persist_stores"
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.platform(),
        "durability": {"sqlite": "WAL, synchronous=FULL",
                       "postgres": "fsync on, synchronous_commit on, loopback TCP"},
        "switch_interval_ms": switch_interval * 1000, "rounds": rounds,
        "rows": rows, "runs": runs}, indent=2) + "\n")
    flat = [{k: v for k, v in row.items() if not k.startswith("runs_")} for row in rows]
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
        writer.writeheader()
        writer.writerows(flat)
    plot(rows, stores, out / f"{stem}.png")
    ratio = f"events_per_s_vs_{stores[0]}"
    print(f"| policy | store | events | events/s | confirm p50 / p95 / p99 ms | "
          f"÷ {stores[0]} (same round) |")
    print("|---|---|--:|--:|--:|--:|")
    for row in rows:
        vs = f"{row[ratio]:.2f}x" if ratio in row else "-"
        print(f"| {row['policy']} | {row['store']} | {row['events']:,} | "
              f"{row['events_per_s']:,.0f} | {row['confirm_ms_p50']:.1f} / "
              f"{row['confirm_ms_p95']:.1f} / {row['confirm_ms_p99']:.1f} | {vs} |")
    print(f"results in {out}/{stem}.*", file=sys.stderr)
    if bad:
        print(f"error: wrong counts stored in {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
