"""Service Bus end to end: messages/s from send to completed, on the kit's Service Bus test server.

Starts the testing kit's Service Bus test server as its own process on a free
loopback port (``python -m sharedstream.testing.servicebus``, through
``sharedstream.testing.brokers.servicebus``; it needs the ``servicebus``
extra), with every case's entities created at start (the server takes them
from an entities document only). For each case, on entities of its own:
sends N JSON messages ``{"id": i, "bucket": i % 10, ...}`` (``send_messages``,
500 a call), then times from the consumers' start until every message is
completed. Every client is the real ``azure.servicebus.aio`` SDK, in
peek-lock mode, ``max_message_count`` 100 a receive, no prefetch, no
keep-alive pinger (closing a receiver that has one waits for it).

* ``raw`` - the SDK's own loop, what a user writes first: one queue
  receiver, ``receive_messages``, then ``complete_message`` for each message
  in turn; nothing decoded or stored. (Completing a receive's messages
  concurrently with ``asyncio.gather`` was 3.5x *slower* on this server:
  426 against 1,488 msgs/s, 3,000 messages.)
* ``shared K`` - sharedstream: the in-process :class:`Triggerer` on a
  definitions file with K ``ServiceBusSharedStreamTrigger`` watchers on one
  queue (one receiver for all), watcher j matching ``bucket == j % 10`` (a
  label keeps watchers with equal filters distinct), every event stored in
  SQLite by the persistence gate before its message is completed (the
  producer's own completions).
* ``independent K`` - what users run today: a topic with K subscriptions
  (each gets every message), each read by its own client and receiver,
  decoding JSON, keeping 1 in 10, storing them in SQLite (own connection,
  WAL, ``synchronous=FULL``, a transaction per receive) and then completing
  each message.

**When is a case done?** The server runs as a separate process, so its
state is out of reach, and the SDK has no message count without the
management REST API (which the test server does not serve). So each
consumer counts its own completions - a ``complete_message`` that returned,
which the SDK does only once the server echoed the settlement: the raw and
independent loops count them as they return, the shared case counts the
producer's completions that did not raise (the generated definitions
subclass the producer to count them). The clock stops when every queue or
subscription has N. Then the consumers stop, and a fresh receiver peeks
each entity and its dead-letter sub-queue (a peek sees locked messages
too): anything there fails the case.

``--repeat R`` runs the whole case list R times, round-robin, and reports
the run with the median msgs/s per case, plus the same-round ratios
``shared 10 / raw`` (target >= 0.8) and ``shared 10 / independent 10``
(target >= 3), each with MET / NOT MET (the median of the rounds' ratios);
reported, never asserted. Writes ``benchmarks/results/servicebus_e2e.{json,csv,png}``
(``servicebus_e2e-quick.*`` with ``--quick``).

**Backends** (``--backend``): the kit's test server always (the default
``auto``), then Microsoft's official Service Bus emulator in containers
(``sharedstream.testing.brokers.servicebus_emulator_container``: the
emulator and the SQL Server it needs, on a network of their own; Docker and
the ``testcontainers`` package) when a Docker engine answers - when none
does, that run is skipped with a line saying why. ``server`` or
``emulator`` runs one of them only (the latter fails without Docker). The
emulator's results go to ``servicebus_e2e-emulator.*``; it takes at most 50
entities, five per round with the default K = 1, 10 (so ``--repeat`` up to
10), refused before any container starts otherwise.

**A real network's round trip** (``--rtt MS``, the kit's server only:
``--backend server``; refused otherwise): every client of every case - the
senders, the raw and independent receivers, the shared case's triggerer -
reaches the server through the testing kit's latency proxy, started as a
process of its own (``python -m sharedstream.testing.latency_proxy``, so its
work is not on the benchmark's GIL) with MS ms round trip, give or take
MS/20 per chunk each way (seed 0). Only the final peek goes to the server
directly. Results go to ``servicebus_e2e-rtt<MS>.*`` (``--rtt 0``: the
same cases on loopback, no proxy, named for comparison); the JSON's
``about`` records the round trip, the jitter and the proxy's CPU seconds.
Without ``--rtt``, loopback as before, into ``servicebus_e2e.*``.

Usage: ``python benchmarks/servicebus_e2e.py [--messages N] [--quick] [--ks 1,10]
[--repeat R] [--backend auto|server|emulator] [--rtt MS] [--output-dir D]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
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
    stored_rows,
    wait_acked,
    write_definitions,
)
from _e2e import say as _say
from _e2e_rounds import CaseResult, Chart, parse_args, report, run_backends, run_rounds

from sharedstream.testing.brokers.containers import (
    SERVICEBUS_EMULATOR_IMAGE,
    servicebus_emulator_container,
)
from sharedstream.testing.brokers.servicebus import start_servicebus, stop_servicebus

SEND_BATCH, SEND_IN_FLIGHT = 500, 4
MAX_MESSAGES = 100  # per receive call, every consumer: the shared trigger's default
MAX_WAIT = 5.0  # seconds a receive waits for a first message: the shared trigger's default
LOCK_DURATION = 60
TARGETS: dict[str, float | None] = {"shared 10 / raw": 0.8, "shared 10 / independent 10": 3.0}
"""Same-round ratios reported, with the least one issue 15 asks for."""

Handler = Callable[[Sequence[tuple[str, int, int, bytes]]], Awaitable[None]]


def _sdk(name: str) -> Any:
    return importlib.import_module(name)


# -- entities, sending, what is left ----------------------------------------------------------


def case_names(kind: str, k: int, round_: int, n: int) -> tuple[str, list[str]]:
    """The case's entity (a queue; a topic for ``independent``) and what its consumers read."""
    name = f"e2e-{round_}-{n}-{kind}-{k}"
    if kind == "independent":
        return name, [f"{name}/Subscriptions/c{j}" for j in range(k)]
    return name, [name]


def entities_document(cases: list[tuple[str, int]], repeat: int) -> dict[str, Any]:
    """Every case's queue, or topic and K subscriptions, for every round (created at start)."""
    queues, topics = [], []
    for round_ in range(repeat):
        for n, (kind, k) in enumerate(cases):
            name, _ = case_names(kind, k, round_, n)
            if kind == "independent":
                topics.append({"name": name, "subscriptions": [
                    {"name": f"c{j}", "lock_duration": LOCK_DURATION} for j in range(k)]})
            else:
                queues.append({"name": name, "lock_duration": LOCK_DURATION})
    return {"queues": queues, "topics": topics}


def client(connection_string: str) -> Any:
    """A ``ServiceBusClient`` (aio) of its own: one AMQP connection."""
    return _sdk("azure.servicebus.aio").ServiceBusClient.from_connection_string(
        connection_string)


def receiver_of(sb: Any, source: str, **kwargs: Any) -> Any:
    """A peek-lock receiver of a queue or ``topic/Subscriptions/name``, without keep-alive."""
    topic, _, subscription = source.partition("/Subscriptions/")
    options = {"prefetch_count": 0, "keep_alive": None, **kwargs}
    if subscription:
        return sb.get_subscription_receiver(topic_name=topic, subscription_name=subscription,
                                            **options)
    return sb.get_queue_receiver(queue_name=topic, **options)


async def send(connection_string: str, entity: str, messages: int, *, topic: bool) -> None:
    """N messages to a queue or topic, :data:`SEND_BATCH` a call, a few calls in flight."""
    message_type = _sdk("azure.servicebus").ServiceBusMessage
    chunks = iter(range(0, messages, SEND_BATCH))

    async def sender(sb: Any) -> None:
        out = (sb.get_topic_sender(topic_name=entity, keep_alive=None) if topic
               else sb.get_queue_sender(queue_name=entity, keep_alive=None))
        async with out:
            for start in chunks:  # one iterator shared by every sender: each chunk goes once
                await out.send_messages([
                    message_type(message_body(i), content_type="application/json")
                    for i in range(start, min(start + SEND_BATCH, messages))])

    async with client(connection_string) as sb, asyncio.TaskGroup() as tasks:
        for n in range(SEND_IN_FLIGHT):
            tasks.create_task(sender(sb), name=f"servicebus-e2e-sender-{n}")


async def leftover(connection_string: str, source: str) -> int:
    """Messages a peek still sees on ``source`` and its dead-letter sub-queue (locked or not)."""
    sub_queue = _sdk("azure.servicebus").ServiceBusSubQueue.DEAD_LETTER
    left = 0
    async with client(connection_string) as sb:
        for options in ({}, {"sub_queue": sub_queue}):
            async with receiver_of(sb, source, **options) as peeker:
                left += len(await peeker.peek_messages(max_message_count=1_000,
                                                       sequence_number=0))
    return left


# -- raw and independent: receive, (store,) complete each -------------------------------------


async def receive_loop(connection_string: str, source: str, handle: Handler | None,
                       stop: asyncio.Event) -> None:
    """Receive, ``handle`` the batch (if given), complete each message in turn, until ``stop``.

    A message counts in :data:`ACKED` once its ``complete_message`` returned
    (the server echoed the settlement). On ``stop`` the receive in progress
    ends within :data:`MAX_WAIT`; what it got is completed first.
    """
    async with client(connection_string) as sb, receiver_of(sb, source) as receiver:
        while not stop.is_set():
            received = await receiver.receive_messages(max_message_count=MAX_MESSAGES,
                                                       max_wait_time=MAX_WAIT)
            if handle is not None and received:
                await handle([(source, 0, m.sequence_number, b"".join(m.body))
                              for m in received])
            for message in received:
                await receiver.complete_message(message)
                ACKED[source] += 1


async def run_receivers(connection_string: str, sources: list[str],
                        handlers: list[Handler | None], messages: int, *, label: str,
                        limit: float) -> Progress:
    """One :func:`receive_loop` per source until each counts N completions."""
    stop = asyncio.Event()
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tasks:
        consumers = [tasks.create_task(receive_loop(connection_string, s, h, stop),
                                       name=f"servicebus-e2e-consumer-{s}")
                     for s, h in zip(sources, handlers, strict=True)]
        try:
            progress = await wait_acked(sources, messages, started=started, limit=limit,
                                        label=label, ended=asyncio.gather(*consumers))
        finally:
            stop.set()
    return progress


# -- shared ---------------------------------------------------------------------------------


DEFINITIONS_HEADER = """\
from _e2e import ACKED, LabelledWatcher

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.producers.servicebus import ServiceBusSharedStreamProducer
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger


class CountingProducer(ServiceBusSharedStreamProducer):
    \"\"\"The Service Bus producer, counting the completions that did not raise.\"\"\"

    async def _settle_each(self, operation, payloads, settle, **options):
        failed = await super()._settle_each(operation, payloads, settle, **options)
        if operation == "Complete":
            ACKED[self.entity] += len(payloads) - len(failed)
        return failed


class BenchWatcher(LabelledWatcher, ServiceBusSharedStreamTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return CountingProducer(cls._settings_from(kwargs))

"""


async def run_shared(connection_string: str, queue: str, messages: int, *, k: int,
                     casedir: Path, limit: float) -> tuple[Progress, int]:
    """The in-process triggerer until N completions; returns the progress and events stored."""
    definitions = casedir / "bench_definitions.py"
    write_definitions(definitions, DEFINITIONS_HEADER, {
        "connection_string": connection_string, "queue": queue, "max_messages": MAX_MESSAGES,
        "max_wait_time": MAX_WAIT, "lock_duration": LOCK_DURATION, "payload_format": "json",
    }, k)
    return await run_triggerer(definitions, [queue], messages, label=f"shared {k}",
                               limit=limit)


# -- a case ---------------------------------------------------------------------------------


async def run_case(connection_string: str, server_pid: int | None, kind: str, k: int, *,
                   round_: int, n: int, messages: int, workdir: Path, limit: float,
                   checker: str | None = None) -> CaseResult:
    """One case on its own entities: send, consume until N completions each, check none left.

    Every client of the case uses ``connection_string``; the final peek uses
    ``checker`` (the server directly, when the clients go through a proxy)
    if given.
    """
    label = "raw" if kind == "raw" else f"{kind} {k}"
    entity, sources = case_names(kind, k, round_, n)
    await send(connection_string, entity, messages, topic=kind == "independent")
    _say(f"{label}: {messages} messages on {len(sources)} queue/subscription(s) of {entity}")
    cpu0, server0 = time.process_time(), cpu_seconds(server_pid)
    events = expected = 0
    if kind == "raw":
        progress = await run_receivers(connection_string, sources, [None], messages,
                                       label=label, limit=limit)
    elif kind == "shared":
        casedir = workdir / entity
        casedir.mkdir()
        progress, events = await run_shared(connection_string, entity, messages, k=k,
                                            casedir=casedir, limit=limit)
        expected = expected_events(messages, k)
    else:
        with independent_stores(workdir / f"{entity}.db", k) as stores:
            progress = await run_receivers(connection_string, sources,
                                           [s.handle for s in stores], messages, label=label,
                                           limit=limit)
        events, expected = stored_rows(workdir / f"{entity}.db"), expected_events(messages, k)
    cpu, server1 = time.process_time() - cpu0, cpu_seconds(server_pid)
    left = sum([await leftover(checker or connection_string, s) for s in sources])
    result = CaseResult(label, k, messages, round_, max(progress.done_at.values()),
                        progress.first_ack_at, events, expected, left, cpu,
                        None if server0 is None or server1 is None else server1 - server0)
    _say(f"{label}: {result.per_s:,.0f} msgs/s ({result.seconds:.2f}s), "
         f"{events}/{expected} events stored, {left} left for a final peek")
    return result


# -- main -----------------------------------------------------------------------------------


def case_list(ks: list[int]) -> list[tuple[str, int]]:
    cases = [("raw", 1)]
    for k in ks:
        cases += [("shared", k), ("independent", k)]
    return cases


def _backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("auto", "server", "emulator"), default="auto",
                        help="auto (default): the kit's test server, then the official "
                        "emulator in containers when a Docker engine answers")
    parser.add_argument("--rtt", type=int, default=None, metavar="MS",
                        help="every client reaches the kit's test server through a latency "
                        "proxy process with this round trip, in ms (--backend server only); "
                        "writes servicebus_e2e-rtt<MS>.*")


PROXY_START = 10.0
"""Seconds the latency proxy may take to say where it listens."""


def jitter_ms(rtt: int) -> float:
    """The proxy's jitter for a round trip of ``rtt`` ms: a twentieth of it, each way."""
    return rtt / 20


@contextlib.contextmanager
def proxy_process(server_port: int, rtt: int) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """The latency proxy as its own process in front of ``127.0.0.1:server_port``.

    Yields the port it listens on and the process; on leaving, SIGTERM and
    a wait (a kill after 10 s). Raises ``RuntimeError`` if it does not say
    where it listens within :data:`PROXY_START` seconds.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "sharedstream.testing.latency_proxy",
         f"127.0.0.1:{server_port}", "--rtt-ms", str(rtt), "--jitter-ms",
         f"{jitter_ms(rtt):g}", "--seed", "0"],
        stdout=subprocess.PIPE, text=True)
    try:
        stdout = process.stdout
        if stdout is None:
            raise RuntimeError("the latency proxy's stdout is not a pipe")
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(PROXY_START)
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", line[0] if line else "")
        if found is None:
            raise RuntimeError(f"the latency proxy did not start: {line[0] if line else ''!r}")
        yield int(found[1]), process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def run_backend(args: argparse.Namespace, backend: str, workdir: Path) -> list[CaseResult]:
    """Every case on ``backend`` (``server`` or ``emulator``), ``--repeat`` rounds."""
    entities = entities_document(case_list(args.ks), args.repeat)
    with contextlib.ExitStack() as stack:
        checker: str | None = None
        if backend == "server":
            process, connection_string = start_servicebus(workdir, entities=entities)
            stack.callback(stop_servicebus, process)
            server_pid: int | None = process.pid
            _say(f"the Service Bus test server (pid {process.pid}); {args.messages} messages "
                 f"per case; in {workdir}")
            if args.rtt:
                server_port = int(connection_string.split("sb://127.0.0.1:")[1].split(";")[0])
                port, proxy = stack.enter_context(proxy_process(server_port, args.rtt))
                stack.callback(_note_proxy_cpu, args, proxy.pid)  # runs before it stops
                checker, connection_string = connection_string, connection_string.replace(
                    f"127.0.0.1:{server_port};", f"127.0.0.1:{port};")
                _say(f"every client through the latency proxy (pid {proxy.pid}, port {port}): "
                     f"{args.rtt} ms round trip, +/- {jitter_ms(args.rtt):g} ms each way")
        else:
            connection_string = stack.enter_context(servicebus_emulator_container(entities))
            server_pid = None  # in a container: its CPU is not ours to read
            _say(f"the Service Bus emulator (containers); {args.messages} messages per case")

        async def run_one(kind: str, k: int, round_: int, n: int) -> CaseResult:
            return await run_case(connection_string, server_pid, kind, k, round_=round_, n=n,
                                  messages=args.messages, workdir=workdir, limit=args.timeout,
                                  checker=checker)

        return asyncio.run(run_rounds(case_list(args.ks), args.repeat, run_one))


def _note_proxy_cpu(args: argparse.Namespace, pid: int) -> None:
    """Keep the proxy's CPU seconds so far in ``args.proxy_cpu_s`` (for the report)."""
    args.proxy_cpu_s = cpu_seconds(pid)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, (__doc__ or "").splitlines()[0], quick_messages=2_000,
                      timeout=600.0, more=_backend_option)
    if args.rtt is not None and (args.rtt < 0 or args.backend != "server"):
        print("error: --rtt takes milliseconds >= 0 and runs on the kit's test server only "
              "(--backend server)", file=sys.stderr)
        return 2
    args.proxy_cpu_s = None
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chosen = chosen_backends(args.backend, local="server", container="emulator",
                             label="Service Bus emulator")

    def report_backend(backend: str, runs: list[CaseResult],
                       load: Mapping[str, list[float]]) -> int:
        where = ("kit's test server" if backend == "server"
                 else "the official emulator, in containers")
        stem = "servicebus_e2e" if backend == "server" else "servicebus_e2e-emulator"
        network: dict[str, Any] = {}
        if args.rtt is not None:
            stem, where = f"{stem}-rtt{args.rtt}", (
                f"{where}, {args.rtt} ms round trip" if args.rtt else f"{where}, loopback")
            network = {"rtt_ms": args.rtt, "jitter_ms": jitter_ms(args.rtt) if args.rtt else 0,
                       "proxy": "python -m sharedstream.testing.latency_proxy (own process), "
                                "between every client and the server" if args.rtt else None,
                       "proxy_cpu_s": args.proxy_cpu_s}
        return report(
            args, stem, runs,
            targets=TARGETS, chart=Chart(
                f"Service Bus end to end ({where},\n{args.messages:,} JSON messages, "
                "1 in 10 stored per watcher)", "messages/s, send -> completed", ("raw",),
                ("raw", TARGETS["shared 10 / raw"] or 0,
                 "80% of the raw loop (target for shared 10)")),
            about={"broker": "sharedstream.testing.servicebus (own process)"
                   if backend == "server" else f"{SERVICEBUS_EMULATOR_IMAGE} (containers)",
                   "max_messages": MAX_MESSAGES, "load_average": load, **network,
                   "done_when": "each consumer counted N complete_message calls that returned "
                                "(shared: the producer's completions that did not raise), then "
                                "a peek of each entity and its dead-letter sub-queue after the "
                                "consumers stopped saw nothing"})

    return run_backends(args, chosen, prefix="sharedstream-servicebus-e2e", run=run_backend,
                        report_backend=report_backend)


if __name__ == "__main__":
    sys.exit(main())
