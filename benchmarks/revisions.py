"""Two commits, one end-to-end benchmark, alternating rounds: did a change cost anything?

Exports both commits with ``git archive`` (so the working tree may be edited
meanwhile) and runs one end-to-end benchmark script (``kafka_e2e.py`` or
``sqs_e2e.py``, with the arguments given after ``--``) from each exported
tree, ``BASE`` then ``NEW``, ``--rounds`` times: each round measures both on
the same machine state, so the same-round ratio ``NEW / BASE`` of each case
carries less of the shared machine's noise than either figure. Cases that run
none of the project's code (``raw``, ``independent K``) show what that noise
is. Prints, per case, the medians of msgs/s and of steady msgs/s and the
median and range of the same-round ratios; writes
``benchmarks/results/revisions-<script>.{json,csv,png}``.

Usage: ``python benchmarks/revisions.py BASE NEW --script kafka_e2e.py
[--rounds 4] [--output-dir D] -- --ks 1,10 --brokers tansu``
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _revisions import export_revision

RESULTS = Path(__file__).resolve().parent / "results"
SCRIPTS = ("kafka_e2e.py", "sqs_e2e.py", "pubsub_e2e.py")


def run_once(tree: Path, script: str, args: Sequence[str], out: Path) -> list[dict[str, Any]]:
    """Run ``script`` from ``tree`` (its own code first on the path); the result rows."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(tree / "benchmarks" / script), *args, "--output-dir", str(out)]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script} at {tree.name} failed ({done.returncode}): "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    (result,) = out.glob("*.json")
    rows: list[dict[str, Any]] = json.loads(result.read_text())["rows"]
    return rows


def summarize(rounds: list[dict[str, dict[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per case: medians per side and the same-round ratios NEW / BASE."""
    cases = sorted({case for r in rounds for case in r["base"]} & {c for r in rounds
                                                                   for c in r["new"]})
    summary = []
    for case in cases:
        pairs = [(r["base"][case], r["new"][case]) for r in rounds
                 if case in r["base"] and case in r["new"]]
        ratios = [n["msgs_per_s"] / b["msgs_per_s"] for b, n in pairs if b["msgs_per_s"]]
        steady = [n["steady_msgs_per_s"] / b["steady_msgs_per_s"] for b, n in pairs
                  if b.get("steady_msgs_per_s") and n.get("steady_msgs_per_s")]
        summary.append({
            "case": case, "rounds": len(pairs),
            "base_msgs_per_s": statistics.median(b["msgs_per_s"] for b, _ in pairs),
            "new_msgs_per_s": statistics.median(n["msgs_per_s"] for _, n in pairs),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "steady_ratio_median": statistics.median(steady) if steady else None,
        })
    return summary


def plot(summary: list[dict[str, Any]], title: str, path: Path) -> None:
    """Same-round ratios per case: the median as a bar, the range as a line."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [row["case"] for row in summary]
    medians = [row["ratio_median"] for row in summary]
    low = [row["ratio_median"] - row["ratio_min"] for row in summary]
    high = [row["ratio_max"] - row["ratio_median"] for row in summary]
    ax.bar(names, medians, yerr=[low, high], capsize=4, color="#4c72b0")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("msgs/s, new / base (same round)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds, print the table, write JSON, CSV and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the commit to compare against (e.g. main~5)")
    parser.add_argument("new", help="the commit to measure (e.g. HEAD)")
    parser.add_argument("--script", choices=SCRIPTS, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.script_args = argv[split + 1:]  # after --: the script's own arguments
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="sharedstream-revisions-") as tmp:
        work = Path(tmp)
        trees = {}
        for side in ("base", "new"):
            trees[side] = work / side
            sha = export_revision(getattr(args, side), trees[side])
            print(f"{side}: {getattr(args, side)} = {sha[:12]}", file=sys.stderr)
        rounds = []
        for index in range(args.rounds):
            measured = {}
            for side in ("base", "new"):
                out = work / f"{side}-{index}"
                rows = run_once(trees[side], args.script, args.script_args, out)
                measured[side] = {row["case"]: row for row in rows}
                print(f"round {index + 1}/{args.rounds} {side}: " + ", ".join(
                    f"{row['case']} {row['msgs_per_s']:,.0f}" for row in rows), file=sys.stderr)
            rounds.append(measured)
    summary = summarize(rounds)
    print(f"\n{args.script}: {args.new} / {args.base}, {args.rounds} rounds")
    print("| case | base msgs/s | new msgs/s | same-round ratio (range) | steady ratio |")
    print("|---|--:|--:|--:|--:|")
    for row in summary:
        steady = row["steady_ratio_median"]
        print(f"| {row['case']} | {row['base_msgs_per_s']:,.0f} | {row['new_msgs_per_s']:,.0f} "
              f"| {row['ratio_median']:.3f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) "
              f"| {'-' if steady is None else f'{steady:.3f}'} |")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"revisions-{Path(args.script).stem}"
    stem.with_suffix(".json").write_text(json.dumps(
        {"base": args.base, "new": args.new, "script": args.script,
         "script_args": args.script_args, "summary": summary, "rounds": rounds}, indent=1))
    with stem.with_suffix(".csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    plot(summary, f"{args.script}: {args.new} / {args.base}", stem.with_suffix(".png"))
    print(f"wrote {stem}.json, .csv, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
