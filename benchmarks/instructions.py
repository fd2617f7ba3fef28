"""Instructions per record of our triggerer on the headline's live Kafka workload (callgrind).

Wall-clock figures on these shared 2-core machines move 10-20% between runs
of the same code (our CPU per record in ``airflow_e2e.py`` ranged
0.056-0.100 ms on identical work), so a change worth a few percent cannot be
seen in them. Valgrind's callgrind counts the instructions a process
executes; that count moves 0.5-3% between runs of the same code here. This
runs the sharedstream side of ``airflow_e2e.py`` - ``python -m sharedstream
triggerer`` with the same watcher module, DAG file and Kafka connection (K
``BucketWatcher`` triggers on one topic of 4 partitions on Tansu, one run
queued per event) - under callgrind, with instrumentation off until the K
triggers are running. It is switched on, N records are produced
(``_e2e.message_body``, as in the headline), and the counts are dumped once
the group's committed offsets reach the end of the topic (every record
acknowledged, so its events stored before); the events stored are then
checked against ``_e2e.expected_events``.

Three filters (``--filters``, default all):

* ``json`` - the headline's watchers: each of the K decodes every record
  (``json.loads``) and compares its bucket;
* ``bytes`` - the same watchers testing their bucket with a ``bytes`` search
  first, decoding their own matches only. The main thread's count is then
  nearly all ours: fetching, the fan-out, resolution, packing, the gate and
  the acks. ``json - bytes`` is what the watchers' decoding costs;
* ``none`` - the same search for a bucket no record has: nothing is
  decoded or stored, so ``bytes - none`` is what the events cost (one per
  record at K = 10: the matching record's decoding, then ours: its raw
  event's identity, packing, the gate, the write's confirmation).

Per case: instructions per record on the main thread (the event loop: the
consumer, the filters, the gate) and on the other threads together (the
store's writer and its WAL checkpointer). ``--rev REV`` (repeatable) also
measures commit REV, exported with ``git archive`` and first on the
triggerer's ``PYTHONPATH``: before and after a change, side by side. Under
callgrind the triggerer runs about 50 times slower, so the ack timeout is
raised to an hour (no record may time out), N is small (5,000 records
take about 30 s per case here) and the triggerer's string hashes are fixed
(``PYTHONHASHSEED=0``); what still varies is how the records fall into
fetches and store batches.

Writes ``benchmarks/results/instructions.{json,csv,png}`` (``--name``).
Needs valgrind (``apt-get install valgrind``).

Usage: ``python benchmarks/instructions.py [--messages N] [--k K]
[--filters json,bytes,none] [--rev REV ...] [--output-dir D] [--name STEM]``
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from _e2e import expected_events, say
from _revisions import export_revision, working_tree_revision
from _triggerer_config import BENCH_ENVIRONMENT
from airflow_e2e import (
    WATCHERS,
    Database,
    _our_running,
    kafka_connection,
    wait_running,
    write_dag,
)
from kafka_e2e import create_topic, produce, wait_committed

from sharedstream.testing.brokers import tansu_broker
from sharedstream.testing.triggerers import TriggererCluster

RESULTS = Path(__file__).resolve().parent / "results"
FILTERS = ("json", "bytes", "none")
ACK_TIMEOUT = "3600"  # seconds: nothing may time out at callgrind's pace
LIMIT = 1800.0  # seconds for one case's N events to be stored

_DECODE_ALL = ('            record = json.loads(value)\n'
               '            if record["bucket"] == self.bucket:\n')
_DECODE_MATCHES = ("            if value.find(b'\"bucket\": %d,' % self.bucket) >= 0:\n"
                   "                record = json.loads(value)\n")
_MATCH_NOTHING = ("            if value.find(b'\"bucket\": %d,' % (self.bucket - 10)) >= 0:\n"
                  "                record = json.loads(value)\n")  # buckets are 0-9: no match


def watchers_text(filter_: str) -> str:
    """The sharedstream watcher module's text for ``filter_`` (one of :data:`FILTERS`)."""
    text = WATCHERS.format(prefix="sharedstream.airflow.")
    if filter_ == "json":
        return text
    if _DECODE_ALL not in text:  # the headline's watcher changed: say so, never measure json
        raise RuntimeError("airflow_e2e.WATCHERS no longer decodes as this benchmark expects")
    return text.replace(_DECODE_ALL, _DECODE_MATCHES if filter_ == "bytes" else _MATCH_NOTHING)


_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


def thread_totals(out: Path) -> dict[int, int]:
    """Instructions per thread (1 = the main thread) of callgrind's dumps named ``out``*.

    With ``--separate-threads=yes`` a dump writes ``<out>.<part>-<thread>``
    per thread; a thread's count is the largest ``totals``/``summary`` line
    of its files (both name the same count).
    """
    totals: dict[int, int] = {}
    for path in out.parent.glob(f"{out.name}.*-*"):
        thread = int(path.name.rsplit("-", 1)[1])
        counts = [int(found) for found in _TOTALS.findall(path.read_text(errors="replace"))]
        if counts:
            totals[thread] = max(totals.get(thread, 0), *counts)
    return totals


@dataclass
class Count:
    """One case: instructions per record, by thread."""

    revision: str
    filter: str
    messages: int
    k: int
    main: float
    other_threads: float
    seconds: float  # wall time under callgrind, for the record

    @property
    def total(self) -> float:
        return self.main + self.other_threads


async def measure(bootstrap: str, work: Path, *, revision: str, tree: Path | None, filter_: str,
                  messages: int, k: int) -> Count:
    """Run one case: the triggerer under callgrind, instrumented from the first record on."""
    name = f"{re.sub(r'[^A-Za-z0-9]', '_', revision)}-{filter_}"
    folder = work / name
    folder.mkdir()
    topic = f"instructions.{name}"
    await create_topic(bootstrap, topic, 4)
    env = {**BENCH_ENVIRONMENT, "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": ACK_TIMEOUT,
           "AIRFLOW_CONN_KAFKA_BENCH": kafka_connection(bootstrap, f"{topic}.g")}
    database = Database(f"sqlite:///{folder / 'sharedstream.db'}")
    cluster = TriggererCluster(folder, database.url, env,
                               pythonpath=() if tree is None else (tree,))
    (folder / "bench_watchers.py").write_text(watchers_text(filter_))
    definitions = write_dag(folder, "sharedstream", topic, k)
    out = folder / "callgrind.out"
    process = _start_under_callgrind(cluster, definitions, out)
    try:
        await wait_running(lambda: _running(cluster, process, name), k, label=name, limit=600)
        _control("-i", "on", process.pid)
        started = time.perf_counter()
        ends = await produce(bootstrap, topic, messages, 4)
        # Every record acknowledged: its events stored first (the persistence gate).
        await wait_committed(bootstrap, topic, ends, [f"{topic}.g"], started=started,
                             limit=LIMIT, label=name)
        seconds = time.perf_counter() - started
        _control("-d", process.pid)
        _running(cluster, process, name)  # still up: it did not die after acknowledging
        expected = 0 if filter_ == "none" else expected_events(messages, k)
        ((stored, distinct),) = database.rows(
            "SELECT count(*), count(DISTINCT idem_key) FROM trigger_events")
        if stored != expected or distinct != expected:
            raise RuntimeError(f"{name}: {stored} events stored ({distinct} distinct), "
                               f"{expected} expected")
    finally:
        process.kill()
        process.wait()
    totals = thread_totals(out)
    if 1 not in totals:
        raise RuntimeError(f"{name}: callgrind wrote no count for the main thread in {folder}")
    main = totals.pop(1)
    return Count(revision, filter_, messages, k, main / messages,
                 sum(totals.values()) / messages, seconds)


def _running(cluster: TriggererCluster, process: subprocess.Popen[bytes], name: str) -> int:
    """Triggers the triggerer runs; raises at once if it exited (a bad tree, say)."""
    if process.poll() is not None:
        raise RuntimeError(f"{name}: the triggerer exited {process.returncode}:\n"
                           + (cluster.dir / "triggerer.log").read_text()[-2000:])
    return _our_running(cluster)


def _start_under_callgrind(cluster: TriggererCluster, definitions: Path,
                           out: Path) -> subprocess.Popen[bytes]:
    """``sharedstream triggerer`` under callgrind, not counting until :func:`_control` says."""
    with (cluster.dir / "triggerer.log").open("wb") as log:
        return subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
             f"--callgrind-out-file={out}", sys.executable, "-m", "sharedstream",
             "--config", str(cluster.config), "triggerer", "--definitions", str(definitions),
             "--log-level", "WARNING"],
            cwd=cluster.dir, env=cluster.env, stdout=subprocess.DEVNULL, stderr=log)


def _control(*args: object) -> None:
    subprocess.run(["callgrind_control", *map(str, args)], check=True, capture_output=True)


async def run_all(args: argparse.Namespace, bootstrap: str, work: Path) -> list[Count]:
    trees: list[tuple[str, Path | None]] = []
    for rev in args.rev:
        exported = work / f"tree-{len(trees)}"
        sha = export_revision(rev, exported)
        trees.append((f"{rev} ({sha[:10]})", exported))
    trees.append((working_tree_revision() or "working tree", None))
    counts = []
    for revision, tree in trees:
        for filter_ in args.filters:
            count = await measure(bootstrap, work, revision=revision, tree=tree, filter_=filter_,
                                  messages=args.messages, k=args.k)
            say(f"{revision} {filter_}: {count.main:,.0f} instructions/record on the main "
                f"thread, {count.other_threads:,.0f} on the others ({count.seconds:.0f} s)")
            counts.append(count)
    return counts


def print_table(counts: Sequence[Count]) -> None:
    print("| revision | filter | main thread | other threads | total |")
    print("|---|---|--:|--:|--:|")
    for c in counts:
        print(f"| {c.revision} | {c.filter} | {c.main:,.0f} | {c.other_threads:,.0f} "
              f"| {c.total:,.0f} |")
    base = {c.filter: c for c in counts if c.revision == counts[0].revision}
    for c in counts:
        if c.revision != counts[0].revision and c.filter in base:
            print(f"{c.revision} / {counts[0].revision}, {c.filter}: main "
                  f"{c.main / base[c.filter].main:.3f}, total {c.total / base[c.filter].total:.3f}")
    by_case = {(c.revision, c.filter): c for c in counts}
    for revision in dict.fromkeys(c.revision for c in counts):
        decoded, searched = by_case.get((revision, "json")), by_case.get((revision, "bytes"))
        bare = by_case.get((revision, "none"))
        if decoded is not None and searched is not None:
            print(f"{revision}: the watchers' decoding {decoded.main - searched.main:,.0f} "
                  f"instructions/record, the rest of the main thread {searched.main:,.0f}")
        if searched is not None and bare is not None:
            per_record = expected_events(searched.messages, searched.k) / searched.messages
            print(f"{revision}: the events ({per_record:g} per record) "
                  f"{searched.main - bare.main:,.0f} on the main thread, "
                  f"{searched.other_threads - bare.other_threads:,.0f} on the others; "
                  f"without them {bare.main:,.0f} and {bare.other_threads:,.0f}")


def write_results(args: argparse.Namespace, counts: Sequence[Count]) -> None:
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / args.name
    rows = [{**asdict(c), "main": round(c.main), "other_threads": round(c.other_threads),
             "total": round(c.total), "seconds": round(c.seconds, 1)} for c in counts]
    stem.with_suffix(".json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.platform(),
        "valgrind": _valgrind_version(), "broker": "tansu (memory)", "partitions": 4,
        "messages": args.messages, "k": args.k, "rows": rows}, indent=2) + "\n")
    with stem.with_suffix(".csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(counts, stem.with_suffix(".png"),
         f"Instructions per record, K = {args.k}, {args.messages:,} records (callgrind)")


def _valgrind_version() -> str:
    return subprocess.run(["valgrind", "--version"], capture_output=True, text=True,
                          check=False).stdout.strip()


def plot(counts: Sequence[Count], path: Path, title: str) -> None:
    """Stacked bars per case: the main thread, then the other threads."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(max(6, 2 * len(counts)), 4))
    names = [f"{c.revision}\n{c.filter}" for c in counts]
    main = [c.main / 1000 for c in counts]
    ax.bar(names, main, label="main thread", color="#4c72b0")
    ax.bar(names, [c.other_threads / 1000 for c in counts], bottom=main,
           label="other threads (store)", color="#dd8452")
    ax.set_ylabel("thousand instructions per record")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    def filters(text: str) -> list[str]:
        chosen = text.split(",")
        wrong = [f for f in chosen if f not in FILTERS]
        if wrong:
            raise argparse.ArgumentTypeError(f"unknown {wrong}; choose from {FILTERS}")
        return chosen

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=5_000, help="records per case (5,000)")
    parser.add_argument("--k", type=int, default=10, help="watchers (10)")
    parser.add_argument("--filters", type=filters, default=list(FILTERS),
                        help="some of json, bytes, none (all)")
    parser.add_argument("--rev", action="append", default=[],
                        help="also measure this commit, before the working tree (repeatable)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="instructions", help="result file stem")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.k < 1:
        parser.error("--messages and --k must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"instructions.py: {' and '.join(missing)} not found: apt-get install valgrind",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="sharedstream-instructions-") as tmp:
        work = Path(tmp)
        with tansu_broker(work) as bootstrap:
            counts = asyncio.run(run_all(args, bootstrap, work))
    print_table(counts)
    write_results(args, counts)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
