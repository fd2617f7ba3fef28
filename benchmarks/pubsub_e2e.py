"""Pub/Sub end to end: messages/s from publish to acknowledged, on the kit's Pub/Sub test server.

Starts the testing kit's Pub/Sub test server as its own process on a free
loopback port (``python -m sharedstream.testing.pubsub --port N``, through
``sharedstream.testing.brokers.pubsub``; it needs the ``pubsub`` extra). For
each case, on a fresh topic with fresh subscription(s): pre-publishes N JSON
messages ``{"id": i, "bucket": i % 10, ...}`` (``Publish``, 1,000 a call),
then times from the consumers' start until every message is acknowledged.

* ``raw`` - the ceiling: the real async client's ``StreamingPull``
  (``SubscriberAsyncClient.streaming_pull``), each response's ack ids written
  back on the stream at once; no decoding, nothing stored.
* ``client`` - the client library's own receive + ack loop, what a user
  writes first: ``pubsub_v1.SubscriberClient().subscribe(subscription,
  callback)`` with ``FlowControl(max_messages=1000)`` (the same read-ahead),
  the callback calling ``message.ack()``; nothing decoded or stored.
* ``shared K`` - sharedstream: the in-process :class:`Triggerer` on a
  definitions file with K ``PubSubSharedStreamTrigger`` watchers on the
  subscription (one stream for all), watcher j matching ``bucket == j % 10``
  (a label keeps watchers with equal filters distinct), every event stored in
  SQLite by the persistence gate before its message is acked (the producer's
  own ``Acknowledge`` calls).
* ``independent K`` - what users run today: K subscriptions (each gets every
  message), each with its own client and streaming pull, decoding JSON,
  keeping 1 in 10, storing them in SQLite (own connection, WAL,
  ``synchronous=FULL``, a transaction per response) and then acking them on
  the stream.

**When is a case done?** The server runs as a separate process, so its
state (``PubSubState.snapshot()``) is out of reach, and Pub/Sub has no API
for a subscription's unacked count. So each consumer counts its own acks:
the raw and independent loops count the ack ids they have written to the
stream, the client loop counts its ``message.ack()`` calls (the library sends
them shortly after, so its clock stops a little early, in its favour), the
shared case counts the ack ids of ``Acknowledge`` calls that returned (the
generated definitions subclass the producer to count them).
The clock stops when every subscription has N acks. Then the consumers
stop (closing their streams hands back anything still leased) and a final
``Pull(return_immediately=True)`` on each subscription must return nothing;
the case fails otherwise.

``--repeat R`` runs the whole case list R times, round-robin, and reports
the run with the median msgs/s per case, plus the same-round ratios
``shared 10 / client`` (target >= 0.8), ``shared 10 / independent 10``
(target >= 3) and ``shared 10 / raw`` (no target: the ceiling), each with
MET / NOT MET (the median of the rounds' ratios); reported, never asserted.
Writes ``benchmarks/results/pubsub_e2e.{json,csv,png}`` (``pubsub_e2e-quick.*``
with ``--quick``).

Usage: ``python benchmarks/pubsub_e2e.py [--messages N] [--quick] [--ks 1,10]
[--repeat R] [--output-dir D]``
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
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _e2e import ACKED, BUCKETS, IndependentStore, cpu_seconds, expected_events, message_body
from _triggerer_config import make_config

from sharedstream.store.sqlite import SqliteStore
from sharedstream.testing.brokers.pubsub import start_pubsub, stop_pubsub

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT = "bench"
POLL = 0.02  # seconds between checks of the ack counts
PUBLISH_BATCH, PUBLISH_IN_FLIGHT = 1_000, 4
MAX_IN_FLIGHT = 1000  # every stream's max_outstanding_messages: the shared trigger's default
ACK_DEADLINE = 60
TARGETS: dict[str, float | None] = {
    "shared 10 / client": 0.8, "shared 10 / independent 10": 3.0, "shared 10 / raw": None}
"""Same-round ratios reported; ``None``: no target (the ceiling, for reading the others)."""

Handler = Callable[[Sequence[tuple[str, int, int, bytes]]], Awaitable[None]]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _sdk(name: str) -> Any:
    return importlib.import_module(name)


# -- clients, topics, publishing --------------------------------------------------------------


def subscriber_client(host: str) -> Any:
    """A ``SubscriberAsyncClient`` on its own plain-text channel to the test server."""
    subscriber = _sdk("google.pubsub_v1.services.subscriber")
    return subscriber.SubscriberAsyncClient(
        transport=subscriber.transports.SubscriberGrpcAsyncIOTransport(
            channel=_sdk("grpc").aio.insecure_channel(host)))


def publisher_client(host: str) -> Any:
    publisher = _sdk("google.pubsub_v1.services.publisher")
    return publisher.PublisherAsyncClient(
        transport=publisher.transports.PublisherGrpcAsyncIOTransport(
            channel=_sdk("grpc").aio.insecure_channel(host)))


async def prepare(host: str, name: str, subscriptions: int, messages: int) -> list[str]:
    """A topic ``name`` with ``subscriptions`` subscriptions, then N messages published to it."""
    topic = f"projects/{PROJECT}/topics/{name}"
    paths = [f"projects/{PROJECT}/subscriptions/{name}-{n}" for n in range(subscriptions)]
    publisher, admin = publisher_client(host), subscriber_client(host)
    await publisher.create_topic(name=topic)
    for path in paths:
        await admin.create_subscription(name=path, topic=topic,
                                        ack_deadline_seconds=ACK_DEADLINE)
    types = _sdk("google.pubsub_v1.types")
    chunks = iter(range(0, messages, PUBLISH_BATCH))

    async def sender() -> None:
        for start in chunks:  # one iterator shared by every sender: each chunk goes once
            await publisher.publish(topic=topic, messages=[
                types.PubsubMessage(data=message_body(i).encode())
                for i in range(start, min(start + PUBLISH_BATCH, messages))])

    async with asyncio.TaskGroup() as tasks:
        for n in range(PUBLISH_IN_FLIGHT):
            tasks.create_task(sender(), name=f"pubsub-e2e-publisher-{n}")
    return paths


async def leftover(host: str, subscription: str) -> int:
    """Messages a final short ``Pull`` still gets (0 when every message was acked)."""
    client = subscriber_client(host)
    with warnings.catch_warnings():  # return_immediately is deprecated, and exactly right here
        warnings.simplefilter("ignore", DeprecationWarning)
        response = await client.pull(subscription=subscription, max_messages=1_000,
                                     return_immediately=True, timeout=10)
    return len(response.received_messages)


# -- progress -------------------------------------------------------------------------------


@dataclass
class Progress:
    """When the subscriptions were done (s since the case started): the case is the slowest."""

    first_ack_at: float | None = None
    done_at: dict[str, float] = field(default_factory=dict)


async def wait_acked(subscriptions: list[str], messages: int, *, started: float, limit: float,
                     label: str, ended: asyncio.Future[Any] | None = None) -> Progress:
    """Poll :data:`ACKED` until every subscription counts N acks; report every second."""
    progress = Progress()
    last_report = 0.0
    while True:
        now = time.perf_counter() - started
        if progress.first_ack_at is None and any(ACKED[s] for s in subscriptions):
            progress.first_ack_at = now
        for s in subscriptions:
            if s not in progress.done_at and ACKED[s] >= messages:
                progress.done_at[s] = now
        if len(progress.done_at) == len(subscriptions):
            return progress
        if ended is not None and ended.done():
            raise RuntimeError(f"{label}: the consumers ended early ({ended.result()!r})")
        slowest = min(ACKED[s] for s in subscriptions)
        if now - last_report >= 1.0:
            last_report = now
            _say(f"  [{label} {now:5.1f}s] acked {slowest:>7}/{messages} "
                 f"(slowest of {len(subscriptions)} subscription(s))")
        if now > limit:
            raise TimeoutError(f"{label}: {slowest}/{messages} acked after {limit:.0f}s")
        await asyncio.sleep(POLL)


# -- raw and independent: a streaming pull, acks on the stream ------------------------------------


async def stream_consumer(host: str, subscription: str, handle: Handler | None,
                          stop: asyncio.Event) -> None:
    """Pull on one stream, ``handle`` each response (if given), ack it on the stream.

    An ack id counts in :data:`ACKED` once gRPC has taken its request to send.
    On ``stop`` the request stream ends (half-close) after the acks queued so
    far, and the server ends the response stream: nothing acked is dropped.
    """
    types = _sdk("google.pubsub_v1.types")
    client = subscriber_client(host)
    acks: asyncio.Queue[list[str] | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[Any]:
        yield types.StreamingPullRequest(
            subscription=subscription, stream_ack_deadline_seconds=ACK_DEADLINE,
            max_outstanding_messages=MAX_IN_FLIGHT)
        while (ack_ids := await acks.get()) is not None:
            yield types.StreamingPullRequest(ack_ids=ack_ids)
            ACKED[subscription] += len(ack_ids)  # resumed: gRPC has taken the request

    async def closer() -> None:
        await stop.wait()
        acks.put_nowait(None)

    stream = await client.streaming_pull(requests=requests(), retry=None)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(closer(), name=f"pubsub-e2e-closer-{subscription}")
        async for response in stream:
            received = type(response).pb(response).received_messages
            if handle is not None:
                await handle([(subscription, 0, int(r.message.message_id), r.message.data)
                              for r in received])
            acks.put_nowait([r.ack_id for r in received])


async def run_streams(host: str, subscriptions: list[str], handlers: list[Handler | None],
                      messages: int, *, label: str, limit: float) -> Progress:
    stop = asyncio.Event()
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tasks:
        consumers = [tasks.create_task(stream_consumer(host, s, h, stop),
                                       name=f"pubsub-e2e-consumer-{s}")
                     for s, h in zip(subscriptions, handlers, strict=True)]
        try:
            ended = asyncio.gather(*consumers)
            progress = await wait_acked(subscriptions, messages, started=started,
                                        limit=limit, label=label, ended=ended)
        finally:
            stop.set()
    return progress


# -- client: the library's subscribe() + message.ack() --------------------------------------


async def run_client(host: str, subscription: str, messages: int, *, limit: float) -> Progress:
    """``SubscriberClient.subscribe`` with a callback that acks: the library's own loop.

    The library runs it on its own threads (a streaming pull, a lease
    manager, a dispatcher batching acks, a callback pool); this task only
    watches the count. Closing the subscription flushes the acks it queued.
    """
    pubsub = _sdk("google.cloud.pubsub_v1")
    lock = threading.Lock()

    def callback(message: Any) -> None:
        message.ack()
        with lock:
            ACKED[subscription] += 1

    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = host  # plain text, no credentials
    try:
        client = pubsub.SubscriberClient()
    finally:
        if previous is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = previous
    started = time.perf_counter()
    future = client.subscribe(subscription, callback, flow_control=pubsub.types.FlowControl(
        max_messages=MAX_IN_FLIGHT))
    try:
        return await wait_acked([subscription], messages, started=started, limit=limit,
                                label="client", ended=asyncio.wrap_future(future))
    finally:
        future.cancel()  # stops the stream after sending the queued acks
        await asyncio.to_thread(future.result, 30)
        await asyncio.to_thread(client.close)


# -- shared ---------------------------------------------------------------------------------


DEFINITIONS_HEADER = """\
from _e2e import ACKED

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.producers.pubsub import PubSubSharedStreamProducer
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger


class CountingProducer(PubSubSharedStreamProducer):
    \"\"\"The Pub/Sub producer, counting the ack ids of each Acknowledge that returned.\"\"\"

    async def _send_acks(self, chunk):
        retry = await super()._send_acks(chunk)
        ACKED[self.subscription] += len(chunk) - len(retry)
        return retry


class BenchWatcher(PubSubSharedStreamTrigger):
    \"\"\"A Pub/Sub watcher with a label: identical filters stay distinct triggers.\"\"\"

    def __init__(self, *, watcher, **kwargs):
        self.watcher = watcher
        super().__init__(**kwargs)

    def serialize(self):
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "watcher": self.watcher}

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return CountingProducer(cls._settings_from(kwargs))

"""


def write_definitions(path: Path, common: dict[str, Any], k: int) -> None:
    """K watchers on one subscription; watcher j matches ``bucket == j % 10``."""
    path.write_text(
        DEFINITIONS_HEADER + f"COMMON = {common!r}\n\n"
        + "".join(
            f"bucket_{j} = Asset('bucket_{j}', watchers=[AssetWatcher('w', "
            f"trigger=BenchWatcher(**COMMON, watcher={j}, "
            f"match={{'json': {{'bucket': {j % BUCKETS}}}}}))])\n"
            for j in range(k)))


async def run_shared(host: str, subscription: str, messages: int, *, k: int, casedir: Path,
                     limit: float) -> tuple[Progress, int]:
    """The in-process triggerer until N acks; returns the progress and the events stored."""
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - imports user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415

    definitions = casedir / "bench_definitions.py"
    write_definitions(definitions, {
        "project": PROJECT, "subscription": subscription, "emulator_host": host,
        "max_in_flight": MAX_IN_FLIGHT, "ack_deadline": ACK_DEADLINE, "payload_format": "json",
    }, k)
    config = make_config(casedir)
    triggerer = Triggerer(config, load_definitions(definitions))
    started = time.perf_counter()
    task = asyncio.create_task(triggerer.run(), name=f"pubsub-e2e-triggerer-{k}")
    try:
        progress = await wait_acked([subscription], messages, started=started, limit=limit,
                                    label=f"shared {k}", ended=task)
    finally:
        triggerer.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    with SqliteStore(config.sqlite_path()) as store:
        return progress, store.counts()["trigger_events"]


# -- a case ---------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: str
    k: int
    messages: int
    round: int
    seconds: float
    first_ack_s: float | None
    events: int
    expected_events: int
    leftover: int
    bench_cpu_s: float
    server_cpu_s: float | None

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else math.nan

    def row(self) -> dict[str, Any]:
        return {"case": self.case, "k": self.k, "round": self.round, "messages": self.messages,
                "msgs_per_s": round(self.per_s, 1), "seconds": round(self.seconds, 3),
                "first_ack_s": None if self.first_ack_s is None else round(self.first_ack_s, 3),
                "events_stored": self.events, "events_expected": self.expected_events,
                "left_after": self.leftover, "bench_cpu_s": round(self.bench_cpu_s, 2),
                "server_cpu_s": None if self.server_cpu_s is None
                else round(self.server_cpu_s, 2)}


async def run_case(host: str, server_pid: int, kind: str, k: int, *, round_: int, n: int,
                   messages: int, workdir: Path, limit: float) -> CaseResult:
    """One case on a fresh topic: publish, consume until N acks each, check nothing is left."""
    label = kind if kind in ("raw", "client") else f"{kind} {k}"
    name = f"e2e-{round_}-{n}-{kind}-{k}"
    subscriptions = await prepare(host, name, k if kind == "independent" else 1, messages)
    _say(f"{label}: {messages} messages on {len(subscriptions)} subscription(s) of {name}")
    cpu0, server0 = time.process_time(), cpu_seconds(server_pid)
    events = expected = 0
    if kind == "raw":
        progress = await run_streams(host, subscriptions, [None], messages, label=label,
                                     limit=limit)
    elif kind == "client":
        progress = await run_client(host, subscriptions[0], messages, limit=limit)
    elif kind == "shared":
        casedir = workdir / name
        casedir.mkdir()
        progress, events = await run_shared(host, subscriptions[0], messages, k=k,
                                            casedir=casedir, limit=limit)
        expected = expected_events(messages, k)
    else:
        stores = [IndependentStore(workdir / f"{name}.db", j) for j in range(k)]
        try:
            progress = await run_streams(host, subscriptions, [s.handle for s in stores],
                                         messages, label=label, limit=limit)
            (stored,) = stores[0].db.execute("SELECT count(*) FROM events").fetchone()
        finally:
            for store in stores:
                store.db.close()
        events, expected = int(stored), expected_events(messages, k)
    cpu, server1 = time.process_time() - cpu0, cpu_seconds(server_pid)
    left = sum([await leftover(host, s) for s in subscriptions])
    result = CaseResult(label, k, messages, round_, max(progress.done_at.values()),
                        progress.first_ack_at, events, expected, left, cpu,
                        None if server0 is None or server1 is None else server1 - server0)
    _say(f"{label}: {result.per_s:,.0f} msgs/s ({result.seconds:.2f}s), "
         f"{events}/{expected} events stored, {left} left for a final Pull")
    return result


# -- the report -----------------------------------------------------------------------------


def median_runs(runs: list[CaseResult]) -> list[CaseResult]:
    """Per case, the run with the median msgs/s (the lower middle one for an even count)."""
    grouped: dict[str, list[CaseResult]] = {}
    for run in runs:
        grouped.setdefault(run.case, []).append(run)
    return [sorted(group, key=lambda r: r.per_s)[(len(group) - 1) // 2]
            for group in grouped.values()]


def round_ratios(runs: list[CaseResult]) -> dict[str, list[float]]:
    """Each target's ratio, round by round (the two cases ran minutes apart at most)."""
    by = {(r.round, r.case): r for r in runs}
    out: dict[str, list[float]] = {}
    for name in TARGETS:
        top, bottom = name.split(" / ")
        for round_ in sorted({r.round for r in runs}):
            a, b = by.get((round_, top)), by.get((round_, bottom))
            if a is not None and b is not None:
                out.setdefault(name, []).append(round(a.per_s / b.per_s, 3))
    return out


def verdicts(runs: list[CaseResult]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, values in round_ratios(runs).items():
        target, median = TARGETS[name], round(statistics.median(values), 3)
        out[name] = {"target": "none" if target is None else f">= {target}", "rounds": values,
                     "median": median,
                     "verdict": "-" if target is None else "MET" if median >= target
                     else "NOT MET"}
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4))
    xs = list(range(len(rows)))
    bars = ax.bar(xs, [r["msgs_per_s"] or 0 for r in rows], 0.6,
                  color=["C7" if r["case"] in ("raw", "client")
                         else "C0" if r["case"].startswith("shared") else "C1" for r in rows])
    ax.bar_label(bars, fmt="{:,.0f}", fontsize="small")
    client = next((r for r in rows if r["case"] == "client"), None)
    if client is not None:
        ax.axhline(client["msgs_per_s"] * (TARGETS["shared 10 / client"] or 0), color="grey",
                   linestyle=":", linewidth=1,
                   label="80% of the client loop (target for shared 10)")
        ax.legend(fontsize="small")
    ax.set_xticks(xs, [r["case"] for r in rows])
    ax.set_ylabel("messages/s, publish -> acked")
    ax.set_title(f"Pub/Sub end to end (kit's test server, {rows[0]['messages']:,} JSON "
                 "messages, 1 in 10 stored per watcher)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(out: Path, stem: str, args: argparse.Namespace, runs: list[CaseResult],
                  load: dict[str, list[float]]) -> None:
    results = median_runs(runs)
    rows = [r.row() for r in results]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(),
        "cpus": os.cpu_count(), "broker": "sharedstream.testing.pubsub (own process)",
        "messages": args.messages, "ks": args.ks, "repeat": args.repeat,
        "max_in_flight": MAX_IN_FLIGHT, "load_average": load,
        "done_when": "each consumer counted N acks (raw/independent: ack ids written on the "
                     "stream; client: message.ack() calls; shared: ack ids of Acknowledge "
                     "calls that returned), then a final Pull(return_immediately) after the "
                     "consumers stopped got nothing",
        "rows": rows, "runs": [r.row() for r in runs], "targets": verdicts(runs)},
        indent=2) + "\n")
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / f"{stem}.png")


def print_table(runs: list[CaseResult]) -> None:
    print("| case | msgs/s | wall s | first ack s | events stored | CPU s (bench / server) |")
    print("|---|--:|--:|--:|--:|--:|")
    for r in median_runs(runs):
        server = "-" if r.server_cpu_s is None else f"{r.server_cpu_s:.1f}"
        print(f"| {r.case} | {r.per_s:,.0f} | {r.seconds:.2f} | {r.first_ack_s or 0:.2f} | "
              f"{r.events:,} / {r.expected_events:,} | {r.bench_cpu_s:.1f} / {server} |")
    for name, verdict in verdicts(runs).items():
        print(f"{name}: {verdict['median']:.2f} (rounds: "
              f"{', '.join(f'{v:.2f}' for v in verdict['rounds'])}; target "
              f"{verdict['target']}) -> {verdict['verdict']}")


# -- main -----------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, host: str, server_pid: int,
                  workdir: Path) -> list[CaseResult]:
    """Every case ``--repeat`` times, round-robin: noise falls on every case alike."""
    cases = [("raw", 1), ("client", 1)]
    for k in args.ks:
        cases += [("shared", k), ("independent", k)]
    runs = []
    for round_ in range(args.repeat):
        for n, (kind, k) in enumerate(cases):
            runs.append(await run_case(host, server_pid, kind, k, round_=round_, n=n,
                                       messages=args.messages, workdir=workdir,
                                       limit=args.timeout))
    return runs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per case (default 20,000)")
    parser.add_argument("--quick", action="store_true",
                        help="3,000 messages; writes pubsub_e2e-quick.*")
    parser.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10],
                        help="watcher counts, comma-separated (default 1,10)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per case, round-robin; the median run is reported")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = 3_000
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir = Path(tempfile.mkdtemp(prefix="sharedstream-pubsub-e2e-"))
    load = {"start": list(os.getloadavg())}
    process, host = start_pubsub(workdir)
    try:
        _say(f"the Pub/Sub test server (pid {process.pid}) on {host}; {args.messages} "
             f"messages per case; in {workdir}")
        runs = asyncio.run(run_all(args, host, process.pid, workdir))
    finally:
        stop_pubsub(process)
        shutil.rmtree(workdir, ignore_errors=True)
    load["end"] = list(os.getloadavg())
    write_results(args.output_dir, "pubsub_e2e-quick" if args.quick else "pubsub_e2e", args,
                  runs, load)
    print_table(runs)
    bad = [f"{r.case} #{r.round}" for r in runs
           if r.events != r.expected_events or r.leftover]
    if bad:
        _say(f"error: wrong event counts or messages left in {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
