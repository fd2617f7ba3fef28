"""Selective fan-out: K watchers on one stream, each wanting one value of one field.

The fan-out benchmark's prefilter workload. Many watchers on one stream,
each wanting a different slice (one customer, one tenant, one device), is
where sharing pays most: trigger ``i`` of K wants the raw events with
``raw % K == i``, so every raw event is wanted by exactly one watcher and
fires one trigger event. Run it with the project's interpreter::

    .venv/bin/python benchmarks/selective.py               # K = 10, 100, 1000 (about 2 minutes)
    .venv/bin/python benchmarks/selective.py --quick --no-airflow   # smoke run (seconds)

Each configuration runs in a fresh interpreter (``_fanout_workload.py
--selective``), ours and Airflow 3.3.2's ``SharedStreamManager`` in turns,
``--repeat`` times each, in ack mode (the mode the runtime's broker
triggers use). Both run byte-for-byte the same filter, which tests the
residue itself; ours also declares it as a keyed prefilter
(:class:`~sharedstream.engine.fanout.KeyedPrefilter`), so one selection
per raw event routes it to the one watcher that wants it. Airflow's engine
has no prefilter: every filter sees every raw event.

The two engines get different numbers of raw events (``--events`` and
``--airflow-events``), sized so each run takes about a second or more:
the measure is raw events per second, not the wall time of one N.

Writes ``selective.json``, ``selective.csv`` and ``selective.png`` (events/s
and memory growth against K) under ``benchmarks/results/``, and prints a
table with the same-round ratio of every K. The target (reported, not
asserted): at least 200,000 raw events/s for ours at K = 1000.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fanout import (
    Runner,
    _int_list,
    add_runner_options,
    machine_info,
    prepare_runners,
    progress,
    run_workload,
)

TARGET_EVENTS_PER_S_K1000 = 200_000.0
"""Ours, ack mode, K = 1000 selective watchers: at least this many raw events per second."""

DEFAULT_KS = (10, 100, 1000)
DEFAULT_EVENTS = 200_000
"""Raw events per run for ours (about a second at K = 1000)."""
AIRFLOW_PAIRS = 2_000_000
"""Airflow's runs get ``AIRFLOW_PAIRS / K`` raw events (at least ``AIRFLOW_MIN_EVENTS``):
every filter sees every raw event, so its cost grows with N x K."""
AIRFLOW_MIN_EVENTS = 1_000
CSV_FIELDS = (
    "impl",
    "subscribers",
    "events",
    "repeats",
    "events_per_s",
    "events_per_s_runs",
    "us_per_event",
    "rss_growth_mb",
    "latency_p50_us",
    "latency_p99_us",
    "ours_over_airflow",
    "ok",
    "error",
)


def airflow_events(k: int, override: int | None) -> int:
    """How many raw events Airflow's run at ``k`` watchers gets."""
    return override or max(AIRFLOW_MIN_EVENTS, AIRFLOW_PAIRS // k)


def run_child(runner: Runner, k: int, events: int) -> dict[str, Any]:
    """One run of the selective workload in a fresh interpreter; its measurements."""
    args = ["--mode", "ack", "--subscribers", str(k), "--events", str(events), "--selective"]
    return run_workload(runner, args, {"impl": runner.impl, "subscribers": k, "events": events})


def summarize(impl: str, k: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run of one (implementation, K), with every run's rate listed."""
    good = [r for r in runs if r.get("ok")]
    if not good:
        failed = runs[-1]
        return {
            "impl": impl,
            "subscribers": k,
            "events": failed.get("events"),
            "ok": False,
            "error": failed.get("error") or str(failed.get("checks")),
        }
    rates = sorted(float(r["events_per_s"]) for r in good)
    median = statistics.median(rates)
    chosen = min(good, key=lambda r: abs(float(r["events_per_s"]) - median))
    latency = chosen.get("latency_us") or {}
    return {
        "impl": impl,
        "subscribers": k,
        "events": chosen["events"],
        "repeats": len(runs),
        "events_per_s": median,
        "events_per_s_runs": [round(float(r.get("events_per_s") or 0.0)) for r in runs],
        "us_per_event": 1e6 / median,
        "rss_growth_mb": chosen["rss_growth_mb"],
        "latency_p50_us": latency.get("p50"),
        "latency_p99_us": latency.get("p99"),
        "prefilter": chosen.get("prefilter"),
        "ok": len(good) == len(runs),
        "error": None if len(good) == len(runs) else f"{len(runs) - len(good)} run(s) failed",
    }


def measure(
    runners: Sequence[Runner], ks: Sequence[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every K, both implementations in turns within each round; median of the rounds."""
    rows: list[dict[str, Any]] = []
    for k in ks:
        runs: dict[str, list[dict[str, Any]]] = {runner.impl: [] for runner in runners}
        for round_no in range(1, args.repeat + 1):
            for runner in runners:
                events = (
                    args.events if runner.impl == "ours" else airflow_events(k, args.airflow_events)
                )
                result = run_child(runner, k, events)
                runs[runner.impl].append(result)
                rate = result.get("events_per_s")
                shown = (
                    f"{rate:,.0f} raw events/s"
                    if result.get("ok") and rate
                    else (f"FAILED {result.get('error') or result.get('checks')}")
                )
                progress(
                    f"K={k:<5} round {round_no}/{args.repeat} {runner.impl:<8} "
                    f"N={events:<7} {shown}"
                )
        summary = {impl: summarize(impl, k, impl_runs) for impl, impl_runs in runs.items()}
        ours, theirs = summary.get("ours"), summary.get("airflow")
        if ours and theirs and ours.get("ok") and theirs.get("ok"):
            # The same-round ratio: each round's pair of runs, then the median.
            pairs = zip(runs["ours"], runs["airflow"], strict=True)
            ratios = [float(a["events_per_s"]) / float(b["events_per_s"]) for a, b in pairs]
            ours["ours_over_airflow"] = theirs["ours_over_airflow"] = statistics.median(ratios)
        rows.extend(summary.values())
    return rows


def evaluate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The K = 1000 target, judged on ours' median rate."""
    ours = next((r for r in rows if r["impl"] == "ours" and r["subscribers"] == 1000), None)
    if ours is None:
        status, value = "not measured", None
    elif not ours.get("ok"):
        status, value = "incomplete", None
    else:
        value = round(float(ours["events_per_s"]))
        status = "met" if value >= TARGET_EVENTS_PER_S_K1000 else "not met"
    return {
        "target": f"ours >= {TARGET_EVENTS_PER_S_K1000:,.0f} raw events/s at K=1000 (ack mode)",
        "threshold": TARGET_EVENTS_PER_S_K1000,
        "value": value,
        "status": status,
    }


def format_table(rows: list[dict[str, Any]], target: dict[str, Any]) -> str:
    """Ours and Airflow side by side, one line per K."""
    by = {(r["impl"], r["subscribers"]): r for r in rows}
    ks = sorted({int(r["subscribers"]) for r in rows})
    header = (
        f"{'K':>5} | {'raw events/s ours':>17}{'airflow':>10}{'ratio':>8} | "
        f"{'us/event ours':>13}{'airflow':>9} | {'RSS+ MB ours':>12}{'airflow':>8}"
    )
    lines = [header, "-" * len(header)]

    def num(row: dict[str, Any] | None, field: str, spec: str) -> str:
        if row is None or not row.get("ok") or row.get(field) is None:
            return "-" if row is None or row.get("ok") else "FAILED"
        return format(float(row[field]), spec)

    for k in ks:
        ours, theirs = by.get(("ours", k)), by.get(("airflow", k))
        ratio = (ours or {}).get("ours_over_airflow")
        lines.append(
            f"{k:>5} | {num(ours, 'events_per_s', ',.0f'):>17}"
            f"{num(theirs, 'events_per_s', ',.0f'):>10}"
            f"{(f'{ratio:.0f}x' if ratio else '-'):>8} | "
            f"{num(ours, 'us_per_event', '.2f'):>13}{num(theirs, 'us_per_event', '.1f'):>9} | "
            f"{num(ours, 'rss_growth_mb', '.1f'):>12}{num(theirs, 'rss_growth_mb', '.1f'):>8}"
        )
    lines.append("")
    lines.append("ratio = ours / Airflow raw events per second, median of same-round pairs.")
    lines.append(
        f"Target (reported, not asserted): {target['target']}: "
        f"{target['status'].upper()} ({target['value']})"
    )
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """One row per implementation and K."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})


def write_plot(path: Path, rows: list[dict[str, Any]]) -> bool:
    """Raw events/s and memory growth against K; ``False`` when nothing ran cleanly."""
    import matplotlib  # noqa: PLC0415 - heavy, and only needed at the very end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    good = [r for r in rows if r.get("ok")]
    if not good:
        return False
    ks = sorted({int(r["subscribers"]) for r in good})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    names = {
        "ours": ("sharedstream (keyed prefilter)", "tab:blue"),
        "airflow": ("Airflow 3.3 (every filter sees every event)", "tab:orange"),
    }
    for impl, (label, color) in names.items():
        series = sorted((r for r in good if r["impl"] == impl), key=lambda r: r["subscribers"])
        if not series:
            continue
        xs = [r["subscribers"] for r in series]
        axes[0].plot(xs, [r["events_per_s"] for r in series], "o-", color=color, label=label)
        axes[1].plot(
            xs, [max(r["rss_growth_mb"], 0.01) for r in series], "o-", color=color, label=label
        )
    axes[0].axhline(
        TARGET_EVENTS_PER_S_K1000,
        color="gray",
        linestyle=":",
        linewidth=1,
        label="target at K=1000, ours",
    )
    axes[0].set_title("raw events per second (higher is better)")
    axes[0].set_ylabel("raw events/s (log scale)")
    axes[1].set_title("peak RSS growth during the run")
    axes[1].set_ylabel("MB (log scale)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.tick_params(axis="x", which="minor", bottom=False)
        ax.set_xlabel("watchers K on one stream, each wanting 1/K of the events")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Selective fan-out, ack mode: one trigger event per raw event")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: K=10,100, 20,000 events, 1 round; writes selective-quick.*",
    )
    parser.add_argument(
        "--ks", type=_int_list, default=None, help="watcher counts K (default 10,100,1000)"
    )
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help=f"raw events per run for ours (default {DEFAULT_EVENTS:,})",
    )
    parser.add_argument(
        "--airflow-events",
        type=int,
        default=None,
        help=f"raw events per Airflow run (default {AIRFLOW_PAIRS:,}/K, "
        f"at least {AIRFLOW_MIN_EVENTS:,})",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds; medians are published (default 3)"
    )
    add_runner_options(parser)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    if args.quick:
        args.ks = args.ks or [10, 100]
        args.events = args.events or 20_000
        args.repeat = 1
    args.ks = args.ks or list(DEFAULT_KS)
    args.events = args.events or DEFAULT_EVENTS
    if args.repeat < 1 or args.events < max(args.ks):
        parser.error("--repeat must be >= 1 and --events at least the largest K")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, write the result files and print the table."""
    args = parse_args(argv)
    stem = "selective-quick" if args.quick else "selective"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="selective-bench-") as scratch:
        runners, interpreters = prepare_runners(args, Path(scratch))
        rows = measure(runners, args.ks, args)
    target = evaluate(rows)
    report = {
        "benchmark": "selective",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "settings": {
            "ks": args.ks,
            "events_ours": args.events,
            "repeat": args.repeat,
            "events_airflow": {str(k): airflow_events(k, args.airflow_events) for k in args.ks},
            "mode": "ack",
            "workload": "trigger i of K wants raw % K == i",
        },
        "machine": machine,
        "interpreters": interpreters,
        "target": target,
        "results": rows,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    json_path = args.output_dir / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    write_csv(args.output_dir / f"{stem}.csv", rows)
    written = [json_path.name, f"{stem}.csv"]
    if not args.no_plot and write_plot(args.output_dir / f"{stem}.png", rows):
        written.append(f"{stem}.png")
    progress(f"wrote {', '.join(written)} to {args.output_dir} in {report['elapsed_s']} s")
    print(format_table(rows, target))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
