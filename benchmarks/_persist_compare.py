"""``persist.py --ours-rev REV``: the persistence gate at a git revision and in the working tree.

Both sides run the same harness (this checkout's :func:`persist.run_policy`,
in a child process per measurement); only the ``sharedstream`` package
differs: ``REV``'s, exported with :func:`_revisions.export_revision` and put
first on the child's ``PYTHONPATH``, or the working tree's (the editable
install). A round measures every case on both sides back to back, and the
side that goes first alternates from round to round, so load from the rest
of the machine falls on both alike. Reported per case and side: the median
events/s and confirm latency percentiles over the rounds, and the median of
each round's own working-tree / ``REV`` ratio (the figure to quote on a
shared machine). A child that stores fewer events or runs than it put ends
the comparison with an error.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _revisions import export_revision, working_tree_revision

SCRIPT = Path(__file__).resolve().parent / "persist.py"

CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    # (label, run_policy keyword arguments but ``events``; None: the --events count)
    ("group commit, as fast as possible", {
        "name": "group", "events": None, "batch_max": 2000, "linger": 0.002, "rate": None}),
    ("group commit, busy loop, 0.5 ms switch interval", {
        "name": "group, busy loop", "events": 5_000, "batch_max": 2000, "linger": 0.002,
        "rate": None, "busy": True, "switch_interval": 0.0005}),
    ("group commit, 300 events/s offered", {
        "name": "group", "events": 1_500, "batch_max": 2000, "linger": 0.002, "rate": 300.0}),
)

METRICS = ("events_per_s", "confirm_ms_p50", "confirm_ms_p95", "confirm_ms_p99")


def _run_child(case: dict[str, Any], pythonpath: Path | None) -> dict[str, Any]:
    """One measurement in a fresh interpreter; its row (``sharedstream``: the package it ran)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--child", json.dumps(case)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"persist.py child failed ({proc.returncode}): {proc.stderr.strip()}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def compare(rev: str, *, rounds: int, events: int, out: Path, stem: str) -> int:
    """Measure every case at ``rev`` and in the working tree; write the results; exit status."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="persist-rev-") as tmp:
        src = Path(tmp) / "src"
        sha = export_revision(rev, src, paths=("sharedstream",))
        sides = {"base": src, "ours": None}
        labels = {"base": f"{sha[:12]} ({rev})", "ours": f"working tree {working_tree_revision()}"}
        for round_no in range(rounds):
            order = ["base", "ours"] if round_no % 2 == 0 else ["ours", "base"]
            for label, template in CASES:
                case = dict(template, events=template["events"] or events)
                for side in order:
                    row = _run_child(case, sides[side])
                    row.update(side=side, round=round_no, case=label)
                    print(f"round {round_no} {side:>4} {label}: {row['events_per_s']:>9,.0f}"
                          f" events/s, confirm p50/p95/p99 {row['confirm_ms_p50']:.1f} /"
                          f" {row['confirm_ms_p95']:.1f} / {row['confirm_ms_p99']:.1f} ms",
                          file=sys.stderr)
                    if row["stored"] != case["events"] or row["dag_runs"] != case["events"]:
                        print(f"error: {side} {label} stored {row['stored']} events and"
                              f" {row['dag_runs']} runs of {case['events']}", file=sys.stderr)
                        return 1
                    runs.append(row)
    summary = _summarize(runs, rounds)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{stem}-{rev.replace('/', '_')}"
    result = {"python": sys.version.split()[0], "machine": platform.machine(),
              "load_average_at_end": list(os.getloadavg()), "base_revision": sha,
              "sides": labels, "rounds": rounds, "summary": summary, "runs": runs}
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    with (out / f"{name}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    _plot(summary, labels, out / f"{name}.png")
    for row in summary:
        print(f"{row['case']}: {row['base_events_per_s']:,.0f} -> {row['ours_events_per_s']:,.0f}"
              f" events/s, same-round ratio {row['ratio_events_per_s']:.2f}x"
              f" ({', '.join(f'{r:.2f}' for r in row['round_ratios_events_per_s'])});"
              f" confirm p50/p95/p99 {row['base_confirm_ms_p50']:.1f}/"
              f"{row['base_confirm_ms_p95']:.1f}/{row['base_confirm_ms_p99']:.1f} ->"
              f" {row['ours_confirm_ms_p50']:.1f}/{row['ours_confirm_ms_p95']:.1f}/"
              f"{row['ours_confirm_ms_p99']:.1f} ms", file=sys.stderr)
    print(f"results in {out}/{name}.*", file=sys.stderr)
    return 0


def _summarize(runs: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """Per case: medians per side and the median same-round ours / base ratio."""
    summary = []
    for label, _ in CASES:
        row: dict[str, Any] = {"case": label}
        by = {(r["side"], r["round"]): r for r in runs if r["case"] == label}
        for side in ("base", "ours"):
            for metric in METRICS:
                row[f"{side}_{metric}"] = statistics.median(
                    by[side, n][metric] for n in range(rounds))
        for metric in METRICS:
            ratios = [by["ours", n][metric] / by["base", n][metric] for n in range(rounds)]
            row[f"round_ratios_{metric}"] = ratios
            row[f"ratio_{metric}"] = statistics.median(ratios)
        summary.append(row)
    return summary


def _plot(summary: list[dict[str, Any]], labels: dict[str, str], path: Path) -> None:
    """Events/s and confirm p50/p99 per case, both sides."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = range(len(summary))
    names = [row["case"].replace(", ", "\n") for row in summary]
    for i, side in enumerate(("base", "ours")):
        left.bar([x + i * 0.4 for x in xs], [row[f"{side}_events_per_s"] for row in summary],
                 0.4, label=labels[side])
        for j, pct in enumerate(("p50", "p99")):
            right.bar([x + (2 * i + j) * 0.2 for x in xs],
                      [row[f"{side}_confirm_ms_{pct}"] for row in summary], 0.2,
                      label=f"{pct} {labels[side]}")
    left.set_xticks([x + 0.2 for x in xs], names, fontsize=8)
    left.set_ylabel("events stored per second (median)")
    left.set_title("throughput (event + asset event + DAG run)")
    left.legend(fontsize=7)
    right.set_xticks([x + 0.3 for x in xs], names, fontsize=8)
    right.set_yscale("log")
    right.set_ylabel("put -> confirm (ms, median of rounds)")
    right.set_title("confirmation latency")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
