"""Dispatching to Apache Airflow: runs/s against the bare POST loop, and message -> run latency.

One Airflow 3 (the testing kit's :class:`~sharedstream.testing.airflow.AirflowServer`:
API server, scheduler, DAG processor) on a throwaway PostgreSQL cluster
(``--airflow-db postgres``, the default: an SQLite Airflow dies on bursts of
about 100 creations) or on the kit's SQLite (``--airflow-db sqlite``). One DAG
file defines every Airflow DAG the run uses; all are parsed before the first
measurement.

**Throughput**, ``--rounds`` rounds (the order of the two cases alternates each
round), for each ``--concurrency`` C, N runs (``--runs``) per case, each case
of each round on an Airflow DAG of its own, paused (``PATCH /api/v2/dags/{id}``)
so that Airflow does not execute hundreds of tasks during the measurement:

* ``ours C`` - N runs queued in a fresh SQLite store (N stored events of one
  asset, each making one run of one DAG, before the clock starts), then a real
  :class:`~sharedstream.dispatch.Dispatcher` (default settings but ``--claim-ahead``) with the real
  ``airflow`` target at ``max_concurrency`` C, until the store holds all N
  ``dispatched``: claims, deliveries and the store's records of them, sign-in
  included.
* ``bare C`` - the same N ``POST /api/v2/dags/{id}/dagRuns`` straight from one
  aiohttp session, C at a time (a semaphore), with a token from ``/auth/token``
  (fetched inside the timing too), the body :func:`dag_run_body` of an
  equivalent run document (the conf is as large), until all N answered 200.

The rate is N / seconds; ``ours C / bare C`` is the ratio of the same round,
reported per round and as the median (target: at least 0.9). After each case
Airflow must hold exactly N runs of its DAG, of N distinct ids. The store calls
of ``ours`` are timed by the ``db`` function the dispatcher is given (no code of
the dispatcher changes) and each bare POST is timed, to say where the time went.

**Latency**, at ``--rate`` messages/s for ``--seconds``: Tansu, one topic, and
a ``sharedstream triggerer`` process (the CLI) on a definitions file with one
Kafka watcher feeding an asset whose DAG has ``target="airflow"``
(``[targets.airflow]``, its connection in ``AIRFLOW_CONN_AIRFLOW_BENCH``),
sending to an unpaused Airflow DAG whose one task does nothing. Each message
carries ``time.time()`` at its send; a warm-up message goes first and the
clock starts only once its Airflow run exists (the group has formed). Latency
per message: the Airflow run's ``queued_at`` (set when the API creates it)
less the send time; our side's split from the store: ``created_at`` (stored)
and ``dispatched_at`` (recorded). Target: p50 under 1 s.

Writes ``benchmarks/results/dispatch.{json,csv,png}`` (``dispatch-quick.*``
with ``--quick``, ``-sqlite`` with an SQLite Airflow); exits 1 if a run was
lost or made twice.

Usage: ``python benchmarks/dispatch.py [--runs 300] [--rounds 3]
[--concurrency 1,4] [--rate 5] [--seconds 30] [--airflow-db postgres|sqlite]
[--quick] [--output-dir D]``
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
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from _e2e import cpu_seconds, message_body, say
from _e2e_rounds import CaseResult, median_runs, verdicts
from _triggerer_config import BENCH_ENVIRONMENT
from kafka_e2e import OVERRIDES, create_topic
from scale_out import machine_ticks

from sharedstream.connections import parse_connection_uri
from sharedstream.dispatch._airflow_api import airflow_run_id, dag_run_body, dag_run_path
from sharedstream.dispatch.airflow import AirflowTarget
from sharedstream.dispatch.dispatcher import Dispatcher, DispatchSettings, Route
from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import Delivery, TargetContext, check_options
from sharedstream.runtime.serde import pack_event_payload, unpack_event_payload
from sharedstream.store import DagSpec, PendingEvent, SqliteStore, TriggerSpec, WatcherSpec
from sharedstream.testing.airflow import AirflowServer, postgres_metadata
from sharedstream.testing.brokers import tansu_broker
from sharedstream.testing.brokers.postgres import fresh_database, postgres_server
from sharedstream.testing.triggerers import TriggererCluster

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RATIO = 0.9
TARGET_P50 = 1.0
ASSET, TOPIC = "orders", "bench.dispatch"
OUR_DAG = "ship"  # our DAG in the throughput stores; Airflow's are per case and round
LATENCY_DAG = "ss_bench_latency"  # ours and Airflow's: the same id
WARMUP_DAGS = ("ss_bench_warmup_bare", "ss_bench_warmup_ours")

DAG_FILE = '''
from airflow.sdk import dag, task

for dag_id in {dag_ids!r}:
    @dag(dag_id=dag_id, schedule=None, catchup=False)
    def bench():
        @task
        def nothing():
            pass

        nothing()

    bench()
'''

DEFINITIONS = '''
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

orders = Asset({asset!r}, watchers=[AssetWatcher("kafka", trigger=KafkaSharedStreamTrigger(
    bootstrap_servers={bootstrap!r}, topics=[{topic!r}], group_id="bench-dispatch",
    payload_format="json", consumer_overrides={overrides!r}))])
Dag({dag!r}, schedule=orders, target="airflow")
'''

TARGET_TABLE = '''
[targets.airflow]
type = "airflow"
conn_id = "airflow_bench"
max_concurrency = {concurrency}
'''


def case_dag(case: str, concurrency: int, round_no: int) -> str:
    """The Airflow DAG of one case of one round."""
    return f"ss_bench_{case}_c{concurrency}_r{round_no}"


def kafka_payload(index: int, value: dict[str, Any]) -> dict[str, Any]:
    """An event payload as the Kafka trigger stores one (its message's value, topic, offset...)."""
    return {"value": value, "topic": TOPIC, "partition": 0, "offset": index, "key": None,
            "headers": [], "timestamp": int(time.time() * 1000)}


# -- Airflow ---------------------------------------------------------------------------------


@contextlib.contextmanager
def bench_airflow(database: str, dags: Path) -> Iterator[AirflowServer]:
    """The kit's Airflow on ``dags`` with its metadata in PostgreSQL or SQLite, for the block."""
    if database == "sqlite":
        with AirflowServer(dags) as server:
            yield server
        return
    with postgres_server(durable=True) as admin, fresh_database(admin, prefix="airflow") as url:
        extra, environment = postgres_metadata(url)
        with AirflowServer(dags, extra=extra, environment=environment) as server:
            yield server


def prepare_dags(server: AirflowServer, paused: Sequence[str], unpaused: Sequence[str]) -> None:
    """Write the one DAG file, wait until Airflow parsed every DAG, pause ``paused``."""
    (server.dags_folder / "sharedstream_bench.py").write_text(
        DAG_FILE.format(dag_ids=[*paused, *unpaused]))
    for dag_id in [*paused, *unpaused]:
        server.wait_for_dag(dag_id, timeout=120)
    for dag_id in paused:
        status, answer = server.request("PATCH", f"/api/v2/dags/{quote(dag_id, safe='')}",
                                        {"is_paused": True})
        if status != 200 or not answer.get("is_paused"):
            raise RuntimeError(f"could not pause {dag_id}: HTTP {status} {answer}")


@dataclass
class AirflowRuns:
    """What Airflow holds for one DAG after a case: its runs, distinct ids, conf sizes."""

    count: int
    distinct: int
    conf_bytes: float
    runs: list[dict[str, Any]]

    @classmethod
    def read(cls, server: AirflowServer, dag_id: str) -> AirflowRuns:
        runs = server.dag_runs(dag_id)
        sizes = [len(json.dumps(run.get("conf"))) for run in runs]
        return cls(len(runs), len({run["dag_run_id"] for run in runs}),
                   statistics.fmean(sizes) if sizes else 0.0, runs)


def run_total(server: AirflowServer, dag_id: str) -> int:
    """How many runs ``dag_id`` has (one small request: ``limit=1``, ``total_entries``)."""
    status, page = server.request("GET", f"{dag_run_path(dag_id)}?limit=1")
    if status != 200:
        raise RuntimeError(f"GET runs of {dag_id}: HTTP {status} {page}")
    return int(page["total_entries"])


# -- throughput ------------------------------------------------------------------------------


@dataclass
class Meter:
    """The benchmark process's CPU and the machine's busy share between start and stop."""

    marks: tuple[float, int, int] = (0.0, 0, 0)

    def start(self) -> None:
        self.marks = (time.process_time(), *machine_ticks())

    def stop(self) -> dict[str, float]:
        cpu, busy, total = self.marks
        now_busy, now_total = machine_ticks()
        return {"bench_cpu_s": round(time.process_time() - cpu, 2),
                "machine_busy": round((now_busy - busy) / max(1, now_total - total), 3)}


@dataclass
class TimedDb:
    """The dispatcher's ``db``: its database thread, timing each store call by name.

    It also notes when the store has recorded ``expect`` distinct runs
    ``dispatched`` (:attr:`recorded`: the moment the last such
    ``record_dispatch`` returned), so the case ends without polling the store.
    """

    expect: int
    thread: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="bench-dispatch-db"))
    seconds: dict[str, float] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    dispatched: set[int] = field(default_factory=set)
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    recorded_at: float = 0.0

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        def timed() -> Any:
            began = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent = time.perf_counter() - began
                self.seconds[fn.__name__] = self.seconds.get(fn.__name__, 0.0) + spent
                self.calls[fn.__name__] += 1

        answer = await asyncio.get_running_loop().run_in_executor(self.thread, timed)
        if fn.__name__ == "record_dispatch" and not self.recorded.is_set():
            self.dispatched.update(r.run for r in args[1] if r.state == "dispatched")
            if len(self.dispatched) >= self.expect:
                self.recorded_at = time.perf_counter()
                self.recorded.set()
        return answer

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: {"calls": self.calls[name], "seconds": round(self.seconds[name], 3),
                       "ms_each": round(1000 * self.seconds[name] / self.calls[name], 2)}
                for name in sorted(self.calls)}


def queued_store(path: Path, runs: int) -> SqliteStore:
    """A fresh store with ``runs`` runs of :data:`OUR_DAG` queued (one per stored event)."""
    store = SqliteStore(path)
    store.migrate()
    ids = store.sync_definitions([TriggerSpec("fp", "bench.Kafka", b"kw")],
                                 [WatcherSpec(ASSET, "kafka", "fp")],
                                 [DagSpec(OUR_DAG, {"asset": ASSET})])
    store.heartbeat("bench", "localhost", os.getpid())
    store.write_events([
        PendingEvent(ids["fp"], f"k{i}",
                     pack_event_payload(kafka_payload(i, json.loads(message_body(i)))))
        for i in range(runs)])
    return store


class TimedAirflowTarget(AirflowTarget):
    """The ``airflow`` target with each delivery's wall time kept (it changes nothing else)."""

    def __init__(self, name: str, settings: Mapping[str, Any], context: TargetContext) -> None:
        super().__init__(name, settings, context)
        self.deliveries: list[float] = []

    async def deliver(self, run: RunDocument, progress: Callable[[str], None]) -> Delivery:
        began = time.perf_counter()
        try:
            return await super().deliver(run, progress)
        finally:
            self.deliveries.append(time.perf_counter() - began)


async def run_ours(server: AirflowServer, workdir: Path, dag_id: str, *, runs: int,
                   concurrency: int, limit: float, follow_interval: float,
                   claim_ahead: int = DispatchSettings.claim_ahead,
                   ) -> tuple[float, dict[str, Any]]:
    """The dispatcher delivering N pre-queued runs; seconds until all are recorded dispatched.

    The details say where the time went: each store call's (by name), each
    delivery's (``deliver_ms``: the POST as the target makes it, sign-in
    included), and per run what the C slots spent outside a delivery
    (``between_ms``: claims, starting the attempt, recording).
    """
    path = workdir / f"{dag_id}.db"
    store = queued_store(path, runs)
    settings = check_options(AirflowTarget, {"conn_id": "airflow_bench", "dag_id": dag_id,
                                             "max_concurrency": concurrency},
                             "[targets.airflow]")
    uri = server.connection_uri()
    target = TimedAirflowTarget("airflow", settings, TargetContext(
        {}, lambda conn_id: parse_connection_uri(conn_id, uri)))
    db = TimedDb(runs)
    dispatcher = Dispatcher(triggerer_id="bench", routes={OUR_DAG: Route("airflow", target)},
                            store=store, db=db, payload_of=unpack_event_payload,
                            settings=DispatchSettings(follow_interval=follow_interval,
                                                      claim_ahead=claim_ahead))
    try:
        began = time.perf_counter()
        await dispatcher.open()
        task = asyncio.create_task(dispatcher.run(), name="bench-dispatcher")
        try:
            await asyncio.wait_for(db.recorded.wait(), limit)
            seconds = db.recorded_at - began
        finally:
            dispatcher.begin_stop()
            await asyncio.wait_for(task, 30)
        left = {state: n for (_, _, state), n in store.run_counts().items()
                if state != "dispatched"}
        deliver = statistics.fmean(target.deliveries)
        return seconds, {"store_calls": db.summary(), "not_dispatched": left,
                         "errors": dispatcher.stats["airflow"].errors,
                         "deliver_ms_p50": round(1000 * statistics.median(target.deliveries), 2),
                         "deliver_ms_mean": round(1000 * deliver, 2),
                         "deliver_ms_max": round(1000 * max(target.deliveries), 2),
                         "between_ms": round(1000 * (seconds * concurrency / runs - deliver), 2)}
    finally:
        db.thread.shutdown(wait=True)
        store.close()


def equivalent_bodies(runs: int) -> list[dict[str, Any]]:
    """The bodies ``ours`` sends for the same N runs (same document, so the same conf size)."""
    now = datetime.now(UTC)
    return [dag_run_body(RunDocument(
        dag_id=OUR_DAG, run_id=f"asset_triggered__{i + 1:012d}", run_type="asset_triggered",
        queued_at=now, logical_date=None, data_interval_start=None, data_interval_end=None,
        conf=None, trace_parent=None, attempt=1, events=(EventDocument(
            asset=ASSET, asset_event_id=i + 1, event_id=i + 1, created_at=now, trace_parent=None,
            payload=kafka_payload(i, json.loads(message_body(i)))),)))
        for i in range(runs)]


async def run_bare(server: AirflowServer, dag_id: str, runs: int,
                   concurrency: int) -> tuple[float, dict[str, Any]]:
    """The same N creations posted straight, C at a time; seconds until all answered."""
    bodies = equivalent_bodies(runs)
    statuses: Counter[int] = Counter()
    waits: list[float] = []
    began = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/auth/token", json={
                "username": server.username, "password": server.password}) as answer:
            token = (await answer.json())["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        url = server.url + dag_run_path(dag_id)
        gate = asyncio.Semaphore(concurrency)

        async def post(body: dict[str, Any]) -> None:
            async with gate:
                sent = time.perf_counter()
                async with session.post(url, json=body, headers=headers) as answer:
                    await answer.read()
                    statuses[answer.status] += 1
                waits.append(time.perf_counter() - sent)

        await asyncio.gather(*(post(body) for body in bodies))
    seconds = time.perf_counter() - began
    return seconds, {"statuses": dict(statuses),
                     "post_ms_p50": round(1000 * statistics.median(waits), 2),
                     "post_ms_mean": round(1000 * statistics.fmean(waits), 2),
                     "post_ms_max": round(1000 * max(waits), 2)}


async def throughput(server: AirflowServer, args: argparse.Namespace, workdir: Path,
                     ) -> tuple[list[CaseResult], list[dict[str, Any]]]:
    """Every round: for each C, both cases (their order alternating by round)."""
    results, details = [], []
    meter = Meter()
    # Unmeasured: a fresh API server's first requests (and our first delivery) are slow.
    await run_bare(server, WARMUP_DAGS[0], 20, 1)
    await run_ours(server, workdir, WARMUP_DAGS[1], runs=20, concurrency=1, limit=args.timeout,
                   follow_interval=args.follow_interval)
    for round_no in range(args.rounds):
        for concurrency in args.concurrency:
            cases = ("ours", "bare") if round_no % 2 == 0 else ("bare", "ours")
            for case in cases:
                dag_id = case_dag(case, concurrency, round_no)
                meter.start()
                if case == "ours":
                    seconds, detail = await run_ours(
                        server, workdir, dag_id, runs=args.runs, concurrency=concurrency,
                        limit=args.timeout, follow_interval=args.follow_interval,
                        claim_ahead=args.claim_ahead)
                else:
                    seconds, detail = await run_bare(server, dag_id, args.runs, concurrency)
                detail |= meter.stop()
                found = await asyncio.to_thread(AirflowRuns.read, server, dag_id)
                results.append(CaseResult(
                    case=f"{case} {concurrency}", k=concurrency, messages=args.runs,
                    round=round_no, seconds=seconds, first_ack_s=None, events=found.distinct,
                    expected_events=args.runs, leftover=found.count - found.distinct,
                    bench_cpu_s=detail["bench_cpu_s"], server_cpu_s=None))
                details.append({"case": case, "concurrency": concurrency, "round": round_no,
                                "dag_id": dag_id, "runs": args.runs,
                                "seconds": round(seconds, 3),
                                "runs_per_s": round(args.runs / seconds, 1),
                                "airflow_runs": found.count, "distinct_ids": found.distinct,
                                "conf_bytes": round(found.conf_bytes), **detail})
                say(f"round {round_no} {case} C={concurrency}: {args.runs / seconds:6.1f} runs/s "
                    f"({seconds:.2f} s; Airflow has {found.count} runs, {found.distinct} "
                    f"distinct; machine {detail['machine_busy']:.0%} busy)")
    return results, details


# -- latency ---------------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99 and max of ``values`` in milliseconds (None when there are none)."""
    if len(values) < 2:
        return dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "max_ms"), None)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50_ms": round(1000 * cuts[49], 1), "p90_ms": round(1000 * cuts[89], 1),
            "p99_ms": round(1000 * cuts[98], 1), "max_ms": round(1000 * max(values), 1)}


async def send_steady(bootstrap: str, count: int, rate: float, *, warmup: bool) -> None:
    """``count`` messages, one every ``1/rate`` s, each awaited; each carries its send time."""
    aiokafka: Any = importlib.import_module("aiokafka")  # untyped; the kafka extra

    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0,
                                         enable_idempotence=False)
    await producer.start()
    try:
        began = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
            value = {**json.loads(message_body(i)), "warmup": warmup, "sent_at": time.time()}
            await producer.send_and_wait(TOPIC, json.dumps(value).encode(), partition=0)
    finally:
        await producer.stop()


async def wait_runs(server: AirflowServer, count: int, limit: float, alive: Callable[[], bool],
                    ) -> None:
    """Poll (every 0.25 s) until the latency DAG has ``count`` Airflow runs."""
    deadline = time.monotonic() + limit
    while (have := await asyncio.to_thread(run_total, server, LATENCY_DAG)) < count:
        if not alive():
            raise RuntimeError("the triggerer exited")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{have} of {count} Airflow runs of {LATENCY_DAG} after "
                               f"{limit:.0f} s")
        await asyncio.sleep(0.25)


async def latency(server: AirflowServer, args: argparse.Namespace, workdir: Path,
                  concurrency: int) -> dict[str, Any]:
    """Tansu -> a triggerer process -> Airflow at a steady rate; latency per message."""
    messages = round(args.rate * args.seconds)
    casedir = workdir / "latency"
    casedir.mkdir()
    with tansu_broker(casedir) as bootstrap:
        await create_topic(bootstrap, TOPIC, 1)
        definitions = casedir / "bench_dispatch_definitions.py"
        overrides = dict(OVERRIDES)
        if args.fetch_wait_ms is not None:
            overrides["fetch_max_wait_ms"] = args.fetch_wait_ms
        definitions.write_text(DEFINITIONS.format(asset=ASSET, bootstrap=bootstrap, topic=TOPIC,
                                                  overrides=overrides, dag=LATENCY_DAG))
        cluster = TriggererCluster(casedir, "sqlite:///sharedstream.db", {
            **BENCH_ENVIRONMENT, "AIRFLOW_CONN_AIRFLOW_BENCH": server.connection_uri()})
        with cluster.config.open("a") as config:
            config.write(TARGET_TABLE.format(concurrency=concurrency))
        try:
            process = cluster.start(0, definitions, log_level="WARNING")

            def alive() -> bool:
                return process.poll() is None

            began = time.monotonic()
            await send_steady(bootstrap, 1, 1.0, warmup=True)
            await wait_runs(server, 1, 90, alive)
            say(f"latency: the warm-up run reached Airflow {time.monotonic() - began:.1f} s after "
                "the triggerer started")
            # The first task a fresh Airflow runs stalls its API server for about 2 s.
            await asyncio.to_thread(server.wait_for_runs, LATENCY_DAG, 1, timeout=90)
            say(f"latency: the warm-up run succeeded; now {messages} messages at "
                f"{args.rate:g}/s")
            cpu_before, meter = cpu_seconds(process.pid) or 0.0, Meter()
            meter.start()
            await send_steady(bootstrap, messages, args.rate, warmup=False)
            await wait_runs(server, 1 + messages, args.timeout, alive)
            machine = meter.stop()
            triggerer_cpu = (cpu_seconds(process.pid) or 0.0) - cpu_before
            process.send_signal(signal.SIGTERM)
            exit_code = process.wait(timeout=60)
        finally:
            cluster.close()
    found = AirflowRuns.read(server, LATENCY_DAG)
    with SqliteStore(casedir / "sharedstream.db") as store:
        ours = {airflow_run_id(row.run_id): row
                for row in store.list_runs(dag_id=LATENCY_DAG, limit=100_000)}
    return latency_report(found, ours, messages) | {
        "messages": messages, "rate": args.rate, "seconds": args.seconds,
        "max_concurrency": concurrency, "triggerer_exit": exit_code,
        "triggerer_cpu_s": round(triggerer_cpu, 2), "machine_busy": machine["machine_busy"]}


SPLIT = ("send_to_airflow", "send_to_stored", "stored_to_airflow", "airflow_to_recorded")
"""The latency's parts: the whole, then ours (broker + store), the dispatch, the record."""


def latency_report(found: AirflowRuns, ours: dict[str, Any], messages: int) -> dict[str, Any]:
    """Per message: send -> Airflow run created, and our split; the checks on the runs.

    ``timeline`` has, per message in send order, seconds since the first send:
    sent, stored (the run's ``created_at``), created in Airflow (``queued_at``)
    and recorded ``dispatched`` here (``dispatched_at``).
    """
    timeline: list[dict[str, Any]] = []
    seen: Counter[int] = Counter()
    for run in found.runs:
        value = run["conf"]["sharedstream"]["events"][0]["payload"]["value"]
        if value["warmup"]:
            continue
        seen[value["id"]] += 1
        row = ours.get(run["dag_run_id"])
        timeline.append({
            "id": value["id"], "sent": float(value["sent_at"]),
            "stored": None if row is None else row.created_at.timestamp(),
            "airflow": datetime.fromisoformat(run["queued_at"]).timestamp(),
            "recorded": None if row is None or row.dispatched_at is None
            else row.dispatched_at.timestamp()})
    timeline.sort(key=lambda t: t["sent"])
    start = timeline[0]["sent"] if timeline else 0.0
    parts: dict[str, list[float]] = {name: [] for name in SPLIT}
    for t in timeline:
        parts["send_to_airflow"].append(t["airflow"] - t["sent"])
        if t["stored"] is not None and t["recorded"] is not None:
            parts["send_to_stored"].append(t["stored"] - t["sent"])
            parts["stored_to_airflow"].append(t["airflow"] - t["stored"])
            parts["airflow_to_recorded"].append(t["recorded"] - t["airflow"])
        for key in ("sent", "stored", "airflow", "recorded"):
            t[key] = None if t[key] is None else round(t[key] - start, 4)
    return {**{name: percentiles(values) for name, values in parts.items()},
            "latencies_s": [round(v, 4) for v in parts["send_to_airflow"]],
            "timeline": timeline, "airflow_runs": found.count, "distinct_ids": found.distinct,
            "messages_seen": len(seen), "messages_twice": sum(1 for n in seen.values() if n > 1),
            "ok": found.count == messages + 1 and found.distinct == found.count
            and len(seen) == messages and max(seen.values(), default=1) == 1}


# -- report ----------------------------------------------------------------------------------


def ratio_targets(concurrencies: Sequence[int]) -> dict[str, float | None]:
    return {f"ours {c} / bare {c}": TARGET_RATIO for c in concurrencies}


def plot(path: Path, results: list[CaseResult], concurrencies: Sequence[int],
         lat: dict[str, Any]) -> None:
    """Left: runs/s of both cases per C (medians, round ranges); right: the latencies' CDF."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    medians = {r.case: r.per_s for r in median_runs(results)}
    for offset, case, colour in ((-0.2, "ours", "C0"), (0.2, "bare", "C7")):
        xs = [n + offset for n in range(len(concurrencies))]
        values = [medians[f"{case} {c}"] for c in concurrencies]
        spread = [[r.per_s for r in results if r.case == f"{case} {c}"] for c in concurrencies]
        bars = left.bar(xs, values, 0.4, color=colour, label=case, yerr=[
            [v - min(s) for v, s in zip(values, spread, strict=True)],
            [max(s) - v for v, s in zip(values, spread, strict=True)]], capsize=4)
        left.bar_label(bars, fmt="{:,.0f}", fontsize="small", padding=6)
    left.set_xticks(range(len(concurrencies)), [f"C = {c}" for c in concurrencies])
    left.set_ylabel("Airflow runs created / s (median; bars: round range)")
    left.set_title(f"{results[0].messages} runs per case: dispatcher vs bare POST loop")
    left.legend(fontsize="small")
    values = sorted(1000 * v for v in lat["latencies_s"])
    right.plot(values, [(n + 1) / len(values) for n in range(len(values))], color="C0")
    for key, style in (("p50_ms", "--"), ("p99_ms", ":")):
        right.axvline(lat["send_to_airflow"][key], color="grey", linestyle=style,
                      label=f"{key[:3]} {lat['send_to_airflow'][key]:.0f} ms")
    right.axvline(1000 * TARGET_P50, color="C3", linewidth=1, label="target p50")
    right.set_xlabel("message sent -> Airflow run created (ms)")
    right.set_ylabel("share of messages")
    right.set_title(f"{lat['messages']} messages at {lat['rate']:g}/s (Kafka, one triggerer)")
    right.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(args: argparse.Namespace, stem: str, results: list[CaseResult],
                  details: list[dict[str, Any]], lat: dict[str, Any]) -> None:
    """``<stem>.json`` (everything), ``.csv`` (a row per case and round, then latency) and png."""
    ratios = verdicts(results, ratio_targets(args.concurrency))
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.platform(),
        "cpus": os.cpu_count(), "airflow": "3.3.2", "airflow_db": args.airflow_db,
        "runs": args.runs, "rounds": args.rounds, "concurrency": args.concurrency,
        "follow_interval": args.follow_interval, "fetch_wait_ms": args.fetch_wait_ms,
        "claim_ahead": args.claim_ahead,
        "medians": [{"case": r.case, "runs_per_s": round(r.per_s, 1), "round": r.round}
                    for r in median_runs(results)],
        "ratios": ratios, "cases": details, "latency": lat}, indent=2) + "\n")
    fields = ["part", "case", "concurrency", "round", "runs", "seconds", "runs_per_s",
              "p50_ms", "p90_ms", "p99_ms", "max_ms"]
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({"part": "throughput", **d} for d in details)
        writer.writerows({"part": f"latency {part}", "case": "ours",
                          "concurrency": lat["max_concurrency"], "runs": lat["messages"],
                          "seconds": lat["seconds"], **lat[part]} for part in SPLIT)
    plot(out / f"{stem}.png", results, args.concurrency, lat)
    print("| case | runs/s (median) | rounds |")
    print("|---|--:|---|")
    for c in args.concurrency:
        for case in ("ours", "bare"):
            rates = [f"{r.per_s:.1f}" for r in results if r.case == f"{case} {c}"]
            median = next(r.per_s for r in median_runs(results) if r.case == f"{case} {c}")
            print(f"| {case} {c} | {median:.1f} | {', '.join(rates)} |")
    for name, verdict in ratios.items():
        print(f"{name}: {verdict['median']:.2f} (rounds {verdict['rounds']}; target "
              f"{verdict['target']}) -> {verdict['verdict']}")
    for part in SPLIT:
        print(f"latency {part}: " + ", ".join(f"{k} {v}" for k, v in lat[part].items()))


def _ints(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs per case (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--concurrency", type=_ints, default=[1, 4],
                        help="deliveries at once, comma-separated (default 1,4)")
    parser.add_argument("--rate", type=float, default=5.0, help="latency: messages/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="latency: for how long")
    parser.add_argument("--fetch-wait-ms", type=int, default=None,
                        help="latency: the Kafka consumer's fetch_max_wait_ms (default: the "
                        "client's, 500; Tansu answers a fetch only when that wait ends)")
    parser.add_argument("--airflow-db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--follow-interval", type=float, default=5.0,
                        help="ours: the dispatcher's follow_interval (default 5, [dispatch]'s; "
                        "a large value leaves out asking Airflow about the runs it has)")
    parser.add_argument("--claim-ahead", type=int, default=DispatchSettings.claim_ahead,
                        help="ours: the dispatcher's claim_ahead (default: [dispatch]'s, "
                        f"{DispatchSettings.claim_ahead})")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--quick", action="store_true",
                        help="30 runs, 1 round, C = 1; 5 s of latency; writes dispatch-quick.*")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="dispatch",
                        help="stem of the result files (default dispatch; -sqlite and -quick "
                        "are added)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.rounds, args.concurrency, args.rate, args.seconds = 30, 1, [1], 5.0, 5.0
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stem = args.name + ("-sqlite" if args.airflow_db == "sqlite" else "") + (
        "-quick" if args.quick else "")
    paused = [*WARMUP_DAGS, *(case_dag(case, c, r) for r in range(args.rounds)
                              for c in args.concurrency for case in ("ours", "bare"))]
    workdir = Path(tempfile.mkdtemp(prefix="sharedstream-bench-dispatch-"))
    began = time.monotonic()
    try:
        (workdir / "dags").mkdir()
        with bench_airflow(args.airflow_db, workdir / "dags") as server:
            say(f"Airflow on {server.url} ({args.airflow_db}) up after "
                f"{time.monotonic() - began:.0f} s; parsing {len(paused) + 1} DAGs")
            prepare_dags(server, paused, [LATENCY_DAG])
            results, details = asyncio.run(throughput(server, args, workdir))
            lat = asyncio.run(latency(server, args, workdir,
                                      4 if args.airflow_db == "postgres" else 1))
            restarts = dict(server.restarts)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write_results(args, stem, results, details, lat)
    say(f"done in {time.monotonic() - began:.0f} s; Airflow components restarted: "
        f"{restarts or 'none'}")
    bad = [f"{r.case} round {r.round}: {r.events} distinct of {r.messages}, "
           f"{r.leftover} twice" for r in results if r.wrong]
    if not lat["ok"]:
        bad.append(f"latency: {lat['airflow_runs']} Airflow runs ({lat['distinct_ids']} "
                   f"distinct) for {lat['messages']} messages + 1 warm-up; "
                   f"{lat['messages_twice']} twice")
    if bad:
        say("error: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
