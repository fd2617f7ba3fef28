"""Kafka end to end with 1, 2 and 3 triggerer processes on one PostgreSQL: msgs/s and exactly once.

Starts Tansu (in memory) and one throwaway PostgreSQL cluster
(:func:`~sharedstream.testing.brokers.postgres.postgres_server`,
``durable=True``: ``fsync`` and ``synchronous_commit`` on). For each case,
on a fresh topic of P partitions (default 6), a fresh group and a fresh
database: pre-produce N JSON records ``{"id": i, "bucket": i % 10, ...}``
(``kafka_e2e.produce``), then start T ``sharedstream triggerer`` processes
(the real CLI, :class:`~sharedstream.testing.triggerers.TriggererCluster`)
on one definitions file with K ``KafkaSharedStreamTrigger`` watchers
(``kafka_e2e``'s: watcher j stores the records of bucket ``j % 10``, one
consumer per triggerer, all in one group), and time from the processes'
start until every partition's committed offset reaches the end of the
topic (``kafka_e2e.wait_committed``).

Two rates per case, as in ``kafka_e2e.py``: ``msgs/s`` over the whole time
(interpreter start, imports, group join and every rebalance as the other
triggerers join included) and ``steady msgs/s`` from the first observed
commit. CPU seconds are read from ``/proc`` for the triggerers, the
PostgreSQL server (postmaster, its live backends and the reaped ones),
Tansu, and the whole machine (busy share of all cores over the case; what
none of these used is ``other``: other people's work on a shared machine);
the WAL PostgreSQL wrote over the case is ``wal_mb``.

Checks (exit status 1 when one fails, after the results are written): the
group had T members when everything was committed; ``sharedstream
triggerers list`` showed T live triggerers each running K triggers; every
triggerer exited 0 on SIGTERM; and the database holds exactly the expected
events - per trigger the count of its bucket, in all ``expected_events(N,
K)`` - so, with the idempotency keys unique, every matching (watcher,
record) is stored exactly once whatever the rebalances replayed.

``--repeat R`` runs R rounds of every T, round-robin (the order rotates each
round); the reported run per T is the median by ``msgs/s``, and ``T / 1``
is the median of the rounds' own ratios. Writes
``benchmarks/results/scale_out.{json,csv,png}`` (``-quick`` with ``--quick``).

The default N is 100,000 records: interpreter start, imports and the group
joins take about 2 s whatever N is, and the steady rate needs several
seconds to be seen.

Usage: ``python benchmarks/scale_out.py [--messages N] [--triggerers 1,2,3] [--ks 10]
[--partitions 6] [--repeat 3] [--quick] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import importlib
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _e2e import BUCKETS, compile_checkout, cpu_seconds, expected_events, say, write_definitions
from _triggerer_config import BENCH_ENVIRONMENT
from kafka_e2e import (
    DEFINITIONS_HEADER,
    OVERRIDES,
    RESULTS,
    create_topic,
    produce,
    summarize,
    wait_committed,
)

from sharedstream.testing.brokers import tansu_broker
from sharedstream.testing.brokers.postgres import fresh_database, postgres_server
from sharedstream.testing.triggerers import TriggererCluster

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent


# -- CPU accounting from /proc ------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root``, its reaped children (cutime) and its live children."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = _proc_stat(root)
    if fields is None:
        return 0.0
    total = sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks
    for pid in _pids():
        child = _proc_stat(pid)
        if child is not None and int(child[1]) == root:
            total += (int(child[11]) + int(child[12])) / ticks
    return total


def find_process(*needles: str) -> int | None:
    """The pid of the process whose command line holds every one of ``needles``."""
    for pid in _pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(needle in cmdline for needle in needles):
            return pid
    return None


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass
class CpuMeter:
    """CPU seconds used between :meth:`start` and :meth:`stop` by the processes around a case."""

    postgres_pid: int | None
    tansu_pid: int | None
    marks: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        busy, total = machine_ticks()
        return {"postgres": tree_cpu(self.postgres_pid) if self.postgres_pid else 0.0,
                "tansu": cpu_seconds(self.tansu_pid) or 0.0,
                "bench": time.process_time(), "busy": busy, "total": total}

    def start(self) -> None:
        self.marks = self._read()

    def stop(self) -> dict[str, float]:
        now = self._read()
        used = {name: round(now[name] - self.marks[name], 2)
                for name in ("postgres", "tansu", "bench")}
        busy = now["busy"] - self.marks["busy"]
        used["machine_busy_share"] = round(busy / max(1, now["total"] - self.marks["total"]), 3)
        used["machine_busy_s"] = round(busy / os.sysconf("SC_CLK_TCK"), 2)
        return used


# -- one case -----------------------------------------------------------------------------------


@dataclass
class ScaleResult:
    """One run: T triggerers, N records, K watchers, from the processes' start to all committed."""

    triggerers: int
    k: int
    messages: int
    round: int
    seconds: float
    join_seconds: float
    steady_per_s: float
    events: int
    expected_events: int
    cpu: dict[str, float]
    triggerer_cpu_s: list[float]
    checks: dict[str, bool]

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def wrong(self) -> bool:
        return self.events != self.expected_events or not all(self.checks.values())

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["msgs_per_s"] = round(self.per_s, 1)
        out["steady_per_s"] = round(self.steady_per_s, 1)
        out["seconds"] = round(self.seconds, 3)
        out["join_seconds"] = round(self.join_seconds, 3)
        return out


async def group_members(bootstrap: str, group: str) -> int:
    """How many members the consumer group has now (the admin API's DescribeGroups)."""
    admin_module: Any = importlib.import_module("aiokafka.admin")  # untyped; the kafka extra
    admin = admin_module.AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    groups = [g for response in described for g in response.groups]
    members = groups[0][5] if isinstance(groups[0], tuple) else groups[0]["members"]
    return len(members)


def wal_position(admin: str) -> int:
    """The cluster's current WAL position in bytes (``pg_current_wal_lsn()``)."""
    import psycopg  # noqa: PLC0415 - the postgres extra

    with psycopg.connect(admin) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def stored_per_trigger(url: str) -> tuple[list[int], int]:
    """Each trigger's stored events (sorted) and the distinct idempotency keys in the database."""
    import psycopg  # noqa: PLC0415 - the postgres extra

    with psycopg.connect(url) as conn:
        per_trigger = sorted(int(n) for (n,) in conn.execute(
            "SELECT count(*) FROM trigger_events GROUP BY trigger_id"))
        row = conn.execute("SELECT count(DISTINCT idem_key) FROM trigger_events").fetchone()
    return per_trigger, int(row[0]) if row else 0


async def watch_processes(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Return when a triggerer exits (it must not, before everything is committed)."""
    while all(proc.poll() is None for proc in procs):  # noqa: ASYNC110 - a Popen's exit is no event
        await asyncio.sleep(0.2)


async def run_case(args: argparse.Namespace, bootstrap: str, admin: str, meter: CpuMeter, *,
                   workdir: Path, triggerers: int, k: int, round_no: int) -> ScaleResult:
    """T triggerer processes on a fresh topic and database until every record is committed."""
    topic = f"bench.scale.{round_no}.{triggerers}-{k}"
    group = f"{topic}.shared"
    await create_topic(bootstrap, topic, args.partitions)
    ends = await produce(bootstrap, topic, args.messages, args.partitions)
    casedir = workdir / topic
    casedir.mkdir()
    definitions = casedir / "bench_definitions.py"
    write_definitions(definitions, DEFINITIONS_HEADER, {
        "bootstrap_servers": bootstrap, "topics": [topic], "group_id": group,
        "payload_format": "json", "consumer_overrides": OVERRIDES}, k)
    label = f"{triggerers} triggerer(s)"
    say(f"round {round_no}, {label}, K = {k}: {sum(ends.values())} records on {topic}")
    with fresh_database(admin, prefix="bench_scale") as url:
        cluster = TriggererCluster(casedir, url, BENCH_ENVIRONMENT,
                                   pythonpath=[BENCHMARKS, ROOT])
        try:
            wal_at_start = wal_position(admin)
            meter.start()
            started = time.perf_counter()
            procs = [cluster.start(i, definitions, log_level="WARNING")
                     for i in range(triggerers)]
            waiter = asyncio.create_task(wait_committed(
                bootstrap, topic, ends, [group], started=started, limit=args.timeout,
                label=label))
            watcher = asyncio.create_task(watch_processes(procs))
            done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
                dead = next(i for i, p in enumerate(procs) if p.poll() is not None)
                raise RuntimeError(f"triggerer {dead} exited early:\n{cluster.log(dead)[-2000:]}")
            watcher.cancel()
            progress = waiter.result()
            cpu = meter.stop()
            cpu["wal_mb"] = round((wal_position(admin) - wal_at_start) / 1e6, 1)
            triggerer_cpu = [round(cpu_seconds(p.pid) or 0.0, 2) for p in procs]
            # What else ran on the machine meanwhile (other people's work on a shared VM).
            cpu["other"] = round(max(0.0, cpu["machine_busy_s"] - sum(triggerer_cpu) - sum(
                cpu[name] for name in ("postgres", "tansu", "bench"))), 2)
            members = await group_members(bootstrap, group)
            listed = cluster.json("triggerers", "list")
            alive = [row for row in listed if row["alive"]]
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=60) for proc in procs]
        finally:
            cluster.close()
        per_trigger, distinct = stored_per_trigger(url)
    per_bucket = Counter(i % BUCKETS for i in range(args.messages))
    wanted = sorted(per_bucket[j % BUCKETS] for j in range(k))
    checks = {
        "group_members": members == triggerers,
        "triggerers_alive": len(alive) == triggerers
        and all(len(row["triggers"]) == k for row in alive),
        "clean_exits": codes == [0] * triggerers,
        "per_trigger_counts": per_trigger == wanted,
        "distinct_keys": distinct == sum(per_trigger),
    }
    base = summarize(label, k, args.messages, progress, events=sum(per_trigger),
                     expected=expected_events(args.messages, k))
    result = ScaleResult(triggerers, k, args.messages, round_no, base.seconds,
                         base.join_seconds, base.steady_per_s, base.events,
                         base.expected_events, cpu, triggerer_cpu, checks)
    say(f"{label}: {result.per_s:,.0f} msgs/s ({result.seconds:.2f} s, first commit "
        f"{result.join_seconds:.2f} s, steady {result.steady_per_s:,.0f}), {result.events}/"
        f"{result.expected_events} events, CPU s triggerers {sum(triggerer_cpu):.1f} "
        f"postgres {cpu['postgres']:.1f} tansu {cpu['tansu']:.1f} other {cpu['other']:.1f}, "
        f"machine busy {cpu['machine_busy_share']:.0%}; per triggerer {triggerer_cpu}; "
        f"checks {checks}")
    return result


# -- rounds and output ---------------------------------------------------------------------------


@contextlib.contextmanager
def servers(workdir: Path) -> Iterator[tuple[str, str, CpuMeter]]:
    """Tansu and PostgreSQL for the block: (bootstrap, admin URL, a CPU meter over both)."""
    with tansu_broker(workdir) as bootstrap, postgres_server(durable=True) as admin:
        port = admin.rsplit(":", 1)[1].split("/", 1)[0]
        meter = CpuMeter(postgres_pid=find_process("postgres", f"-p {port}"),
                         tansu_pid=find_process("tansu", bootstrap))
        yield bootstrap, admin, meter


async def run_rounds(args: argparse.Namespace, bootstrap: str, admin: str, meter: CpuMeter,
                     workdir: Path) -> list[ScaleResult]:
    counts: list[int] = args.triggerers
    order = [(round_no, triggerers, k) for round_no in range(args.repeat)
             for triggerers in (counts[round_no % len(counts):] + counts[:round_no % len(counts)])
             for k in args.ks]
    return [await run_case(args, bootstrap, admin, meter, workdir=workdir,
                           triggerers=triggerers, k=k, round_no=round_no)
            for round_no, triggerers, k in order]


def report(runs: list[ScaleResult]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The median run per (T, K) as rows, and per K the same-round ratios of T against T = 1."""
    rows = []
    ratios: dict[str, Any] = {}
    keys = sorted({(r.k, r.triggerers) for r in runs})
    for k, triggerers in keys:
        mine = sorted((r for r in runs if (r.k, r.triggerers) == (k, triggerers)),
                      key=lambda r: r.per_s)
        median = mine[(len(mine) - 1) // 2]
        row = median.row()
        row["runs_msgs_per_s"] = [round(r.per_s, 1) for r in mine]
        row["runs_steady_per_s"] = [round(r.steady_per_s, 1) for r in mine]
        rows.append(row)
        base = {r.round: r for r in runs if (r.k, r.triggerers) == (k, min(t for _, t in keys))}
        pairs = [(r, base[r.round]) for r in runs
                 if (r.k, r.triggerers) == (k, triggerers) and r.round in base]
        if pairs and triggerers != pairs[0][1].triggerers:
            name = f"K={k}: {triggerers} / {pairs[0][1].triggerers} triggerer(s)"
            whole = [a.per_s / b.per_s for a, b in pairs]
            steady = [a.steady_per_s / b.steady_per_s for a, b in pairs]
            ratios[name] = {"median": round(statistics.median(whole), 3),
                            "rounds": [round(x, 3) for x in whole],
                            "steady_median": round(statistics.median(steady), 3),
                            "steady_rounds": [round(x, 3) for x in steady]}
    return rows, ratios


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """msgs/s (whole and steady) per triggerer count, and where the CPU went."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [f"T={r['triggerers']}\nK={r['k']}" for r in rows]
    xs = range(len(rows))
    for offset, key, label in ((-0.2, "msgs_per_s", "whole run (start to all committed)"),
                               (0.2, "steady_per_s", "after the first commit")):
        values = [r[key] for r in rows]
        bars = left.bar([x + offset for x in xs], values, 0.4, label=label)
        left.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
    left.set_xticks(list(xs), names)
    left.set_ylabel("messages/s (median run)")
    left.set_title(f"Kafka (Tansu) -> T triggerers -> one PostgreSQL, "
                   f"{rows[0]['messages']:,} records")
    left.legend(fontsize=8)
    bottom = [0.0] * len(rows)
    for key, label in (("triggerers", "triggerers"), ("postgres", "PostgreSQL"),
                       ("tansu", "Tansu"), ("bench", "benchmark"),
                       ("other", "other processes")):
        values = [sum(r["triggerer_cpu_s"]) if key == "triggerers" else r["cpu"][key]
                  for r in rows]
        right.bar(list(xs), values, 0.6, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.plot(list(xs), [r["seconds"] * 2 for r in rows], "k_", markersize=30,
               label="2 cores x wall time")
    right.set_xticks(list(xs), names)
    right.set_ylabel("CPU seconds over the run")
    right.set_title("where the CPU went")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(out: Path, stem: str, args: argparse.Namespace,
                  runs: list[ScaleResult]) -> list[dict[str, Any]]:
    rows, ratios = report(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.platform(),
        "cores": os.cpu_count(), "broker": "tansu", "partitions": args.partitions,
        "store": "postgresql (fsync on, synchronous_commit on)", "rows": rows,
        "ratios": ratios, "runs": [r.row() for r in runs]}, indent=2) + "\n")
    flat = [{key: value for key, value in row.items()
             if key not in ("cpu", "checks", "triggerer_cpu_s") and not key.startswith("runs_")}
            | {"triggerer_cpu_s": sum(row["triggerer_cpu_s"]),
               **{f"{key}_cpu_s": value for key, value in row["cpu"].items()}}
            for row in rows]
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)
    plot(rows, out / f"{stem}.png")
    print("| triggerers | K | msgs/s | wall s | first commit s | steady msgs/s | events stored "
          "| CPU s: triggerers / PostgreSQL / Tansu / other | machine busy |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        print(f"| {row['triggerers']} | {row['k']} | {row['msgs_per_s']:,.0f} | "
              f"{row['seconds']:.2f} | {row['join_seconds']:.2f} | {row['steady_per_s']:,.0f} | "
              f"{row['events']:,} / {row['expected_events']:,} | "
              f"{sum(row['triggerer_cpu_s']):.1f} / {row['cpu']['postgres']:.1f} / "
              f"{row['cpu']['tansu']:.1f} / {row['cpu']['other']:.1f} | "
              f"{row['cpu']['machine_busy_share']:.0%} |")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio['median']:.2f}x (rounds {ratio['rounds']}), steady "
              f"{ratio['steady_median']:.2f}x (rounds {ratio['steady_rounds']})")
    return rows


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers, comma-separated: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000,
                        help="records (default 100,000: start-up and joins are ~2 s whatever N)")
    parser.add_argument("--triggerers", type=_ints, default=[1, 2, 3],
                        help="triggerer counts T, comma-separated (default 1,2,3)")
    parser.add_argument("--ks", type=_ints, default=[10],
                        help="watcher counts K, comma-separated (default 10)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--quick", action="store_true",
                        help="3,000 records, one round (about 30 s)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.repeat = 3_000, 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    compile_checkout()  # each case's clock includes starting the triggerers
    workdir = Path(tempfile.mkdtemp(prefix="sharedstream-scale-out-"))
    try:
        with servers(workdir) as (bootstrap, admin, meter):
            say(f"Tansu on {bootstrap}, PostgreSQL on {admin}; {args.messages} records, "
                f"{args.partitions} partitions; in {workdir}")
            runs = asyncio.run(run_rounds(args, bootstrap, admin, meter, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stem = "scale_out-quick" if args.quick else "scale_out"
    write_results(args.output_dir, stem, args, runs)
    bad = [f"T={r.triggerers} K={r.k} round {r.round}: events {r.events}/{r.expected_events}, "
           f"checks {r.checks}" for r in runs if r.wrong]
    if bad:
        print("error: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
