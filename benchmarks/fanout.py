"""Fan-out benchmark: sharedstream against Apache Airflow 3.3's ``SharedStreamManager``.

Run it with the project's interpreter::

    .venv/bin/python benchmarks/fanout.py            # full run (about 4 minutes)
    .venv/bin/python benchmarks/fanout.py --quick    # smoke run (under a minute)

One in-memory source of N raw events feeds K triggers that share one
stream key, on the fast path and in ack mode, with a filter that emits a
trigger event for 1 in 10 raw events and one for every raw event. Each
configuration runs in a fresh interpreter (``_fanout_workload.py``): ours with
this interpreter, Airflow's with a separate virtualenv built from the same
base interpreter (created on demand, see ``--airflow-python``).

Writes ``fanout.json``, ``fanout.csv`` and ``fanout.png`` under
``benchmarks/results/`` (``fanout-quick.*`` with ``--quick``,
``fanout-plain-events.*`` with ``--trigger-event plain``) and prints a table
with the Airflow/ours ratio of every configuration.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _revisions import export_revision, working_tree_revision

from sharedstream.runtime.config import TriggererConfig

BENCH_DIR = Path(__file__).resolve().parent
WORKLOAD = BENCH_DIR / "_fanout_workload.py"
RESULTS_DIR = BENCH_DIR / "results"
AIRFLOW_VENV = RESULTS_DIR / ".airflow-venv"
AIRFLOW_REQUIREMENT = "apache-airflow-core==3.3.2"

IMPLS = ("ours", "airflow")
MODES = ("fast", "ack")

TARGET_ACK_US_PER_PAIR = 0.8
"""Ours, ack mode, K >= 10: at most this many microseconds per (event, subscriber) pair."""

TARGET_ACK_SPEEDUP_K100 = 3.5
"""Ours, ack mode, K = 100, 1-in-10 emit: at least this many times faster than Airflow."""

TARGET_RSS_MB_K1000 = 10.0
"""Ours, K = 1000: peak RSS growth below this many MB."""

PRIMARY_EMIT = 10
"""The headline workload's filter emits a trigger event for 1 in this many raw events."""

CHILD_TIMEOUT = 900.0
"""Seconds one child may run (including imports) before it is killed."""

GC_GEN0 = TriggererConfig.gc_gen0_threshold
"""The collector's young-generation threshold of every child: a triggerer's (see
``sharedstream.runtime.collector``), the same for Airflow's engine."""


@dataclass(frozen=True)
class Sizing:
    """How many raw events a configuration with K subscribers gets."""

    target_pairs: int
    min_events: int
    max_events: int
    fixed_events: int | None = None

    def events_for(self, subscribers: int) -> int:
        """``target_pairs / K`` clamped to ``[min_events, max_events]``, unless fixed."""
        if self.fixed_events is not None:
            return self.fixed_events
        return max(self.min_events, min(self.max_events, self.target_pairs // subscribers))


@dataclass(frozen=True)
class Case:
    """One configuration, run once per implementation."""

    mode: str
    emit_every: int
    subscribers: int
    events: int
    batch: int
    trigger_event: str = "native"

    @property
    def label(self) -> str:
        """Short human-readable name."""
        return f"{self.mode:<4} emit 1/{self.emit_every:<2} K={self.subscribers:<4} N={self.events}"


# -- progress / table output (the only places that write to the terminal) ---------


def progress(message: str) -> None:
    """One progress line on stderr."""
    print(message, file=sys.stderr, flush=True)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _num(row: dict[str, Any] | None, field: str) -> float | None:
    if row is None or row.get(field) is None:
        return None
    return float(row[field])


def _latency(row: dict[str, Any] | None) -> str:
    """``p50/p99`` fan-out-to-advance latency in ms, or ``-`` (fast path, failed run)."""
    latency = (row or {}).get("latency_us")
    if not latency:
        return "-"
    return f"{latency['p50'] / 1000:.1f}/{latency['p99'] / 1000:.1f}"


def format_table(results: list[dict[str, Any]], targets: dict[str, Any]) -> str:
    """The results side by side (ours vs Airflow, one line per configuration) and the targets."""
    by_key = {(r["impl"], r["mode"], r["emit_every"], r["subscribers"]): r for r in results}
    cases = sorted(
        {(r["mode"], r["emit_every"], r["subscribers"], r["events"]) for r in results},
        key=lambda c: (-c[1], c[0] != "ack", c[2]),
    )
    header = (
        f"{'emit':<5}{'mode':<5}{'K':>5}{'N':>8} | {'us/pair ours':>12}{'airflow':>9}"
        f"{'ratio':>7} | {'events/s ours':>13}{'airflow':>10} | {'RSS+ MB ours':>12}"
        f"{'airflow':>8} | {'p50/p99 ms ours':>16}{'airflow':>16}"
    )
    lines = [header, "-" * len(header)]
    for mode, emit, k, n in cases:
        ours = by_key.get(("ours", mode, emit, k))
        af = by_key.get(("airflow", mode, emit, k))
        ours_us, af_us = _num(ours, "us_per_pair"), _num(af, "us_per_pair")
        ratio = f"{af_us / ours_us:.1f}x" if ours_us and af_us else "-"
        ours_mark = "" if ours is None or ours.get("ok") else "!"
        af_mark = "" if af is None or af.get("ok") else "!"
        lines.append(
            f"{'1/' + str(emit):<5}{mode:<5}{k:>5}{n:>8} | "
            f"{_fmt(ours_us, '.3f') + ours_mark:>12}{_fmt(af_us, '.3f') + af_mark:>9}{ratio:>7} | "
            f"{_fmt(_num(ours, 'events_per_s'), ',.0f'):>13}"
            f"{_fmt(_num(af, 'events_per_s'), ',.0f'):>10} | "
            f"{_fmt(_num(ours, 'rss_growth_mb'), '.1f'):>12}"
            f"{_fmt(_num(af, 'rss_growth_mb'), '.1f'):>8} | "
            f"{_latency(ours):>16}{_latency(af):>16}"
        )
    lines.append("")
    lines.append(
        "ratio = Airflow us/pair / ours (higher: ours faster). Targets (reported, not asserted):"
    )
    lines.extend(
        f"  {name}: {target['status'].upper()} - {target['summary']}"
        for name, target in targets.items()
    )
    bad = [r for r in results if not r.get("ok")]
    if bad:
        lines.append("")
        lines.append(f"{len(bad)} run(s) FAILED their checks (marked ! above; not valid timings):")
        lines.extend(
            f"  {r['impl']} {r['mode']} 1/{r['emit_every']} K={r['subscribers']}: "
            f"{r.get('error') or r.get('checks')}"
            for r in bad
        )
    return "\n".join(lines)


def print_table(results: list[dict[str, Any]], targets: dict[str, Any]) -> None:
    """Print :func:`format_table` on stdout."""
    print(format_table(results, targets))


# -- environment ------------------------------------------------------------------


def _run_json(cmd: Sequence[str], *, env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Run ``cmd`` and parse the JSON object on the last line of its stdout, or ``None``."""
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=300, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    try:
        parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


_PROBE = (
    "import json, platform, sys, importlib.metadata as m\n"
    "import airflow.triggers.shared_stream\n"
    "print(json.dumps({'python': platform.python_version(), 'executable': sys.executable,\n"
    "  'base_executable': getattr(sys, '_base_executable', sys.executable),\n"
    "  'airflow_core': m.version('apache-airflow-core')}))\n"
)


def probe_airflow(python: Path, env: dict[str, str]) -> dict[str, Any] | None:
    """Interpreter and Airflow versions of ``python``, or ``None`` if it cannot import Airflow."""
    return _run_json([str(python), "-c", _PROBE], env=env)


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _stream(cmd: Sequence[str]) -> None:
    """Run ``cmd`` with its output going to our stderr; exit with a hint if it fails."""
    progress("$ " + " ".join(cmd))
    try:
        subprocess.run(list(cmd), check=True, stdout=sys.stderr, stderr=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(
            f"setting up the Airflow virtualenv failed ({exc}); fix it and rerun, or pass "
            "--airflow-python PATH (an interpreter with Airflow installed) or --no-airflow"
        ) from exc


def ensure_airflow_python(
    explicit: str | None, venv: Path, requirement: str, env: dict[str, str]
) -> tuple[Path, dict[str, Any]]:
    """Return an interpreter that can import Airflow's shared-stream module, and its probe.

    ``explicit`` (``--airflow-python``) is used as is. Otherwise the
    virtualenv at ``venv`` is reused if it works, or (re)created with the
    base interpreter of the running Python and ``pip install requirement``.
    """
    if explicit is not None:
        python = Path(explicit)
        info = probe_airflow(python, env)
        if info is None:
            raise SystemExit(
                f"--airflow-python {python} cannot import airflow.triggers.shared_stream"
            )
        return python, info
    python = _venv_python(venv)
    if python.exists():
        info = probe_airflow(python, env)
        if info is not None:
            progress(f"reusing Airflow virtualenv {venv} (airflow-core {info['airflow_core']})")
            return python, info
        progress(f"Airflow virtualenv {venv} is incomplete; installing into it again")
    else:
        base = getattr(sys, "_base_executable", sys.executable)
        progress(f"creating Airflow virtualenv {venv} from {base} (takes a few minutes)")
        _stream([base, "-m", "venv", str(venv)])
    _stream([str(python), "-m", "pip", "install", "--disable-pip-version-check", requirement])
    info = probe_airflow(python, env)
    if info is None:
        raise SystemExit(f"{python} still cannot import airflow.triggers.shared_stream")
    progress(f"Airflow virtualenv ready: airflow-core {info['airflow_core']}")
    return python, info


def _read_first(path: str, prefix: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "nproc": len(affinity) if affinity is not None else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _read_first("/proc/cpuinfo", "model name"),
        "memory_total": _read_first("/proc/meminfo", "MemTotal"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def child_env(scratch: Path, pythonpath: Path | None = None) -> dict[str, str]:
    """A child's environment: ``PYTHONPATH`` only if given; Airflow's state under ``scratch``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONHASHSEED"] = "0"
    env["AIRFLOW_HOME"] = str(scratch / "airflow-home")
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    return env


@dataclass(frozen=True)
class Runner:
    """How to start the child of one implementation."""

    impl: str
    python: str
    env: dict[str, str]


# -- running ---------------------------------------------------------------------


def run_child(runner: Runner, case: Case) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter and return its measurements."""
    args = [
        "--mode", case.mode,
        "--subscribers", str(case.subscribers),
        "--events", str(case.events),
        "--emit-every", str(case.emit_every),
        "--batch", str(case.batch),
        "--trigger-event", case.trigger_event,
    ]  # fmt: skip
    base: dict[str, Any] = {
        "impl": runner.impl, "mode": case.mode, "emit_every": case.emit_every,
        "subscribers": case.subscribers, "events": case.events, "batch": case.batch,
        "pairs": case.events * case.subscribers,
    }  # fmt: skip
    return run_workload(runner, args, base)


def run_workload(runner: Runner, args: Sequence[str], base: dict[str, Any]) -> dict[str, Any]:
    """``_fanout_workload.py --impl <runner's> *args`` in a fresh interpreter; its JSON result.

    A child that times out or prints no result gives ``base`` with ``ok``
    false and the reason in ``error``.
    """
    cmd = [runner.python, str(WORKLOAD), "--impl", runner.impl, *args, "--gc-gen0", str(GC_GEN0)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=runner.env, check=False
        )
    except subprocess.TimeoutExpired:
        return {**base, "ok": False, "error": f"child timed out after {CHILD_TIMEOUT}s"}
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if not result:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        return {**base, "ok": False, "error": f"child exited {proc.returncode}: {tail}"}
    return result


def run_case(case: Case, runners: Sequence[Runner], repeat: int) -> list[dict[str, Any]]:
    """Run ``case`` for every implementation, ``repeat`` times each, interleaved.

    With ``repeat > 1`` the run with the median per-pair cost is kept and
    every repetition's per-pair cost is listed in ``repeats_us_per_pair``.
    """
    runs: dict[str, list[dict[str, Any]]] = {runner.impl: [] for runner in runners}
    for _ in range(repeat):
        for runner in runners:
            runs[runner.impl].append(run_child(runner, case))
    kept = []
    for attempts in runs.values():
        good = [r for r in attempts if r.get("ok")]
        if not good:
            kept.append(attempts[-1])
            continue
        good.sort(key=lambda r: float(r["us_per_pair"]))
        chosen = dict(good[(len(good) - 1) // 2])
        chosen["repeats_us_per_pair"] = [r.get("us_per_pair") for r in attempts]
        kept.append(chosen)
    return kept


def report_progress(done: int, total: int, case: Case, result: dict[str, Any]) -> None:
    """One stderr line per finished run."""
    head = f"[{done:>2}/{total}] {result['impl']:<7} {case.label}:"
    if not result.get("ok"):
        progress(f"{head} FAILED {result.get('error') or result.get('checks')}")
        return
    latency = result.get("latency_us") or {}
    extra = f", fan-out->advance p50 {latency['p50'] / 1000:.1f} ms" if latency else ""
    progress(
        f"{head} {result['us_per_pair']:.3f} us/pair, {result['wall_s']:.2f} s, "
        f"RSS +{result['rss_growth_mb']:.1f} MB{extra}"
    )


def prepare_runners(args: argparse.Namespace, scratch: Path) -> tuple[list[Runner], dict[str, Any]]:
    """The runner of each implementation, and what each one is (interpreter, source)."""
    ours_info: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "base_executable": getattr(sys, "_base_executable", sys.executable),
        "implementation": platform.python_implementation(),
    }
    pythonpath = None
    if args.ours_rev is not None:
        pythonpath = scratch / "ours-src"
        sha = export_revision(args.ours_rev, pythonpath, paths=("sharedstream",))
        ours_info["source"] = f"git archive {sha[:12]} (--ours-rev {args.ours_rev})"
        ours_info["git_revision"] = sha[:12]
        progress(f"benchmarking sharedstream as committed at {sha[:12]} ({args.ours_rev})")
    else:
        ours_info["source"] = "installed package (working tree)"
        ours_info["git_revision"] = working_tree_revision()
    runners = [Runner("ours", sys.executable, child_env(scratch, pythonpath))]
    interpreters = {"ours": ours_info}
    if not args.no_airflow:
        env = child_env(scratch)
        airflow_python, info = ensure_airflow_python(
            args.airflow_python, args.airflow_venv, args.airflow_requirement, env
        )
        runners.append(Runner("airflow", str(airflow_python), env))
        interpreters["airflow"] = info
        if info.get("python") != platform.python_version():
            progress(
                f"WARNING: Airflow runs on Python {info.get('python')}, ours on "
                f"{platform.python_version()}: the comparison is not like for like"
            )
    return runners, interpreters


# -- analysis --------------------------------------------------------------------


def add_ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Annotate every result with Airflow's per-pair cost over ours for its configuration."""
    ours = {
        (r["mode"], r["emit_every"], r["subscribers"]): r
        for r in results
        if r["impl"] == "ours" and r.get("ok")
    }
    airflow = {
        (r["mode"], r["emit_every"], r["subscribers"]): r
        for r in results
        if r["impl"] == "airflow" and r.get("ok")
    }
    ratios = []
    for key, mine in ours.items():
        theirs = airflow.get(key)
        if theirs is None:
            continue
        ratio = float(theirs["us_per_pair"]) / float(mine["us_per_pair"])
        mine["airflow_over_ours"] = theirs["airflow_over_ours"] = ratio
        ratios.append({
            "mode": key[0], "emit_every": key[1], "subscribers": key[2],
            "ours_us_per_pair": mine["us_per_pair"], "airflow_us_per_pair": theirs["us_per_pair"],
            "airflow_over_ours": ratio,
            "ours_rss_growth_mb": mine.get("rss_growth_mb"),
            "airflow_rss_growth_mb": theirs.get("rss_growth_mb"),
        })  # fmt: skip
    return ratios


def _status(values: Iterable[bool]) -> str:
    checked = list(values)
    if not checked:
        return "not measured"
    return "met" if all(checked) else "not met"


def _variant(row: dict[str, Any]) -> str:
    """Label suffix naming a non-headline filter variant."""
    return "" if row["emit_every"] == PRIMARY_EMIT else f" emit 1/{row['emit_every']}"


def _target(
    description: str,
    *,
    threshold: float,
    values: dict[str, float],
    passes: Callable[[float], bool],
    unit: str,
    other: dict[str, float],
    failed: list[str],
) -> dict[str, Any]:
    """One target entry: judged on the 1-in-10 workload, other filter variants listed beside.

    A configuration the target depends on whose run failed its checks makes
    the status ``incomplete``: a failed run's timing says nothing.
    """
    status = _status(passes(v) for v in values.values())
    summary = ", ".join(f"{k}: {v}{unit}" for k, v in values.items()) or "no data"
    if failed:
        status = "incomplete"
        summary += f"; FAILED runs: {', '.join(failed)}"
    entry: dict[str, Any] = {
        "target": description,
        "threshold": threshold,
        "judged_on": f"filter emitting 1 in {PRIMARY_EMIT}",
        "status": status,
        "values": values,
        "summary": summary,
        "failed_runs": failed,
    }
    if other:
        entry["other_filter_variants"] = {
            "status": _status(passes(v) for v in other.values()),
            "values": other,
        }
        entry["summary"] += " (other filters, informational: " + ", ".join(
            f"{k}: {v}{unit} {'ok' if passes(v) else 'over'}" for k, v in other.items()
        )
        entry["summary"] += ")"
    return entry


def evaluate_targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare the measurements with the project's performance targets (reported, not asserted).

    Each target is judged on the headline workload (a filter emitting 1 in
    ``PRIMARY_EMIT`` raw events); other filter variants are listed in
    ``other_filter_variants`` with their own status.
    """
    ours = [r for r in results if r["impl"] == "ours"]
    failed: dict[str, list[str]] = {}

    def split(
        rows: Iterable[dict[str, Any]], field: str, label: Callable[[dict[str, Any]], str]
    ) -> tuple[dict[str, float], dict[str, float]]:
        primary: dict[str, float] = {}
        other: dict[str, float] = {}
        for r in rows:
            if not r.get("ok"):
                if r["emit_every"] == PRIMARY_EMIT:
                    failed.setdefault(field, []).append(label(r))
                continue
            bucket = primary if r["emit_every"] == PRIMARY_EMIT else other
            bucket[label(r)] = round(float(r[field]), 3)
        return primary, other

    ack, ack_other = split(
        (r for r in ours if r["mode"] == "ack" and r["subscribers"] >= 10),
        "us_per_pair",
        lambda r: f"K={r['subscribers']}{_variant(r)}",
    )
    ratios, ratios_other = split(
        (
            r
            for r in ours
            if r["mode"] == "ack"
            and r["subscribers"] == 100
            and ("airflow_over_ours" in r or not r.get("ok"))
        ),
        "airflow_over_ours",
        lambda r: f"K=100{_variant(r)}",
    )
    rss, rss_other = split(
        (r for r in ours if r["subscribers"] == 1000),
        "rss_growth_mb",
        lambda r: f"{r['mode']}{_variant(r)}",
    )
    return {
        "ack_us_per_pair_k_ge_10": _target(
            f"ours ack mode <= {TARGET_ACK_US_PER_PAIR} us/pair at K >= 10",
            threshold=TARGET_ACK_US_PER_PAIR,
            values=ack,
            other=ack_other,
            passes=lambda v: v <= TARGET_ACK_US_PER_PAIR,
            unit=" us",
            failed=failed.get("us_per_pair", []),
        ),
        "ack_speedup_vs_airflow_k100": _target(
            f"ours ack mode >= {TARGET_ACK_SPEEDUP_K100}x faster than Airflow's at K=100",
            threshold=TARGET_ACK_SPEEDUP_K100,
            values=ratios,
            other=ratios_other,
            passes=lambda v: v >= TARGET_ACK_SPEEDUP_K100,
            unit="x",
            failed=failed.get("airflow_over_ours", []),
        ),
        "rss_growth_k1000": _target(
            f"ours peak RSS growth < {TARGET_RSS_MB_K1000} MB at K=1000",
            threshold=TARGET_RSS_MB_K1000,
            values=rss,
            other=rss_other,
            passes=lambda v: v < TARGET_RSS_MB_K1000,
            unit=" MB",
            failed=failed.get("rss_growth_mb", []),
        ),
    }


# -- output files ----------------------------------------------------------------

CSV_FIELDS = (
    "impl", "version", "mode", "emit_every", "subscribers", "events", "batch", "pairs",
    "wall_s", "cpu_s", "us_per_pair", "events_per_s", "airflow_over_ours",
    "rss_growth_mb", "rss_before_mb", "rss_peak_mb",
    "latency_p50_us", "latency_p95_us", "latency_p99_us", "ok", "error",
)  # fmt: skip


def write_csv(path: Path, results: list[dict[str, Any]]) -> None:
    """One row per implementation x mode x emit x K."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in results:
            row = dict(r)
            latency = r.get("latency_us") or {}
            for q in ("p50", "p95", "p99"):
                row[f"latency_{q}_us"] = latency.get(q)
            for key, value in row.items():
                if isinstance(value, float):
                    row[key] = round(value, 6)
            writer.writerow(row)


def write_plot(path: Path, results: list[dict[str, Any]]) -> bool:
    """Per-pair cost and memory growth against K; returns ``False`` if there is nothing to plot."""
    import matplotlib  # noqa: PLC0415 - heavy, and only needed at the very end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    good = [r for r in results if r.get("ok")]
    emits = sorted({int(r["emit_every"]) for r in good}, reverse=True)
    if not good:
        return False
    ks = sorted({int(r["subscribers"]) for r in good})
    rss_emit = PRIMARY_EMIT if PRIMARY_EMIT in emits else emits[0]
    panels = [("us_per_pair", e) for e in emits] + [("rss_growth_mb", rss_emit)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    colors = {"ours": "tab:blue", "airflow": "tab:orange"}
    styles = {"ack": "-", "fast": "--"}
    markers = {"ack": "o", "fast": "s"}
    for ax, (metric, emit) in zip(axes[0], panels, strict=True):
        for impl in IMPLS:
            for mode in reversed(MODES):
                rows = sorted(
                    (r for r in good if r["impl"] == impl and r["mode"] == mode
                     and r["emit_every"] == emit),
                    key=lambda r: int(r["subscribers"]),
                )  # fmt: skip
                if not rows:
                    continue
                ax.plot(
                    [r["subscribers"] for r in rows],
                    [max(float(r[metric]), 1e-3) for r in rows],
                    linestyle=styles[mode], marker=markers[mode], color=colors[impl],
                    label=f"{'Airflow 3.3' if impl == 'airflow' else 'sharedstream'} {mode}",
                )  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.tick_params(axis="x", which="minor", bottom=False)
        ax.set_xlabel("subscribers K (all on one shared key)")
        ax.grid(True, which="both", alpha=0.3)
        if metric == "us_per_pair":
            ax.set_title(f"cost per (event, subscriber) pair\nfilter emits 1 in {emit}")
            ax.set_ylabel("µs per pair = wall / (N·K)")
            ax.axhline(
                TARGET_ACK_US_PER_PAIR, color="gray", linestyle=":", linewidth=1,
                label=f"target, ours ack: {TARGET_ACK_US_PER_PAIR} µs",
            )  # fmt: skip
        else:
            ax.set_title(f"peak RSS growth during the run\nfilter emits 1 in {emit}")
            ax.set_ylabel("MB (log scale)")
            ax.axhline(
                TARGET_RSS_MB_K1000, color="gray", linestyle=":", linewidth=1,
                label=f"target at K=1000: {TARGET_RSS_MB_K1000:g} MB",
            )  # fmt: skip
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # each panel's own target line, then the shared series
        more_handles, more_labels = ax.get_legend_handles_labels()
        for handle, label in zip(more_handles, more_labels, strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle("Shared-stream fan-out: sharedstream vs Airflow 3.3 (lower is better)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- CLI -------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of integers >= 1: {text!r}"
        )
    return values


def _mode_list(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or any(v not in MODES for v in values):
        raise argparse.ArgumentTypeError(f"modes are a comma-separated subset of {MODES}: {text!r}")
    return values


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """The options :func:`prepare_runners` reads: which implementations run, and from where.

    ``--no-airflow``, ``--airflow-python``, ``--airflow-venv``,
    ``--airflow-requirement``, ``--output-dir`` and ``--ours-rev``; shared by
    the fan-out benchmarks (``fanout.py``, ``selective.py``).
    """
    parser.add_argument("--no-airflow", action="store_true", help="benchmark sharedstream only")
    parser.add_argument(
        "--airflow-python",
        default=None,
        help="interpreter of an existing environment with Airflow installed",
    )
    parser.add_argument(
        "--airflow-venv",
        type=Path,
        default=AIRFLOW_VENV,
        help="where to create (or reuse) the Airflow virtualenv "
        "(default benchmarks/results/.airflow-venv)",
    )
    parser.add_argument(
        "--airflow-requirement",
        default=AIRFLOW_REQUIREMENT,
        help=f"what to pip install into a new Airflow virtualenv (default {AIRFLOW_REQUIREMENT})",
    )
    parser.add_argument(
        "--output-dir",
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="where the result files are written (default benchmarks/results)",
    )
    parser.add_argument(
        "--ours-rev",
        default=None,
        help="benchmark sharedstream as committed at this git revision (e.g. HEAD) instead of "
        "the installed working tree",
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description="Fan-out benchmark: sharedstream vs Airflow 3.3's SharedStreamManager.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short smoke run (small N); writes fanout-quick.* instead",
    )
    parser.add_argument(
        "--ks", type=_int_list, default=None, help="subscriber counts K (default 1,10,100,1000)"
    )
    parser.add_argument(
        "--modes",
        type=_mode_list,
        default=list(MODES),
        help="comma-separated modes (default fast,ack)",
    )
    parser.add_argument(
        "--emit-every",
        type=_int_list,
        default=None,
        help="filter variants: emit a trigger event for 1 in E raw events (default 10,1; quick 10)",
    )
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help="fixed N raw events for every K (default: sized per K)",
    )
    parser.add_argument(
        "--target-pairs",
        type=int,
        default=None,
        help="N per K is target_pairs / K (default 1,000,000; quick 100,000)",
    )
    parser.add_argument(
        "--min-events", type=int, default=None, help="lower bound of N (default 1000; quick 300)"
    )
    parser.add_argument(
        "--max-events",
        type=int,
        default=None,
        help="upper bound of N (default 100,000; quick 20,000)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=256,
        help="the source suspends (asyncio.sleep(0)) every B raw events (default 256)",
    )
    parser.add_argument(
        "--trigger-event",
        choices=["native", "plain"],
        default="native",
        help="what the filter yields: each implementation's own TriggerEvent (Airflow's is a "
        "pydantic model), or one minimal slotted class for both (isolates the engines); "
        "default native",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per configuration and implementation; the median is kept (default 1)",
    )
    add_runner_options(parser)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--replot",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: redraw the PNG next to a saved result JSON and print its table",
    )
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeat < 1 or (args.events is not None and args.events < 1):
        parser.error("--batch, --repeat and --events must be >= 1")
    return args


def build_cases(args: argparse.Namespace) -> tuple[list[Case], Sizing]:
    """Every configuration to run, in run order, and how N was sized."""
    quick = bool(args.quick)
    sizing = Sizing(
        target_pairs=args.target_pairs or (100_000 if quick else 1_000_000),
        min_events=args.min_events or (300 if quick else 1_000),
        max_events=args.max_events or (20_000 if quick else 100_000),
        fixed_events=args.events,
    )
    ks = args.ks or [1, 10, 100, 1000]
    emits = args.emit_every or ([PRIMARY_EMIT] if quick else [PRIMARY_EMIT, 1])
    cases = [
        Case(mode, emit, k, sizing.events_for(k), args.batch, args.trigger_event)
        for emit in emits
        for mode in args.modes
        for k in ks
    ]
    return cases, sizing


def build_report(
    args: argparse.Namespace,
    *,
    cases: list[Case],
    sizing: Sizing,
    machine: dict[str, Any],
    interpreters: dict[str, Any],
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    """Everything ``fanout.json`` holds."""
    ratios = add_ratios(results)
    return {
        "benchmark": "fanout",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": [Path(sys.executable).name, *sys.argv],
        "quick": bool(args.quick),
        "settings": {
            "batch": args.batch,
            "trigger_event": args.trigger_event,
            "repeat": args.repeat,
            "modes": args.modes,
            "emit_every": sorted({c.emit_every for c in cases}, reverse=True),
            "subscribers": sorted({c.subscribers for c in cases}),
            "events_per_k": {str(c.subscribers): c.events for c in cases},
            "sizing": {
                "target_pairs": sizing.target_pairs,
                "min_events": sizing.min_events,
                "max_events": sizing.max_events,
                "fixed_events": sizing.fixed_events,
            },
            "max_subscriber_queue": 1024,
            "ack_timeout_s": 300.0,
            "gc": "gc.collect(); gc.freeze() after imports and setup, in every child; young-"
                  f"generation threshold {GC_GEN0} (the triggerer's), for both implementations",
            "rss": "VmHWM (reset via /proc/self/clear_refs) minus VmRSS right before the run",
        },
        "machine": machine,
        "interpreters": interpreters,
        "targets": evaluate_targets(results),
        "ratios": ratios,
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, write the result files and print the table."""
    args = parse_args(argv)
    if args.replot is not None:
        saved = json.loads(args.replot.read_text(encoding="utf-8"))
        write_plot(args.replot.with_suffix(".png"), saved["results"])
        print_table(saved["results"], saved["targets"])
        return 0
    cases, sizing = build_cases(args)
    stem = "fanout" + ("-plain-events" if args.trigger_event == "plain" else "")
    stem += "-quick" if args.quick else ""
    output_dir: Path = args.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = machine_info()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fanout-bench-") as scratch:
        runners, interpreters = prepare_runners(args, Path(scratch))
        total = len(cases) * len(runners)
        progress(
            f"{len(cases)} configurations x {len(runners)} implementation(s) x {args.repeat} "
            f"run(s), batch B={args.batch}, nproc={machine['nproc']}"
        )
        for case in cases:
            for result in run_case(case, runners, args.repeat):
                results.append(result)
                report_progress(len(results), total, case, result)
    machine["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report = build_report(
        args,
        cases=cases,
        sizing=sizing,
        machine=machine,
        interpreters=interpreters,
        results=results,
    )
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    json_path = output_dir / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    write_csv(output_dir / f"{stem}.csv", results)
    written = [json_path.name, f"{stem}.csv"]
    if not args.no_plot and write_plot(output_dir / f"{stem}.png", results):
        written.append(f"{stem}.png")
    progress(f"wrote {', '.join(written)} to {output_dir} in {report['elapsed_s']} s")
    print_table(results, report["targets"])
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
