"""An end-to-end benchmark run in rounds: its arguments, the rounds, medians, ratios, files.

Used by the benchmarks whose cases are counted the same way (``pubsub_e2e.py``,
``servicebus_e2e.py``), on one backend or several (:func:`run_backends`):
every case runs once per round (``--repeat R`` rounds, round-robin, so
noise that hits a round hits every case of it), a case's reported run is
its median by msgs/s, and each target ratio is the median of the rounds'
own ratios (the two cases of a round ran minutes apart
at most). A verdict is MET / NOT MET, printed and written, never asserted;
a run with wrong event counts or messages left behind makes the exit
status 1. Writes ``<stem>.json`` (every run, the medians, the verdicts),
``<stem>.csv`` (the medians) and ``<stem>.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _e2e import say

Targets = Mapping[str, float | None]
"""``"top case / bottom case"`` -> the least ratio wanted; ``None``: reported, no target."""


@dataclass
class CaseResult:
    """One run of one case: N messages from published to acknowledged."""

    case: str
    k: int
    messages: int
    round: int
    seconds: float
    first_ack_s: float | None
    events: int
    expected_events: int
    leftover: int
    """Messages the broker still held once the consumers stopped (must be 0)."""
    bench_cpu_s: float
    server_cpu_s: float | None

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else math.nan

    @property
    def wrong(self) -> bool:
        """Events stored other than expected, or messages left behind: the run failed."""
        return self.events != self.expected_events or self.leftover != 0

    def row(self) -> dict[str, Any]:
        return {"case": self.case, "k": self.k, "round": self.round, "messages": self.messages,
                "msgs_per_s": round(self.per_s, 1), "seconds": round(self.seconds, 3),
                "first_ack_s": None if self.first_ack_s is None else round(self.first_ack_s, 3),
                "events_stored": self.events, "events_expected": self.expected_events,
                "left_after": self.leftover, "bench_cpu_s": round(self.bench_cpu_s, 2),
                "server_cpu_s": None if self.server_cpu_s is None
                else round(self.server_cpu_s, 2)}


def median_runs(runs: list[CaseResult]) -> list[CaseResult]:
    """Per case, the run with the median msgs/s (the lower middle one for an even count)."""
    grouped: dict[str, list[CaseResult]] = {}
    for run in runs:
        grouped.setdefault(run.case, []).append(run)
    return [sorted(group, key=lambda r: r.per_s)[(len(group) - 1) // 2]
            for group in grouped.values()]


def round_ratios(runs: list[CaseResult], targets: Targets) -> dict[str, list[float]]:
    """Each target's ratio, round by round."""
    by = {(r.round, r.case): r for r in runs}
    out: dict[str, list[float]] = {}
    for name in targets:
        top, bottom = name.split(" / ")
        for round_ in sorted({r.round for r in runs}):
            a, b = by.get((round_, top)), by.get((round_, bottom))
            if a is not None and b is not None:
                out.setdefault(name, []).append(round(a.per_s / b.per_s, 3))
    return out


def verdicts(runs: list[CaseResult], targets: Targets) -> dict[str, dict[str, Any]]:
    """Per target: the rounds' ratios, their median and MET / NOT MET (``-``: no target)."""
    out = {}
    for name, values in round_ratios(runs, targets).items():
        target, median = targets[name], round(statistics.median(values), 3)
        out[name] = {"target": "none" if target is None else f">= {target}", "rounds": values,
                     "median": median,
                     "verdict": "-" if target is None else "MET" if median >= target
                     else "NOT MET"}
    return out


@dataclass(frozen=True)
class Chart:
    """What the bar chart of the medians says: its words and its reference line."""

    title: str
    ylabel: str
    baselines: tuple[str, ...]
    """Cases drawn grey (the SDK's own loops); shared cases are blue, the others orange."""
    reference: tuple[str, float, str] | None = None
    """``(case, fraction, label)``: a dotted line at that fraction of the case's msgs/s."""


def plot(rows: list[dict[str, Any]], path: Path, chart: Chart) -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4))
    xs = list(range(len(rows)))
    bars = ax.bar(xs, [r["msgs_per_s"] or 0 for r in rows], 0.6,
                  color=["C7" if r["case"] in chart.baselines
                         else "C0" if r["case"].startswith("shared") else "C1" for r in rows])
    ax.bar_label(bars, fmt="{:,.0f}", fontsize="small")
    if chart.reference is not None:
        case, fraction, label = chart.reference
        base = next((r for r in rows if r["case"] == case), None)
        if base is not None:
            ax.axhline(base["msgs_per_s"] * fraction, color="grey", linestyle=":",
                       linewidth=1, label=label)
            ax.legend(fontsize="small")
    ax.set_xticks(xs, [r["case"] for r in rows])
    ax.set_ylabel(chart.ylabel)
    ax.set_title(chart.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(out: Path, stem: str, runs: list[CaseResult], *, targets: Targets,
                  chart: Chart, about: Mapping[str, Any]) -> None:
    """``<stem>.json``, ``.csv`` and ``.png`` in ``out``; ``about`` goes into the JSON as is."""
    rows = [r.row() for r in median_runs(runs)]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(),
        "cpus": os.cpu_count(), **about,
        "rows": rows, "runs": [r.row() for r in runs], "targets": verdicts(runs, targets)},
        indent=2) + "\n")
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png", chart)


def print_table(runs: list[CaseResult], targets: Targets) -> None:
    """The medians as a Markdown table, then each ratio with its rounds and verdict."""
    print("| case | msgs/s | wall s | first ack s | events stored | CPU s (bench / server) |")
    print("|---|--:|--:|--:|--:|--:|")
    for r in median_runs(runs):
        server = "-" if r.server_cpu_s is None else f"{r.server_cpu_s:.1f}"
        print(f"| {r.case} | {r.per_s:,.0f} | {r.seconds:.2f} | {r.first_ack_s or 0:.2f} | "
              f"{r.events:,} / {r.expected_events:,} | {r.bench_cpu_s:.1f} / {server} |")
    for name, verdict in verdicts(runs, targets).items():
        print(f"{name}: {verdict['median']:.2f} (rounds: "
              f"{', '.join(f'{v:.2f}' for v in verdict['rounds'])}; target "
              f"{verdict['target']}) -> {verdict['verdict']}")


def parse_args(argv: Sequence[str] | None, description: str, *, quick_messages: int,
               timeout: float = 300.0,
               more: Callable[[argparse.ArgumentParser], None] | None = None,
               ) -> argparse.Namespace:
    """``--messages``, ``--quick`` (``quick_messages``), ``--ks``, ``--repeat``, ``--timeout``,
    ``--output-dir``, and whatever ``more`` adds to the parser."""
    parser = argparse.ArgumentParser(description=description)
    if more is not None:
        more(parser)
    parser.add_argument("--messages", type=int, default=20_000, help="per case (default 20,000)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick_messages:,} messages; writes <name>-quick.*")
    parser.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10],
                        help="watcher counts, comma-separated (default 1,10)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per case, round-robin; the median run is reported")
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per case")
    parser.add_argument("--output-dir", type=Path,
                        default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = quick_messages
    return args


async def run_rounds(cases: Sequence[tuple[str, int]], repeat: int,
                     run_case: Callable[[str, int, int, int], Awaitable[CaseResult]],
                     ) -> list[CaseResult]:
    """Every case ``repeat`` times, round-robin: ``run_case(kind, k, round, n)``, n its index."""
    runs = []
    for round_ in range(repeat):
        for n, (kind, k) in enumerate(cases):
            runs.append(await run_case(kind, k, round_, n))
    return runs


def report(args: argparse.Namespace, name: str, runs: list[CaseResult], *, targets: Targets,
           chart: Chart, about: Mapping[str, Any]) -> int:
    """Write the files (``name``, or ``name-quick``), print the table; the exit status."""
    write_results(args.output_dir, f"{name}-quick" if args.quick else name, runs,
                  targets=targets, chart=chart,
                  about={"messages": args.messages, "ks": args.ks, "repeat": args.repeat,
                         **about})
    print_table(runs, targets)
    bad = [f"{r.case} #{r.round}" for r in runs if r.wrong]
    if bad:
        say(f"error: wrong event counts or messages left in {', '.join(bad)}")
        return 1
    return 0


RunBackend = Callable[[argparse.Namespace, str, Path], list[CaseResult]]
"""Every case on one backend, ``--repeat`` rounds: ``run(args, backend, workdir)``."""

ReportBackend = Callable[[str, list[CaseResult], Mapping[str, list[float]]], int]
"""Report one backend's runs: ``report(backend, runs, load_average)``; an exit status."""


def run_backends(args: argparse.Namespace, chosen: list[str] | str, *, prefix: str,
                 run: RunBackend, report_backend: ReportBackend) -> int:
    """Run and report each backend of ``chosen`` in a temporary folder of its own.

    ``chosen`` is :func:`_e2e.chosen_backends`' answer: a string (the backend
    asked for cannot run) is printed as an error and gives exit status 2.
    Otherwise the exit status is that of every report together (1 if any
    run stored a wrong count or left messages behind). The load average at
    the start and the end of each backend goes to its report.
    """
    if isinstance(chosen, str):
        print(f"error: {chosen}", file=sys.stderr)
        return 2
    status = 0
    for backend in chosen:
        workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-{backend}-"))
        load = {"start": list(os.getloadavg())}
        try:
            runs = run(args, backend, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        load["end"] = list(os.getloadavg())
        status |= report_backend(backend, runs, load)
    return status
