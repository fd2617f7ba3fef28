"""Pub/Sub end to end: messages/s from publish to acknowledged, on a test server or the emulator.

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

``--diagnose`` adds, for each K, the case ``unstored K``: ``shared K`` with
the SQLite store's ``write_events`` replaced, for that case only, by a stub
that keeps nothing and reports every event stored. It is a diagnostic,
never a way to run sharedstream (messages are acked without their events
being stored): the same-round ratio ``unstored K / shared K`` shows how much
of the shared case's time waits on the store's writes. The results go to
``pubsub_e2e-diagnose.*``.

**Backends.** ``--backend auto`` (the default) runs every case on the kit's
test server, then again on Google's own emulator (``gcloud beta emulators
pubsub``, the gcloud CLI image, through the testing kit's
``pubsub_container``) when a Docker engine answers; without one that run
is skipped with one line saying why. ``--backend server`` runs the test
server alone, ``--backend emulator`` the emulator alone (exit status 2
without Docker). The emulator's results go to ``pubsub_e2e-emulator.*``
(``pubsub_e2e-diagnose-emulator.*``); its CPU is not read (a container).

Usage: ``python benchmarks/pubsub_e2e.py [--messages N] [--quick] [--ks 1,10]
[--repeat R] [--diagnose] [--backend auto|server|emulator] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from _e2e import (
    ACKED,
    Progress,
    chosen_backends,
    cpu_seconds,
    expected_events,
    independent_stores,
    message_body,
    run_triggerer,
    store_skipped,
    stored_rows,
    wait_acked,
    write_definitions,
)
from _e2e import say as _say
from _e2e_rounds import CaseResult, Chart, parse_args, report, run_backends, run_rounds

from sharedstream.testing.brokers.containers import PUBSUB_IMAGE, pubsub_container
from sharedstream.testing.brokers.pubsub import start_pubsub, stop_pubsub

PROJECT = "bench"
PUBLISH_BATCH, PUBLISH_IN_FLIGHT = 1_000, 4
MAX_IN_FLIGHT = 1000  # every stream's max_outstanding_messages: the shared trigger's default
ACK_DEADLINE = 60
TARGETS: dict[str, float | None] = {
    "shared 10 / client": 0.8, "shared 10 / independent 10": 3.0, "shared 10 / raw": None,
    "unstored 10 / shared 10": None, "unstored 10 / independent 10": None}
"""Same-round ratios reported; ``None``: no target (the ceiling, or the ``--diagnose``
case, for reading the others). A ratio whose cases did not run is left out."""

Handler = Callable[[Sequence[tuple[str, int, int, bytes]]], Awaitable[None]]


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
from _e2e import ACKED, LabelledWatcher

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.producers.pubsub import PubSubSharedStreamProducer
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger


class CountingProducer(PubSubSharedStreamProducer):
    \"\"\"The Pub/Sub producer, counting the ack ids of each Acknowledge that returned.\"\"\"

    async def _send_acks(self, chunk):
        retry = await super()._send_acks(chunk)
        ACKED[self.subscription] += len(chunk) - len(retry)
        return retry


class BenchWatcher(LabelledWatcher, PubSubSharedStreamTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return CountingProducer(cls._settings_from(kwargs))

"""


async def run_shared(host: str, subscription: str, messages: int, *, k: int, casedir: Path,
                     limit: float) -> tuple[Progress, int]:
    """The in-process triggerer until N acks; returns the progress and the events stored."""
    definitions = casedir / "bench_definitions.py"
    write_definitions(definitions, DEFINITIONS_HEADER, {
        "project": PROJECT, "subscription": subscription, "emulator_host": host,
        "max_in_flight": MAX_IN_FLIGHT, "ack_deadline": ACK_DEADLINE, "payload_format": "json",
    }, k)
    return await run_triggerer(definitions, [subscription], messages, label=f"shared {k}",
                               limit=limit)


# -- a case ---------------------------------------------------------------------------------


async def run_case(host: str, server_pid: int | None, kind: str, k: int, *, round_: int, n: int,
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
    elif kind in ("shared", "unstored"):
        casedir = workdir / name
        casedir.mkdir()
        with store_skipped() if kind == "unstored" else nullcontext():
            progress, events = await run_shared(host, subscriptions[0], messages, k=k,
                                                casedir=casedir, limit=limit)
        expected = expected_events(messages, k) if kind == "shared" else 0
    else:
        with independent_stores(workdir / f"{name}.db", k) as stores:
            progress = await run_streams(host, subscriptions, [s.handle for s in stores],
                                         messages, label=label, limit=limit)
        events, expected = stored_rows(workdir / f"{name}.db"), expected_events(messages, k)
    cpu, server1 = time.process_time() - cpu0, cpu_seconds(server_pid)
    left = sum([await leftover(host, s) for s in subscriptions])
    result = CaseResult(label, k, messages, round_, max(progress.done_at.values()),
                        progress.first_ack_at, events, expected, left, cpu,
                        None if server0 is None or server1 is None else server1 - server0)
    _say(f"{label}: {result.per_s:,.0f} msgs/s ({result.seconds:.2f}s), "
         f"{events}/{expected} events stored, {left} left for a final Pull")
    return result


# -- main -----------------------------------------------------------------------------------


def case_list(ks: list[int], *, diagnose: bool = False) -> list[tuple[str, int]]:
    cases = [("raw", 1), ("client", 1)]
    for k in ks:
        cases += [("shared", k), ("independent", k)]
        if diagnose:
            cases.append(("unstored", k))
    return cases


def _more_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("auto", "server", "emulator"), default="auto",
                        help="auto (default): the kit's test server, then Google's emulator "
                        "(the gcloud CLI image) in a container when a Docker engine answers")
    parser.add_argument("--diagnose", action="store_true",
                        help="add 'unstored K' (shared K with the store's writes stubbed out; "
                             "a diagnostic); writes pubsub_e2e-diagnose.*")


def run_backend(args: argparse.Namespace, backend: str, workdir: Path) -> list[CaseResult]:
    """Every case on ``backend`` (``server`` or ``emulator``), ``--repeat`` rounds."""
    with contextlib.ExitStack() as stack:
        if backend == "server":
            process, host = start_pubsub(workdir)
            stack.callback(stop_pubsub, process)
            server_pid: int | None = process.pid
            _say(f"the Pub/Sub test server (pid {process.pid}) on {host}; {args.messages} "
                 f"messages per case; in {workdir}")
        else:
            host = stack.enter_context(pubsub_container(project=PROJECT))
            server_pid = None  # in a container: its CPU is not ours to read
            _say(f"Google's Pub/Sub emulator ({PUBSUB_IMAGE}) on {host}; {args.messages} "
                 f"messages per case; in {workdir}")

        async def run_one(kind: str, k: int, round_: int, n: int) -> CaseResult:
            return await run_case(host, server_pid, kind, k, round_=round_, n=n,
                                  messages=args.messages, workdir=workdir, limit=args.timeout)

        return asyncio.run(run_rounds(case_list(args.ks, diagnose=args.diagnose), args.repeat,
                                      run_one))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, (__doc__ or "").splitlines()[0], quick_messages=3_000,
                      more=_more_args)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chosen = chosen_backends(args.backend, local="server", container="emulator",
                             label="Pub/Sub emulator")

    def report_backend(backend: str, runs: list[CaseResult],
                       load: Mapping[str, list[float]]) -> int:
        name = "pubsub_e2e-diagnose" if args.diagnose else "pubsub_e2e"
        where = "kit's test server" if backend == "server" else "Google's emulator"
        return report(
            args, name if backend == "server" else f"{name}-emulator", runs, targets=TARGETS,
            chart=Chart(
                f"Pub/Sub end to end ({where}, {args.messages:,} JSON messages, "
                "1 in 10 stored per watcher)", "messages/s, publish -> acked", ("raw", "client"),
                ("client", TARGETS["shared 10 / client"] or 0,
                 "80% of the client loop (target for shared 10)")),
            about={"broker": "sharedstream.testing.pubsub (own process)"
                   if backend == "server" else f"{PUBSUB_IMAGE} (a container)",
                   "max_in_flight": MAX_IN_FLIGHT, "load_average": load,
                   "done_when": "each consumer counted N acks (raw/independent: ack ids written on "
                                "the stream; client: message.ack() calls; shared: ack ids of "
                                "Acknowledge calls that returned), then a final "
                                "Pull(return_immediately) after the consumers stopped got nothing"})

    return run_backends(args, chosen, prefix="sharedstream-pubsub-e2e", run=run_backend,
                        report_backend=report_backend)


if __name__ == "__main__":
    sys.exit(main())
