"""SQS end to end: messages/s from send to delete, on an SQS emulator.

Starts fauxqs (npm; installed on first use under ``benchmarks/results/.fauxqs``,
see ``_fauxqs.py``) and then, with ``--brokers auto`` (the default), LocalStack
through the ``testcontainers`` package when a Docker engine answers (else that
backend is skipped with a line saying why). For each case, on a fresh
standard queue: pre-sends N JSON messages ``{"id": i, "bucket": i % 10, ...}`` with
``SendMessageBatch`` (chunks of 10, several batches in flight), then times
from the consumers' start until the queue is empty
(``ApproximateNumberOfMessages + ApproximateNumberOfMessagesNotVisible == 0``,
polled by a separate client).

* ``raw`` - the ceiling: C workers on one aiobotocore client, each looping
  ``ReceiveMessage(MaxNumberOfMessages=10, WaitTimeSeconds=1)`` +
  ``DeleteMessageBatch``; no decoding, nothing stored.
* ``shared K`` - sharedstream: the in-process :class:`Triggerer` on a
  definitions file with K ``SqsSharedStreamTrigger`` watchers on the queue
  (one shared consumer for all, ``receive_concurrency=C``), watcher j
  matching ``bucket == j % 10`` (each emits for 1 in 10 messages; a label
  keeps watchers with equal filters distinct), every event stored in SQLite
  before its message is deleted.

Reported per case: msgs/s (whole time, start-up included), steady msgs/s
(from the first delete observed), ``DeleteMessageBatch`` calls per 1000
messages (the raw loop counts its own; the shared case reads its producer's
``calls`` counter, so no OpenTelemetry SDK runs in either), CPU seconds of this
process and of the emulator, and garbage-collector time. ``--repeat R`` runs
every case R times, rounds interleaved, and reports the median run. The
target - shared at K = 10 reaching 80% of the raw rate at the same receive
concurrency - is reported, never asserted.
Writes ``benchmarks/results/sqs_e2e.{json,csv,png}`` (``sqs_e2e-quick.*``
with ``--quick``).

Usage: ``python benchmarks/sqs_e2e.py [--messages N] [--quick] [--ks 1,10,100]
[--concurrency C] [--repeat R] [--brokers auto|fauxqs|testcontainers] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import gc
import importlib
import json
import logging
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _e2e import cpu_seconds, expected_events, message_body, write_definitions
from _fauxqs import CREDENTIALS, REGION, FauxqsError, start_fauxqs, stop_fauxqs
from _producers_seen import PRODUCERS
from _triggerer_config import make_config

from sharedstream.store.sqlite import SqliteStore
from sharedstream.testing.brokers import NoDockerEngine, localstack_container

RESULTS = Path(__file__).resolve().parent / "results"
POLL = 0.1  # seconds between queue-depth checks (each costs ~2-3 ms of client CPU)
SEND_IN_FLIGHT = 8  # SendMessageBatch calls in flight while pre-sending
WAIT_TIME_SECONDS = 1  # long poll of both the raw loop and the shared consumer
DELETE_OPERATIONS = ("DeleteMessageBatch", "DeleteMessage")
TARGET_K, TARGET_FRACTION = 10, 0.80
LOCALSTACK_IMAGE = "localstack/localstack:3.8"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- backends -----------------------------------------------------------------------------


class BackendUnavailable(RuntimeError):
    """A backend cannot run on this machine; the benchmark skips it with this message."""


@dataclass(frozen=True)
class Backend:
    """A running SQS endpoint; ``pid`` is the emulator's process when it is local."""

    name: str
    endpoint_url: str
    pid: int | None


@contextlib.contextmanager
def fauxqs_backend(workdir: Path) -> Iterator[Backend]:
    """fauxqs on a free loopback port, stopped on exit."""
    process, endpoint_url = start_fauxqs(log_path=workdir / "fauxqs.log")
    try:
        yield Backend("fauxqs", endpoint_url, process.pid)
    finally:
        stop_fauxqs(process)


@contextlib.contextmanager
def localstack_backend(image: str) -> Iterator[Backend]:
    """LocalStack (SQS only) in a container, through testcontainers; removed on exit.

    Raises :class:`BackendUnavailable` before starting anything when there
    is no Docker engine or no testcontainers package.
    """
    with contextlib.ExitStack() as stack:
        try:
            endpoint_url = stack.enter_context(localstack_container(image, region=REGION))
        except NoDockerEngine as exc:
            raise BackendUnavailable(
                f"skipping the testcontainers (LocalStack) backend: {exc}") from exc
        yield Backend("localstack", endpoint_url, None)


class GcTimer:
    """Time spent in the cyclic garbage collector while entered (via ``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections: Counter[int] = Counter()  # per generation
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        # The collector holds the GIL: start and stop never interleave across threads.
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self._callback)


class Usage:
    """CPU seconds of this process, of its event-loop thread and of the emulator, and GC time.

    Entered and stopped on the event-loop thread: ``main_cpu`` is that
    thread's own CPU, the rest of ``cpu`` is other threads (SQLite's).
    """

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.gc = GcTimer()
        self.cpu = 0.0
        self.main_cpu = 0.0
        self.broker_cpu: float | None = None
        self._cpu0 = self._main0 = 0.0
        self._broker0: float | None = None
        self._running = False

    def __enter__(self) -> Usage:
        self._cpu0, self._main0 = time.process_time(), time.thread_time()
        self._broker0 = cpu_seconds(self.pid)
        self.gc.__enter__()
        self._running = True
        return self

    def stop(self) -> None:
        """Take the readings (idempotent): called when the queue is seen empty."""
        if self._running:
            self._running = False
            self.cpu = time.process_time() - self._cpu0
            self.main_cpu = time.thread_time() - self._main0
            broker = cpu_seconds(self.pid)
            self.broker_cpu = (None if broker is None or self._broker0 is None
                               else broker - self._broker0)
            self.gc.__exit__()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


# -- clients, queues, sending ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def sqs_client(endpoint_url: str, *, pool: int = 10) -> AsyncIterator[Any]:
    """An aiobotocore SQS client on ``endpoint_url`` with room for ``pool`` connections."""
    session: Any = importlib.import_module("aiobotocore.session")
    config: Any = importlib.import_module("aiobotocore.config")
    async with session.get_session().create_client(
            "sqs", region_name=REGION, endpoint_url=endpoint_url, **CREDENTIALS,
            config=config.AioConfig(max_pool_connections=max(pool, 10),
                                    retries={"max_attempts": 3, "mode": "standard"})) as client:
        yield client


async def send_messages(client: Any, queue_url: str, messages: int) -> None:
    """Send ``messages`` bodies with SendMessageBatch, 10 per call, several calls in flight."""
    chunks = iter(range(0, messages, 10))

    async def sender() -> None:
        for start in chunks:  # one iterator shared by every sender: each chunk is sent once
            entries = [{"Id": str(i), "MessageBody": message_body(i)}
                       for i in range(start, min(start + 10, messages))]
            response = await client.send_message_batch(QueueUrl=queue_url, Entries=entries)
            if response.get("Failed"):
                raise RuntimeError(f"SendMessageBatch failed for {response['Failed']}")

    async with asyncio.TaskGroup() as tasks:
        for n in range(SEND_IN_FLIGHT):
            tasks.create_task(sender(), name=f"sqs-e2e-sender-{n}")


async def queue_depth(client: Any, queue_url: str) -> int:
    """Visible + in-flight messages: 0 once every message has been deleted."""
    response = await client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages",
                                            "ApproximateNumberOfMessagesNotVisible"])
    attributes = response["Attributes"]
    return (int(attributes["ApproximateNumberOfMessages"])
            + int(attributes["ApproximateNumberOfMessagesNotVisible"]))


@dataclass
class Progress:
    """How the queue drained, as the monitoring client saw it (s since the case started)."""

    first_at: float | None = None  # first poll that saw a message gone
    left_at_first: int = 0
    done_at: float | None = None


async def wait_empty(client: Any, queue_url: str, messages: int, *, started: float,
                     limit: float, label: str) -> Progress:
    """Poll the queue depth every ``POLL`` s until it is 0; report progress every second."""
    progress = Progress()
    last_report = 0.0
    while True:
        depth = await queue_depth(client, queue_url)
        now = time.perf_counter() - started
        if depth < messages and progress.first_at is None:
            progress.first_at, progress.left_at_first = now, depth
        if depth == 0:
            progress.done_at = now
            return progress
        if now - last_report >= 1.0:
            last_report = now
            _say(f"  [{label} {now:5.1f}s] deleted {messages - depth:>7}/{messages}")
        if now > limit:
            raise TimeoutError(f"{label}: {depth} messages still in the queue after "
                               f"{limit:.0f}s")
        await asyncio.sleep(POLL)


# -- results --------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """One case on one backend."""

    backend: str
    case: str
    k: int
    concurrency: int
    messages: int
    progress: Progress
    requests: Counter[str]
    events: int
    expected_events: int
    usage: Usage
    notes: list[str] = field(default_factory=list)
    round: int = 0

    @property
    def seconds(self) -> float:
        return self.progress.done_at or math.nan

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def steady_per_s(self) -> float:
        """Rate after the first observed delete; nan if that poll already saw the queue empty."""
        p = self.progress
        if p.first_at is None or p.done_at is None or p.left_at_first == 0:
            return math.nan
        return p.left_at_first / max(p.done_at - p.first_at, POLL)

    @property
    def per_cpu_s(self) -> float:
        """Messages per CPU second of this process: the rate if it had a core to itself."""
        return self.messages / self.usage.cpu if self.usage.cpu else math.nan

    @property
    def delete_calls_per_1000(self) -> float:
        return sum(self.requests[op] for op in DELETE_OPERATIONS) * 1000 / self.messages

    def row(self) -> dict[str, Any]:
        def num(value: float | None, digits: int = 1) -> float | None:
            return None if value is None or math.isnan(value) else round(value, digits)

        return {
            "backend": self.backend, "case": self.case, "k": self.k, "round": self.round,
            "concurrency": self.concurrency, "messages": self.messages,
            "msgs_per_s": num(self.per_s), "seconds": num(self.seconds, 3),
            "first_delete_s": num(self.progress.first_at, 3),
            "steady_msgs_per_s": num(self.steady_per_s),
            "delete_batch_calls": self.requests["DeleteMessageBatch"],
            "delete_single_calls": self.requests["DeleteMessage"],
            "receive_calls": self.requests["ReceiveMessage"],
            "delete_calls_per_1000": num(self.delete_calls_per_1000, 2),
            "events_stored": self.events, "events_expected": self.expected_events,
            "bench_cpu_s": num(self.usage.cpu, 2),
            "loop_thread_cpu_s": num(self.usage.main_cpu, 2),
            "msgs_per_cpu_s": num(self.per_cpu_s),
            "broker_cpu_s": num(self.usage.broker_cpu, 2),
            "gc_s": num(self.usage.gc.seconds, 3),
            "gc_full_collections": self.usage.gc.collections[2],
            "requests": " ".join(f"{op}={n}" for op, n in sorted(self.requests.items())),
        }


# -- the raw loop ---------------------------------------------------------------------------


async def raw_worker(client: Any, queue_url: str, stop: asyncio.Event,
                     calls: Counter[str]) -> None:
    """Receive up to 10, delete them in one batch; repeat until ``stop``."""
    while not stop.is_set():
        response = await client.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=WAIT_TIME_SECONDS)
        calls["ReceiveMessage"] += 1
        batch = response.get("Messages") or []
        if not batch:
            continue
        result = await client.delete_message_batch(QueueUrl=queue_url, Entries=[
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)])
        calls["DeleteMessageBatch"] += 1
        if result.get("Failed"):
            raise RuntimeError(f"DeleteMessageBatch failed for {result['Failed']}")


async def run_raw(backend: Backend, monitor: Any, queue_url: str, messages: int, *,
                  concurrency: int, limit: float) -> CaseResult:
    calls: Counter[str] = Counter()
    stop = asyncio.Event()
    with Usage(backend.pid) as usage:
        started = time.perf_counter()
        async with (sqs_client(backend.endpoint_url, pool=concurrency) as client,
                    asyncio.TaskGroup() as tasks):
            for n in range(concurrency):
                tasks.create_task(raw_worker(client, queue_url, stop, calls),
                                  name=f"raw-worker-{n}")
            try:
                progress = await wait_empty(monitor, queue_url, messages, started=started,
                                            limit=limit, label="raw")
                usage.stop()
            finally:
                stop.set()  # the workers finish their current long poll (<= 1 s) and return
    return CaseResult(backend.name, "raw", 0, concurrency, messages, progress, calls, 0, 0,
                      usage)


# -- the shared case ----------------------------------------------------------------------------


DEFINITIONS_HEADER = """\
from _e2e import LabelledWatcher
from _producers_seen import PRODUCERS

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.sqs import SqsSharedStreamTrigger


class BenchWatcher(LabelledWatcher, SqsSharedStreamTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        producer = super().create_shared_stream_producer(kwargs)
        PRODUCERS.append(producer)  # the benchmark reads its call counts
        return producer

"""


async def run_shared(backend: Backend, monitor: Any, queue_url: str, messages: int, *, k: int,
                     concurrency: int, casedir: Path,
                     limit: float) -> CaseResult:
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - imports user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415

    definitions = casedir / "bench_definitions.py"
    write_definitions(definitions, DEFINITIONS_HEADER, {
        "queue": queue_url, "region_name": REGION, "endpoint_url": backend.endpoint_url,
        "credentials": dict(CREDENTIALS), "wait_time_seconds": WAIT_TIME_SECONDS,
        "max_messages": 10, "receive_concurrency": concurrency, "payload_format": "json",
    }, k)
    config = make_config(casedir)
    triggerer = Triggerer(config, load_definitions(definitions))
    PRODUCERS.clear()
    with Usage(backend.pid) as usage:
        started = time.perf_counter()
        task = asyncio.create_task(triggerer.run(), name=f"sqs-e2e-triggerer-{k}")
        try:
            waiter = asyncio.create_task(wait_empty(
                monitor, queue_url, messages, started=started, limit=limit,
                label=f"shared {k}"), name="sqs-e2e-wait-empty")
            done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                waiter.cancel()
                raise RuntimeError(f"the triggerer ended early: {task.result()}")
            progress = waiter.result()
            usage.stop()
        finally:
            triggerer.request_stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    requests: Counter[str] = Counter()
    for producer in PRODUCERS:
        requests.update(producer.calls)
    with SqliteStore(config.sqlite_path()) as store:
        events = store.counts()["trigger_events"]
    result = CaseResult(backend.name, f"shared {k}", k, concurrency, messages, progress,
                        +requests, events, expected_events(messages, k), usage)
    if not requests:
        result.notes.append("no producer call counts: delete calls unknown")
    return result


def shared_module_ready() -> str | None:
    """None if ``sharedstream.triggers.sqs`` imports, else why not."""
    try:
        importlib.import_module("sharedstream.triggers.sqs")
    except ImportError as exc:
        return f"sharedstream.triggers.sqs does not import ({exc})"
    return None


# -- running ----------------------------------------------------------------------------------


async def run_case(args: argparse.Namespace, backend: Backend, monitor: Any, *, kind: str,
                   k: int, name: str, shared: bool, workdir: Path) -> CaseResult:
    """One case on a fresh queue ``name``: send, consume until empty, delete the queue."""
    label = "raw" if kind == "raw" else f"shared {k}"
    queue_url = (await monitor.create_queue(QueueName=name))["QueueUrl"]
    sent = time.perf_counter()
    await send_messages(monitor, queue_url, args.messages)
    depth = await queue_depth(monitor, queue_url)
    _say(f"{backend.name} {label}: {depth} messages on {name} "
         f"(sent in {time.perf_counter() - sent:.1f}s)")
    if depth != args.messages:
        raise RuntimeError(f"{name} holds {depth} messages, expected {args.messages}")
    if kind == "raw" or not shared:
        result = await run_raw(backend, monitor, queue_url, args.messages,
                               concurrency=args.concurrency, limit=args.timeout)
    else:
        casedir = workdir / f"{backend.name}-{name}"
        casedir.mkdir()
        result = await run_shared(backend, monitor, queue_url, args.messages, k=k,
                                  concurrency=args.concurrency,
                                  casedir=casedir, limit=args.timeout)
    await monitor.delete_queue(QueueUrl=queue_url)
    _say(f"{backend.name} {label}: {result.per_s:,.0f} msgs/s ({result.seconds:.2f}s; "
         f"steady {result.steady_per_s:,.0f} msgs/s), "
         f"{result.delete_calls_per_1000:.1f} delete calls per 1000, "
         f"{result.events}/{result.expected_events} events stored")
    return result


async def run_backend(args: argparse.Namespace, backend: Backend, workdir: Path,
                      shared: bool) -> list[CaseResult]:
    """Every case ``args.repeat`` times, rounds interleaved (raw, shared K..., raw, ...)."""
    cases: list[tuple[str, int]] = [("raw", 0)]
    if shared:
        cases += [("shared", k) for k in args.ks]
    results: list[CaseResult] = []
    async with sqs_client(backend.endpoint_url) as monitor:
        for round_ in range(args.repeat):
            for n, (kind, k) in enumerate(cases):
                name = f"bench-e2e-{os.getpid()}-{round_}-{n}-{kind}-{k}"
                result = await run_case(args, backend, monitor, kind=kind, k=k, name=name,
                                        shared=shared, workdir=workdir)
                result.round = round_
                results.append(result)
    return results


def medians(runs: list[CaseResult]) -> list[CaseResult]:
    """Per backend and case, the run with the median msgs/s (the lower one of an even count)."""
    grouped: dict[tuple[str, str], list[CaseResult]] = {}
    for run in runs:
        grouped.setdefault((run.backend, run.case), []).append(run)
    return [sorted(group, key=lambda r: r.per_s)[(len(group) - 1) // 2]
            for group in grouped.values()]


def ratios(results: list[CaseResult]) -> dict[str, float]:
    out: dict[str, float] = {}
    raws = {r.backend: r for r in results if r.case == "raw"}
    for r in results:
        raw = raws.get(r.backend)
        if r.case.startswith("shared") and raw is not None:
            out[f"{r.backend}: {r.case} / raw"] = r.per_s / raw.per_s
            out[f"{r.backend}: {r.case} / raw (steady)"] = r.steady_per_s / raw.steady_per_s
            out[f"{r.backend}: {r.case} / raw (per CPU s)"] = r.per_cpu_s / raw.per_cpu_s
    return out


def round_ratios(runs: list[CaseResult]) -> dict[str, list[float]]:
    """Each shared case / the raw run of the same round: pairs measured minutes apart."""
    raws = {(r.backend, r.round): r for r in runs if r.case == "raw"}
    out: dict[str, list[float]] = {}
    for r in runs:
        raw = raws.get((r.backend, r.round))
        if r.case.startswith("shared") and raw is not None:
            out.setdefault(f"{r.backend}: {r.case} / raw", []).append(
                round(r.per_s / raw.per_s, 3))
    return out


def targets(results: list[CaseResult], rat: dict[str, float]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for backend in dict.fromkeys(r.backend for r in results):
        ratio = rat.get(f"{backend}: shared {TARGET_K} / raw")
        if ratio is None:
            continue
        out[backend] = {
            "target": f"shared {TARGET_K} >= {TARGET_FRACTION:.0%} of raw msgs/s "
                      "at the same receive concurrency",
            "ratio": round(ratio, 3), "met": bool(ratio >= TARGET_FRACTION)}
    return out


# -- output -------------------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    backends = list(dict.fromkeys(r["backend"] for r in rows))
    fig, axes = plt.subplots(len(backends), 2, figsize=(11, 4 * len(backends)), squeeze=False)
    for (rate_ax, delete_ax), backend in zip(axes, backends, strict=True):
        mine = [r for r in rows if r["backend"] == backend]
        names = [r["case"] for r in mine]
        xs = list(range(len(mine)))
        whole = rate_ax.bar([x - 0.2 for x in xs], [r["msgs_per_s"] or 0 for r in mine], 0.4,
                            label="whole run")
        rate_ax.bar_label(whole, fmt="{:,.0f}", fontsize="x-small")
        rate_ax.bar([x + 0.2 for x in xs], [r["steady_msgs_per_s"] or 0 for r in mine], 0.4,
                    label="after first delete")
        rate_ax.set_ylim(0, 1.3 * max(r["steady_msgs_per_s"] or r["msgs_per_s"] or 1
                                      for r in mine))
        raw = next((r for r in mine if r["case"] == "raw"), None)
        if raw is not None and raw["msgs_per_s"]:
            rate_ax.axhline(raw["msgs_per_s"], color="black", linestyle="--", linewidth=1,
                            label="raw ceiling")
            rate_ax.axhline(raw["msgs_per_s"] * TARGET_FRACTION, color="grey", linestyle=":",
                            linewidth=1, label=f"{TARGET_FRACTION:.0%} of raw (target)")
        rate_ax.set_xticks(xs, names)
        rate_ax.set_ylabel("messages/s, send -> deleted")
        rate_ax.set_title(f"{backend}: {mine[0]['messages']:,} JSON messages, "
                          f"receive concurrency {mine[0]['concurrency']}")
        rate_ax.legend(fontsize="small")
        deletes = delete_ax.bar(xs, [r["delete_calls_per_1000"] or 0 for r in mine], 0.6,
                                color="C2")
        delete_ax.bar_label(deletes, fmt="{:.1f}", fontsize="small")
        delete_ax.set_ylim(0, 1.3 * max(r["delete_calls_per_1000"] or 100 for r in mine))
        delete_ax.axhline(100, color="grey", linestyle=":", linewidth=1,
                          label="100 = one full batch of 10 per call")
        delete_ax.set_xticks(xs, names)
        delete_ax.set_ylabel("delete calls per 1000 messages")
        delete_ax.set_title(f"{backend}: DeleteMessageBatch calls")
        delete_ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_outputs(out: Path, stem: str, args: argparse.Namespace, runs: list[CaseResult], *,
                  skipped: dict[str, str], load: dict[str, list[float]]) -> None:
    results = medians(runs)
    rows = [r.row() for r in results]
    rat = ratios(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(),
        "cpus": os.cpu_count(), "messages": args.messages, "ks": args.ks,
        "concurrency": args.concurrency, "wait_time_seconds": WAIT_TIME_SECONDS,
        "repeat": args.repeat, "load_average": load,
        "rows": rows, "runs": [r.row() for r in runs],
        "notes": {f"{r.backend} {r.case} #{r.round}": r.notes for r in runs if r.notes},
        "skipped": skipped,
        "ratios": {k: None if math.isnan(v) else round(v, 4) for k, v in rat.items()},
        "round_ratios": round_ratios(runs),
        "targets": targets(results, rat)}, indent=2) + "\n")
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png")


def print_table(results: list[CaseResult]) -> None:
    print("| backend | case | msgs/s | wall s | first delete s | steady msgs/s | "
          "delete calls / 1000 | events stored | CPU s (bench / broker) | msgs per CPU s | "
          "GC s |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in results:
        broker = "-" if r.usage.broker_cpu is None else f"{r.usage.broker_cpu:.1f}"
        print(f"| {r.backend} | {r.case} | {r.per_s:,.0f} | {r.seconds:.2f} | "
              f"{r.progress.first_at or 0:.2f} | {r.steady_per_s:,.0f} | "
              f"{r.delete_calls_per_1000:.1f} | {r.events:,} / {r.expected_events:,} | "
              f"{r.usage.cpu:.1f} / {broker} | {r.per_cpu_s:,.0f} | {r.usage.gc.seconds:.2f} |")
    rat = ratios(results)
    for name, value in rat.items():
        print(f"{name}: {value:.2f}")
    for backend, verdict in targets(results, rat).items():
        print(f"{backend}: target {verdict['target']}: ratio {verdict['ratio']:.2f} -> "
              f"{'met' if verdict['met'] else 'NOT met'}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per case (default 20,000)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2,000 messages, K in 1,10; writes sqs_e2e-quick.*")
    parser.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 10, 100], help="watcher counts, comma-separated")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="receive concurrency C of the raw loop and of the shared consumer")
    parser.add_argument("--brokers", choices=("auto", "fauxqs", "testcontainers"),
                        default="auto",
                        help="auto (default): fauxqs, then LocalStack through testcontainers "
                             "when a Docker engine answers (else skipped, saying why)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per case, rounds interleaved; the median run is reported")
    parser.add_argument("--localstack-image", default=LOCALSTACK_IMAGE)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.ks = 2_000, [1, 10]
    args.backends = {"auto": ["fauxqs", "testcontainers"], "fauxqs": ["fauxqs"],
                     "testcontainers": ["testcontainers"]}[args.brokers]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    skipped: dict[str, str] = {}
    shared = True
    why_not = shared_module_ready()
    if why_not is not None:
        shared = False
        skipped["shared"] = why_not
        _say(f"{why_not}: running the raw case only")
    workdir = Path(tempfile.mkdtemp(prefix="sharedstream-sqs-e2e-"))
    runs: list[CaseResult] = []
    load = {"start": list(os.getloadavg())}
    try:
        for name in args.backends:
            try:
                with (fauxqs_backend(workdir) if name == "fauxqs"
                      else localstack_backend(args.localstack_image)) as backend:
                    _say(f"{backend.name} on {backend.endpoint_url}; {args.messages} messages "
                         f"per case, receive concurrency {args.concurrency}; in {workdir}")
                    runs += asyncio.run(run_backend(args, backend, workdir, shared))
            except BackendUnavailable as exc:
                skipped[name] = str(exc)
                _say(str(exc))
    except FauxqsError as exc:
        _say(f"error: {exc}")
        return 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load["end"] = list(os.getloadavg())
    if not runs:
        _say("error: no backend ran")
        return 2
    stem = "sqs_e2e-quick" if args.quick else "sqs_e2e"
    write_outputs(args.output_dir, stem, args, runs, skipped=skipped, load=load)
    print_table(medians(runs))
    for name, values in round_ratios(runs).items():
        print(f"{name}, round by round: {', '.join(f'{v:.2f}' for v in values)}")
    bad = [f"{r.backend} {r.case} #{r.round}" for r in runs if r.events != r.expected_events]
    if bad:
        _say(f"error: wrong event counts in {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
