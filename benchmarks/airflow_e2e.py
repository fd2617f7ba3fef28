"""The headline: sharedstream's triggerer against Apache Airflow's own, on one Kafka workload.

Both sides run the same watcher code: the Kafka provider's
``KafkaSharedStreamTrigger`` (``apache-airflow-providers-apache-kafka``
2.1.0, the first release with it), subclassed as ``BucketWatcher`` - watcher
j keeps the records of bucket ``j % 10`` and fires ``{"id", "watcher"}`` for
each - in a module beside a DAG file that declares K assets, each watched by
one ``BucketWatcher`` on the same topic, and one DAG scheduled on any of
them. For Airflow the files import from ``airflow.``; for sharedstream the
same text imports from ``sharedstream.airflow.`` (the import rule of
docs/airflow.md), nothing else changed. Both read the Kafka connection
``kafka_bench`` from ``AIRFLOW_CONN_KAFKA_BENCH`` (``enable.auto.commit``
false, ``session.timeout.ms`` 2000 and ``fetch.wait.max.ms`` 20 for Tansu:
:data:`FETCH_WAIT_MS`).

* ``airflow`` - a real Airflow 3.3.2 from the package index (the testing
  kit's :class:`~sharedstream.testing.airflow.AirflowServer`, its own
  virtualenv with the provider): the API server, ``dag-processor`` and
  ``triggerer``, ``[logging] logging_level`` from ``--airflow-log-level``
  (WARNING; Airflow's own default is INFO); no scheduler (the triggerer
  itself writes the asset events). A fresh Airflow per run.
* ``sharedstream`` - ``python -m sharedstream triggerer`` (the real CLI) on a
  fresh store (``sharedstream init``), ``--log-level WARNING``.

``--store`` says where both sides keep their metadata (each case runs once
per store given): ``sqlite`` (the default) - Airflow's SQLite file in WAL
mode in its home, ours ``sqlite:///`` in the run's folder; ``postgresql`` -
one PostgreSQL server of the testing kit for the whole benchmark
(:func:`~sharedstream.testing.brokers.postgres.postgres_server`, ``fsync``
on) and a fresh database on it per run: Airflow's through psycopg2
(:func:`~sharedstream.testing.airflow.postgres_metadata`; its virtualenv
then also has :data:`~sharedstream.testing.airflow.POSTGRES_EXTRA`, a
virtualenv of its own, so the default one is untouched), ours through
``sharedstream init --db postgresql://...``.

One Tansu broker (in memory) serves every run; each run has its own topic
of P partitions (default 4), its own consumer group, N JSON records
(``_e2e.message_body``). Modes: ``live`` - the watchers are running (their
triggers assigned) before the records are produced, and the clock starts
with the production; ``backlog`` - the records are produced first, and the
clock starts when the DAG file is handed over (Airflow: written into the
running DAG processor's folder; sharedstream: the triggerer process
started), so parse, start and group join are inside the time.

Both sides are counted from their databases, never from the broker (one
reader, :class:`Database`, for SQLite and PostgreSQL alike): events
stored (Airflow: ``asset_event`` rows; sharedstream: ``trigger_events``,
one asset event each), distinct (watcher, record) pairs, duplicates (stored
minus distinct), seconds until all ``expected_events(N, K)`` distinct pairs
are stored and the first event's time (both from the rows' own write times,
``asset_event.timestamp`` and ``trigger_events.created_at``, against the
start on the same wall clock: the benchmark counts every 0.2 s, which
would otherwise be the resolution of a sub-second run), and the
triggerer's CPU seconds (its
process and every descendant, each one's own user + system time read from
``/proc`` at every count: :class:`CpuMeter`) and peak RSS and PSS (summed
over the same processes, sampled every half second) over that time. Each
side is counted once more after its triggerer stopped, so events stored
after the last count (redeliveries) are in the totals. A run that does not
finish within ``--timeout`` is reported with what it stored, distinct and
duplicates included; it has no msgs/s and no CPU per record (``null``).

The filter floor: each round also times the watchers' own code alone, in
this process - K ``BucketWatcher`` filters (the sharedstream file, so the
same ``json.loads`` and comparison both sides run) over the N record values
already in memory, no broker, no store, no other process (:func:`filter_floor`).
No triggerer that runs the filters in one Python process can pass that
rate, so ``floor / Airflow`` is the ceiling of any ratio here, and
``ours / floor`` says how much of it our side reaches.

Rounds (``--rounds``, default 3) run every (store, mode, K, side) once each;
the reported run per (side, mode, K, store) is its median by msgs/s, and
the ratio ``sharedstream / airflow`` per case (named like ``live K=10
postgresql`` in the results) is the median of the rounds' own ratios.
Target (issue 32): >= 100x at K = 10 and K = 100 with zero duplicates on
our side; a verdict is printed and written, never asserted. Exit status 1
when our side stored a wrong count or any run did not finish (the results
are written first).

Writes ``benchmarks/results/airflow_e2e.{json,csv,png}`` (``--name`` to
change the stem; ``--smoke`` writes ``airflow_e2e-smoke.*``).

Usage: ``python benchmarks/airflow_e2e.py [--messages 20000] [--ks 10]
[--partitions 4] [--modes live,backlog] [--store sqlite,postgresql]
[--airflow-log-level WARNING] [--rounds 3] [--sides airflow,sharedstream]
[--timeout 900] [--smoke] [--output-dir D] [--name STEM]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime as dt
import importlib.util
import itertools
import json
import math
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _e2e import BUCKETS, compile_checkout, expected_events, message_body, say
from _triggerer_config import BENCH_ENVIRONMENT
from kafka_e2e import RESULTS, create_topic, produce

from sharedstream.runtime.serde import unpack_event_payload
from sharedstream.store.factory import sqlite_path
from sharedstream.testing.airflow import (
    DEFAULT_AIRFLOW_VERSION,
    AirflowServer,
    postgres_metadata,
)
from sharedstream.testing.brokers import tansu_broker
from sharedstream.testing.brokers.postgres import fresh_database, postgres_server
from sharedstream.testing.triggerers import TriggererCluster

PROVIDER = "apache-airflow-providers-apache-kafka==2.1.0"
"""The Kafka provider with ``KafkaSharedStreamTrigger`` (2.1.0 is the first with it)."""

SIDES = ("airflow", "sharedstream")
MODES = ("live", "backlog")
STORES = ("sqlite", "postgresql")
STORE_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TARGET = 100.0
"""Issue 32: sharedstream's msgs/s at least this many times Airflow's, same workload."""
POLL = 0.2  # seconds between database counts
MEMORY_EVERY = 0.5  # seconds between memory samples
SETTLE = 2.0  # seconds after the watchers are running before a live run produces

# The watcher and the DAG file, written once per side: ``{prefix}`` is "airflow." or
# "sharedstream.airflow." - the import rule is the only difference.
WATCHERS = '''\
"""Watcher j: the Kafka provider's shared-stream trigger, firing for bucket j % 10 only."""
import json

from {prefix}providers.apache.kafka.triggers.shared_stream import KafkaSharedStreamTrigger
from {prefix}triggers.base import TriggerEvent


class BucketWatcher(KafkaSharedStreamTrigger):
    def __init__(self, *, bucket, watcher, **kwargs):
        self.bucket, self.watcher = bucket, watcher  # the watcher label keeps all K distinct
        super().__init__(**kwargs)

    def serialize(self):
        _, kwargs = super().serialize()  # the provider's names its own class: name ours
        return "bench_watchers.BucketWatcher", {{**kwargs, "bucket": self.bucket,
                                                 "watcher": self.watcher}}

    async def filter_shared_stream(self, shared_stream):
        async for value in shared_stream:
            record = json.loads(value)
            if record["bucket"] == self.bucket:
                yield TriggerEvent({{"id": record["id"], "watcher": self.watcher}})
'''

DAG_FILE = '''\
from {prefix}providers.standard.operators.empty import EmptyOperator
from {prefix}sdk import DAG, Asset, AssetAny, AssetWatcher

from bench_watchers import BucketWatcher

ASSETS = [
    Asset(f"bench_bucket_{{j}}", watchers=[AssetWatcher(
        name=f"watcher_{{j}}",
        trigger=BucketWatcher(topics=[{topic!r}], kafka_config_id="kafka_bench",
                              bucket=j % {buckets}, watcher=j))])
    for j in range({k})
]

with DAG(dag_id="bench_watched", schedule=AssetAny(*ASSETS)):
    EmptyOperator(task_id="noop")
'''

PREFIX = {"airflow": "airflow.", "sharedstream": "sharedstream.airflow."}


def write_watchers(folder: Path, side: str) -> None:
    """The watcher module ``bench_watchers`` for ``side``, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench_watchers.py").write_text(WATCHERS.format(prefix=PREFIX[side]))


def write_dag(folder: Path, side: str, topic: str, k: int) -> Path:
    """The DAG file with K watched assets for ``side``, in ``folder``; returns its path."""
    dag = folder / "bench_watched.py"
    text = DAG_FILE.format(prefix=PREFIX[side], topic=topic, buckets=BUCKETS, k=k)
    # Written beside, then renamed: a DAG processor never parses half a file.
    partial = folder / ".bench_watched.py.part"
    partial.write_text(text)
    partial.rename(dag)
    return dag


FETCH_WAIT_MS = 20
"""Both sides' ``fetch.wait.max.ms``. Tansu answers a fetch of a caught-up consumer only
when this wait is over, never when a record arrives (Kafka answers at once): at the
clients' default 500 ms, a record produced to a waiting consumer took 146 ms to arrive
(median; up to 465 ms), at 20 ms, 6 ms."""


def kafka_connection(bootstrap: str, group: str) -> str:
    """``AIRFLOW_CONN_KAFKA_BENCH`` (JSON form), read by both sides."""
    return json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": "false",
        "auto.offset.reset": "earliest", "session.timeout.ms": 2000,
        "heartbeat.interval.ms": 400, "fetch.wait.max.ms": FETCH_WAIT_MS}})


# -- the processes: CPU and memory from /proc ------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_tree(root: int) -> list[int]:
    """``root`` and every live descendant of it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


@dataclass
class CpuMeter:
    """CPU seconds a process tree used since the meter started, sampled process by process.

    Each :meth:`sample` reads every live process's own user + system time;
    the total is each one's growth since its first sample (all of it for a
    process born since the start). A reaped child's time is not read from its
    parent (``cutime``): Airflow's processes reap children that way or not
    at all, and a child auto-reaped or reparented would drop out of the sum.
    A process that ends loses what it used since its last sample (sample
    often: :func:`watch` does every poll).
    """

    root: int
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    started: bool = False

    def sample(self, root: int | None = None) -> None:
        """Read the tree under ``root`` (the meter's, or a restarted process's, from now on)."""
        if root is not None:
            self.root = root
        for pid in process_tree(self.root):
            fields = _stat(pid)
            if fields is None:
                continue
            ticks = int(fields[11]) + int(fields[12])  # utime, stime
            self.first.setdefault(pid, ticks if not self.started else 0)
            self.last[pid] = ticks
        self.started = True

    def seconds(self) -> float:
        ticks = sum(self.last[pid] - self.first[pid] for pid in self.last)
        return ticks / os.sysconf("SC_CLK_TCK")


def tree_memory(root: int) -> tuple[float, float]:
    """(RSS, PSS) in MB summed over ``root`` and its descendants (``smaps_rollup``)."""
    rss = pss = 0
    for pid in process_tree(root):
        try:
            lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                kb = int(rest.split()[0])
                rss, pss = (rss + kb, pss) if name == "Rss" else (rss, pss + kb)
    return rss / 1024, pss / 1024


# -- counting from the databases -----------------------------------------------------------------


@dataclass
class Tally:
    """Events read so far from one side's database, incrementally by row id."""

    read_through: int = 0
    stored: int = 0
    pairs: Counter[tuple[int, int]] = field(default_factory=Counter)
    target: int = 0
    """Distinct pairs that make the run complete (set by :func:`watch`)."""
    first_written: float | None = None
    """When the first event was written, by the database's own clock (epoch seconds)."""
    done_written: float | None = None
    """When the event that completed ``target`` distinct pairs was written (epoch seconds)."""

    @property
    def distinct(self) -> int:
        return len(self.pairs)

    def add(self, payload: Any, written: float | None = None) -> None:
        """Count one stored event; ``written`` is its row's write time, when known."""
        self.stored += 1
        if written is not None and (self.first_written is None or written < self.first_written):
            self.first_written = written
        if isinstance(payload, dict) and "watcher" in payload and "id" in payload:
            self.pairs[int(payload["watcher"]), int(payload["id"])] += 1
            if (self.done_written is None and self.target
                    and len(self.pairs) >= self.target and written is not None):
                self.done_written = written


def epoch_of(written: Any) -> float | None:
    """A row's write time as epoch seconds: a ``datetime`` or ISO text; naive means UTC."""
    if isinstance(written, str):
        try:
            written = dt.datetime.fromisoformat(written)
        except ValueError:
            return None
    if not isinstance(written, dt.datetime):
        return None
    moment: dt.datetime = written if written.tzinfo else written.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def airflow_payload(extra: Any) -> Any:
    """The trigger event's payload in an ``asset_event.extra`` (``{"payload": ...}``)."""
    value = json.loads(extra) if isinstance(extra, str | bytes) else extra
    if isinstance(value, dict) and isinstance(value.get("payload"), dict):
        return value["payload"]
    return value


def our_payload(raw: Any) -> Any:
    """A stored trigger event's payload (packed by the store's serde)."""
    return unpack_event_payload(bytes(raw)) if raw is not None else None


@dataclass(frozen=True)
class Database:
    """One side's database, SQLite or PostgreSQL, read with a connection of its own per call.

    ``url`` is ``sqlite:///<absolute path>`` or a libpq ``postgresql://`` URL
    (read with psycopg, the project's ``postgres`` extra: never Airflow's
    driver). Queries are written with ``?`` placeholders, and ``?`` appears
    in them for nothing else (each is sent as ``%s`` to PostgreSQL). An SQLite
    file not created yet reads as no rows. Every call sees what was committed
    before it (no transaction is kept open between calls).
    """

    url: str

    def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Every row ``query`` returns with ``params``."""
        path = sqlite_path(self.url)
        if path is not None:
            if not path.exists():
                return []
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
                return db.execute(query, params).fetchall()
        import psycopg  # noqa: PLC0415 - the postgres extra, needed only with --store postgresql

        with psycopg.connect(self.url, autocommit=True) as db:
            return db.execute(query.replace("?", "%s"), params).fetchall()


def read_new(database: Database, tally: Tally, query: str, decode: Callable[[Any], Any]) -> None:
    """Add to ``tally`` the rows of ``query`` (``id, payload, written``; ids after ``?``)."""
    for row_id, payload, written in database.rows(query, tally.read_through):
        tally.read_through = int(row_id)
        tally.add(decode(payload), epoch_of(written))


# Each side's event rows with their write times: the times a run reports are the database's,
# so they do not depend on how often the benchmark looks (POLL).
AIRFLOW_EVENTS = "SELECT id, extra, timestamp FROM asset_event WHERE id > ? ORDER BY id"
OUR_EVENTS = "SELECT id, payload, created_at FROM trigger_events WHERE id > ? ORDER BY id"
AIRFLOW_RUNNING = 'SELECT count(*) FROM "trigger" WHERE triggerer_id IS NOT NULL'


def running_triggers(database: Database) -> int:
    """Airflow's triggers assigned to a triggerer (0 before its tables exist)."""
    rows = database.rows(AIRFLOW_RUNNING)
    return int(rows[0][0]) if rows else 0


# -- one run ------------------------------------------------------------------------------------


@dataclass
class Run:
    """One side, one mode, one K, one round: N records until every expected event is stored."""

    side: str
    mode: str
    k: int
    store: str
    """Where both sides keep their metadata in this run: ``sqlite`` or ``postgresql``."""
    round: int
    messages: int
    expected: int
    finished: bool
    seconds: float
    first_event_s: float | None
    left_at_first: float
    stored: int
    distinct: int
    cpu_s: float
    peak_rss_mb: float
    peak_pss_mb: float
    restarts: int = 0
    """Airflow components the testing kit started again during the run."""

    @classmethod
    def of(cls, side: str, case: Case, seen: Watched, tally: Tally, restarts: int = 0) -> Run:
        return cls(side, case.mode, case.k, case.store, case.round, case.messages,
                   expected_events(case.messages, case.k), seen.finished, seen.seconds,
                   seen.first_event_s, seen.left_at_first, tally.stored, tally.distinct,
                   seen.cpu_s, seen.peak_rss_mb, seen.peak_pss_mb, restarts)

    @property
    def duplicates(self) -> int:
        return self.stored - self.distinct

    @property
    def per_s(self) -> float:
        """Records per second to all stored (NaN when unfinished: see ``distinct``)."""
        return self.messages / self.seconds if self.finished and self.seconds else math.nan

    @property
    def steady_per_s(self) -> float:
        """Records per second after the first stored event (those left then, over the rest)."""
        if not self.finished or self.first_event_s is None:
            return math.nan
        span = self.seconds - self.first_event_s
        return self.messages * self.left_at_first / span if span > 0 else math.nan

    @property
    def cpu_ms_per_message(self) -> float:
        """The triggerer's CPU per record (NaN when unfinished: how many it handled is unknown)."""
        return 1000 * self.cpu_s / self.messages if self.finished else math.nan

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(duplicates=self.duplicates, msgs_per_s=_round(self.per_s),
                   steady_per_s=_round(self.steady_per_s),
                   cpu_ms_per_message=_round(self.cpu_ms_per_message, 4),
                   seconds=round(self.seconds, 3),
                   first_event_s=None if self.first_event_s is None
                   else round(self.first_event_s, 3), cpu_s=round(self.cpu_s, 2),
                   peak_rss_mb=round(self.peak_rss_mb, 1), peak_pss_mb=round(self.peak_pss_mb, 1))
        return out


def _round(value: float, digits: int = 1) -> float | None:
    """``value`` rounded for the results, ``None`` for NaN (JSON has no NaN)."""
    return None if math.isnan(value) else round(value, digits)


@dataclass
class Watch:
    """What :func:`watch` needs of one side: where to count, whom to meter."""

    database: Database
    query: str
    decode: Callable[[Any], Any]
    pid: Callable[[], int | None]
    """The triggerer's pid now (``None``: not running)."""


@dataclass
class Watched:
    """What :func:`watch` saw of one run."""

    finished: bool
    seconds: float
    first_event_s: float | None
    left_at_first: float
    """The share of the expected events not yet stored when the first was seen."""
    cpu_s: float
    peak_rss_mb: float
    peak_pss_mb: float


async def watch(side: Watch, tally: Tally, *, expected: int, started: float, limit: float,
                label: str) -> Watched:
    """Count until ``expected`` distinct pairs are stored or ``limit`` s pass.

    CPU is the triggerer's from the call to the end; memory peaks are sampled
    at the call, every :data:`MEMORY_EVERY` s and at the end.
    """
    pid = side.pid()
    if pid is None:
        raise RuntimeError(f"{label}: the triggerer is not running")
    # The start on the wall clock, which the databases' write times are on.
    wall_started = time.time() - (time.perf_counter() - started)
    tally.target = expected
    cpu = CpuMeter(pid)
    cpu.sample()
    peak_rss = peak_pss = 0.0
    first: float | None = None
    at_first = 0
    last_memory, last_report = -math.inf, 0.0
    while True:
        read_new(side.database, tally, side.query, side.decode)
        now = time.perf_counter() - started
        if first is None and tally.stored:
            first, at_first = now, tally.distinct
        current = side.pid()
        if current is None:
            raise RuntimeError(f"{label}: the triggerer exited after {now:.1f} s "
                               f"({tally.distinct}/{expected} stored)")
        pid = current  # the kit may have started it again: count the new one too
        cpu.sample(pid)
        done = tally.distinct >= expected
        if done or now > limit or now - last_memory >= MEMORY_EVERY:
            last_memory = now
            rss, pss = tree_memory(pid)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        if done or now > limit:
            # The database's times where it has them: the poll only notices them later.
            if done and tally.done_written is not None:
                now = max(tally.done_written - wall_started, 1e-3)
            if tally.first_written is not None:  # and at that moment, one event was stored
                first = min(max(tally.first_written - wall_started, 0.0), now)
                at_first = 1
            return Watched(done, now, first, 1 - at_first / expected,
                           cpu.seconds(), peak_rss, peak_pss)
        if now - last_report >= 5.0:
            last_report = now
            say(f"  [{label} {now:6.1f}s] {tally.distinct:>7}/{expected} distinct, "
                f"{tally.stored - tally.distinct} duplicates")
        await asyncio.sleep(POLL)


async def wait_running(count: Callable[[], int], k: int, *, label: str, limit: float) -> None:
    """Until ``count()`` (triggers running) reaches ``k``, then :data:`SETTLE` s more."""
    deadline = time.monotonic() + limit
    while count() < k:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: {count()}/{k} triggers running after {limit:.0f} s")
        await asyncio.sleep(POLL)
    await asyncio.sleep(SETTLE)


@dataclass
class Case:
    """What every run of a case shares."""

    bootstrap: str
    messages: int
    partitions: int
    mode: str
    k: int
    store: str
    round: int
    workdir: Path
    timeout: float
    postgres: str | None = None
    """The PostgreSQL server's admin URL (the store ``postgresql`` needs it)."""
    airflow_log_level: str = "WARNING"

    @property
    def topic(self) -> str:
        return f"bench.airflow.{self.round}.{self.store}.{self.mode}.{self.k}"

    def label(self, side: str) -> str:
        return f"{side} {self.mode} K={self.k} {self.store} #{self.round}"

    @contextlib.contextmanager
    def fresh_database(self, prefix: str) -> Iterator[str | None]:
        """For one run: a new PostgreSQL database's URL, dropped after; ``None`` on SQLite."""
        if self.store == "sqlite":
            yield None
            return
        if self.postgres is None:
            raise ValueError(f"the store {self.store!r} needs a PostgreSQL server")
        with fresh_database(self.postgres, prefix=prefix) as url:
            yield url


async def run_airflow(case: Case) -> Run:
    """A fresh Airflow (API server, DAG processor, triggerer) until every event is stored."""
    with case.fresh_database("airflow") as url:
        return await _run_airflow(case, url)


async def _run_airflow(case: Case, url: str | None) -> Run:
    topic = f"{case.topic}.airflow"
    label = case.label("airflow")
    await create_topic(case.bootstrap, topic, case.partitions)
    if case.mode == "backlog":
        await produce(case.bootstrap, topic, case.messages, case.partitions)
    dags = case.workdir / f"{topic}-dags"
    dags.mkdir()
    # Airflow 3's triggerer does not import from the DAG folder: the watcher module is
    # put on its path (as a deployment installs trigger code), and written before it starts.
    code = case.workdir / f"{topic}-code"
    write_watchers(code, "airflow")
    environment = {"AIRFLOW_CONN_KAFKA_BENCH": kafka_connection(case.bootstrap, f"{topic}.g"),
                   "AIRFLOW__LOGGING__LOGGING_LEVEL": case.airflow_log_level,
                   "PYTHONPATH": str(code)}
    extra = [PROVIDER]
    if url is not None:
        database_extra, database_environment = postgres_metadata(url)
        environment.update(database_environment)
        extra += database_extra
    expected = expected_events(case.messages, case.k)
    tally = Tally()
    # No liveness restarts: a triggerer busy with the load misses its heartbeat for 30 s
    # and more, and the kit would start it again mid-run (one that exits still is).
    # Kept home: its SQLite database is counted once more after the stop, then removed.
    server = AirflowServer(dags, components=("dag-processor", "triggerer"), extra=extra,
                           environment=environment, hang_timeout=case.timeout + 60, keep=True)
    say(f"{label}: starting Airflow {server.version} "
        f"([logging] logging_level {case.airflow_log_level})")
    try:
        await asyncio.to_thread(server.start)
        database = Database(url or f"sqlite:///{server.home / 'airflow.db'}")
        side = Watch(database, AIRFLOW_EVENTS, airflow_payload, lambda: server.pid("triggerer"))
        started = time.perf_counter()
        write_dag(dags, "airflow", topic, case.k)
        if case.mode == "live":
            await wait_running(lambda: running_triggers(database), case.k, label=label,
                               limit=120)
            started = time.perf_counter()
            producing = asyncio.create_task(
                produce(case.bootstrap, topic, case.messages, case.partitions))
        seen = await watch(side, tally, expected=expected, started=started, limit=case.timeout,
                           label=label)
        if case.mode == "live":
            await producing
        await asyncio.to_thread(server.stop)
        read_new(database, tally, AIRFLOW_EVENTS, airflow_payload)  # whatever landed after
    finally:
        await asyncio.to_thread(server.stop)
        if server.home != Path():
            shutil.rmtree(server.home, ignore_errors=True)
    return Run.of("airflow", case, seen, tally, restarts=sum(server.restarts.values()))


async def run_ours(case: Case) -> Run:
    """``python -m sharedstream triggerer`` on a fresh store until every event is stored."""
    with case.fresh_database("sharedstream") as url:
        return await _run_ours(case, url)


async def _run_ours(case: Case, url: str | None) -> Run:
    topic = f"{case.topic}.ours"
    label = case.label("sharedstream")
    await create_topic(case.bootstrap, topic, case.partitions)
    if case.mode == "backlog":
        await produce(case.bootstrap, topic, case.messages, case.partitions)
    folder = case.workdir / f"{topic}-ours"
    folder.mkdir()
    env = {**BENCH_ENVIRONMENT,
           "AIRFLOW_CONN_KAFKA_BENCH": kafka_connection(case.bootstrap, f"{topic}.g")}
    database = Database(url or f"sqlite:///{folder / 'sharedstream.db'}")
    cluster = TriggererCluster(folder, database.url, env)
    expected = expected_events(case.messages, case.k)
    tally = Tally()
    try:
        write_watchers(folder, "sharedstream")
        definitions = write_dag(folder, "sharedstream", topic, case.k)
        started = time.perf_counter()
        process = cluster.start(0, definitions, log_level="WARNING")
        side = Watch(database, OUR_EVENTS, our_payload,
                     lambda: process.pid if process.poll() is None else None)
        if case.mode == "live":
            await wait_running(lambda: _our_running(cluster), case.k, label=label, limit=60)
            started = time.perf_counter()
            producing = asyncio.create_task(
                produce(case.bootstrap, topic, case.messages, case.partitions))
        try:
            seen = await watch(side, tally, expected=expected, started=started,
                               limit=case.timeout, label=label)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{cluster.log(0)[-2000:]}") from exc
        if case.mode == "live":
            await producing
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 60)
        read_new(database, tally, OUR_EVENTS, our_payload)  # whatever landed after
    finally:
        cluster.close()
    return Run.of("sharedstream", case, seen, tally)


def _our_running(cluster: TriggererCluster) -> int:
    """Triggers the live triggerer reports running (``sharedstream triggerers list``)."""
    try:
        listed = cluster.json("triggerers", "list")
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0
    return max((len(row["triggers"]) for row in listed if row["alive"]), default=0)


RUNNERS = {"airflow": run_airflow, "sharedstream": run_ours}


@dataclass(frozen=True)
class Floor:
    """The watchers' own filters alone over one round's records (:func:`filter_floor`)."""

    k: int
    round: int
    messages: int
    seconds: float

    @property
    def per_s(self) -> float:
        """Records per second through all K filters."""
        return self.messages / self.seconds if self.seconds > 0 else math.nan


FLOOR_PASSES = 3
"""Passes of :func:`filter_floor` per measurement; the fastest is kept (the least noise)."""


async def filter_floor(folder: Path, k: int, messages: int, round_: int) -> Floor:
    """Time K ``BucketWatcher`` filters over N record values in this process; the fastest pass.

    The watcher module is the one the sharedstream side runs (written into
    ``folder`` and loaded from there, under its own module name); each
    watcher's ``filter_shared_stream`` reads the same encoded values the
    benchmark produces, one watcher after the other. Nothing else runs: no
    broker, store, fan-out or other process. ``RuntimeError`` if the
    filters fire other than ``expected_events(N, K)`` events (then they are
    not the benchmark's filters).
    """
    write_watchers(folder, "sharedstream")
    spec = importlib.util.spec_from_file_location(f"bench_watchers_floor_{k}_{round_}",
                                                  folder / "bench_watchers.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {folder / 'bench_watchers.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    watchers = [module.BucketWatcher(topics=["floor"], kafka_config_id="kafka_bench",
                                     bucket=j % BUCKETS, watcher=j) for j in range(k)]
    values = [message_body(i).encode() for i in range(messages)]
    expected = expected_events(messages, k)

    async def stream() -> Any:
        for value in values:
            yield value

    fastest = math.inf
    for _ in range(FLOOR_PASSES):
        fired = 0
        started = time.perf_counter()
        for watcher in watchers:
            async for _event in watcher.filter_shared_stream(stream()):
                fired += 1
        fastest = min(fastest, time.perf_counter() - started)
        if fired != expected:
            raise RuntimeError(f"the filters fired {fired} events, not {expected}: "
                               "not the benchmark's filters")
    return Floor(k, round_, messages, fastest)


# -- rounds, medians, ratios, files -------------------------------------------------------------


def case_name(mode: str, k: int, store: str) -> str:
    """How results name a case: ``live K=10 postgresql``."""
    return f"{mode} K={k} {store}"


def medians(runs: list[Run]) -> list[Run]:
    """Per (side, mode, K, store), the run with the median msgs/s (unfinished: the slowest)."""
    grouped: dict[tuple[str, str, int, str], list[Run]] = {}
    for run in runs:
        grouped.setdefault((run.side, run.mode, run.k, run.store), []).append(run)
    return [sorted(group, key=lambda r: -math.inf if math.isnan(r.per_s) else r.per_s)[
        (len(group) - 1) // 2] for group in grouped.values()]


def ratios(runs: list[Run], floors: list[Floor] | None = None) -> dict[str, dict[str, Any]]:
    """Per case (:func:`case_name`): each round's ours / Airflow msgs/s and CPU per message.

    With ``floors`` (:func:`filter_floor`, per K and round), also each
    round's floor / Airflow msgs/s (``ceiling_floor_over_airflow``: no
    triggerer running the filters in one process can do better) and ours /
    floor (``ours_over_floor``), where both runs of the round finished.

    A round where Airflow did not finish within its ``seconds`` but we did
    has a lower bound for a ratio: Airflow's rate was below ``messages /
    seconds``, so the ratio is above ``ours * seconds / messages``; such
    rounds are flagged in ``lower_bounds`` (``at_least`` when any is), and
    a median over them is a lower bound too. A round where our run did not
    finish has no ratio (``None``), and then neither has the median: the
    verdict is NOT MET.
    """
    by = {(r.side, r.mode, r.k, r.store, r.round): r for r in runs}
    floor_of = {(f.k, f.round): f for f in floors or ()}
    out: dict[str, dict[str, Any]] = {}
    for mode, k, store in sorted({(r.mode, r.k, r.store) for r in runs}):
        speed, cpu, bounds = [], [], []
        ceiling: list[float] = []
        reached: list[float] = []
        for round_ in sorted({r.round for r in runs}):
            ours = by.get(("sharedstream", mode, k, store, round_))
            theirs = by.get(("airflow", mode, k, store, round_))
            floor = floor_of.get((k, round_))
            if floor is not None and ours is not None and ours.finished:
                reached.append(round(ours.per_s / floor.per_s, 3))
            if floor is not None and theirs is not None and theirs.finished:
                ceiling.append(round(floor.per_s / theirs.per_s, 1))
            if ours is None or theirs is None:
                continue
            bound = ours.finished and not theirs.finished and theirs.seconds > 0
            speed.append(round(ours.per_s * theirs.seconds / theirs.messages if bound
                               else ours.per_s / theirs.per_s, 1))
            bounds.append(bound)
            if ours.cpu_s > 0 and ours.finished and theirs.finished:
                cpu.append(round(theirs.cpu_ms_per_message / ours.cpu_ms_per_message, 1))
        if not speed:
            continue
        finite = [v for v in speed if not math.isnan(v)]
        median = statistics.median(finite) if len(finite) == len(speed) else math.nan
        clean = all(r.duplicates == 0 and r.finished for r in runs
                    if (r.side, r.mode, r.k, r.store) == ("sharedstream", mode, k, store))
        out[case_name(mode, k, store)] = {
            "msgs_per_s_ours_over_airflow": {"rounds": [_round(v) for v in speed],
                                             "median": _round(median),
                                             "lower_bounds": bounds, "at_least": any(bounds)},
            "cpu_per_message_airflow_over_ours": {
                "rounds": cpu, "median": round(statistics.median(cpu), 1) if cpu else None},
            "ceiling_floor_over_airflow": {
                "rounds": ceiling,
                "median": round(statistics.median(ceiling), 1) if ceiling else None},
            "ours_over_floor": {
                "rounds": reached,
                "median": round(statistics.median(reached), 3) if reached else None},
            "target": f">= {TARGET:g}x msgs/s, 0 duplicates on our side",
            "verdict": "MET" if median >= TARGET and clean else "NOT MET"}
    return out


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """msgs/s and triggerer CPU per message, per (mode, K), both sides, log scales."""
    import matplotlib  # noqa: PLC0415 - only needed for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cases = sorted({(r["mode"], r["k"], r["store"]) for r in rows})
    by = {(r["side"], r["mode"], r["k"], r["store"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (("msgs_per_s", "records/s to all stored (median run)", "{:,.0f}"),
              ("cpu_ms_per_message", "triggerer CPU ms per record", "{:.3g}"))
    for ax, (key, ylabel, fmt) in zip(axes, panels, strict=True):
        for offset, side, colour in ((-0.2, "airflow", "C1"), (0.2, "sharedstream", "C0")):
            values = [(by.get((side, *case)) or {}).get(key) or 0 for case in cases]
            bars = ax.bar([x + offset for x in range(len(cases))], values, 0.4, color=colour,
                          label=side)
            ax.bar_label(bars, labels=[fmt.format(v) if v else "-" for v in values],
                         fontsize=7)
        if any((r.get(key) or 0) > 0 for r in rows):  # a log axis of nothing only warns
            ax.set_yscale("log")
        ax.set_xticks(range(len(cases)),
                      [f"{mode}\nK={k}\n{STORE_NAMES[store]}" for mode, k, store in cases])
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(args: argparse.Namespace, runs: list[Run], load: dict[str, Any],
                  floors: list[Floor] | None = None) -> None:
    rows = [r.row() for r in medians(runs)]
    stem = args.name or ("airflow_e2e-smoke" if args.smoke else "airflow_e2e")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{stem}.json").write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.platform(),
        "cpus": os.cpu_count(), "load_average": load, "airflow": DEFAULT_AIRFLOW_VERSION,
        "provider": PROVIDER, "broker": "tansu (memory)", "stores": args.store,
        "airflow_logging_level": args.airflow_log_level, "messages": args.messages,
        "ks": args.ks, "partitions": args.partitions, "modes": args.modes,
        "rounds": args.rounds, "rows": rows,
        "ratios": ratios(runs, floors),
        "filter_floor": [{**asdict(f), "seconds": round(f.seconds, 4),
                          "records_per_s": _round(f.per_s)} for f in floors or ()],
        "runs": [r.row() for r in runs]}, indent=2) + "\n")
    with (args.output_dir / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    stores = " and ".join(STORE_NAMES[store] for store in args.store)
    logging_level = ("" if args.airflow_log_level == "WARNING"
                     else f", Airflow logging {args.airflow_log_level}")
    plot(rows, args.output_dir / f"{stem}.png",
         f"Airflow {DEFAULT_AIRFLOW_VERSION}'s triggerer vs sharedstream's: {args.messages:,} "
         f"records, {args.partitions} partitions (Tansu), {stores}{logging_level}")


def print_table(runs: list[Run], floors: list[Floor] | None = None) -> None:
    print("| side | mode | K | store | msgs/s | steady msgs/s | s to all stored | stored "
          "| distinct | duplicates | CPU ms/record | peak RSS MB | peak PSS MB |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in sorted(medians(runs), key=lambda r: (r.store, r.mode, r.k, r.side)):
        print(f"| {r.side} | {r.mode} | {r.k} | {r.store} | {r.per_s:,.1f} | "
              f"{r.steady_per_s:,.1f} | "
              f"{r.seconds:.2f}{'' if r.finished else ' (unfinished)'} | {r.stored:,} | "
              f"{r.distinct:,} / {r.expected:,} | {r.duplicates:,} | "
              f"{r.cpu_ms_per_message:.3f} | {r.peak_rss_mb:,.0f} | {r.peak_pss_mb:,.0f} |")
    for k in sorted({f.k for f in floors or ()}):
        rates = [f.per_s for f in floors or () if f.k == k]
        print(f"filter floor K={k}: the {k} filters alone, in one process, "
              f"{statistics.median(rates):,.0f} records/s (rounds "
              f"{[round(rate) for rate in rates]})")
    for name, ratio in ratios(runs, floors).items():
        speed = ratio["msgs_per_s_ours_over_airflow"]
        cpu = ratio["cpu_per_message_airflow_over_ours"]
        ceiling = ratio["ceiling_floor_over_airflow"]["median"]
        reached = ratio["ours_over_floor"]["median"]
        at_least = ">= " if speed["at_least"] else ""
        print(f"{name}: sharedstream / Airflow msgs/s {at_least}{speed['median']}x (rounds "
              f"{speed['rounds']}), Airflow / sharedstream CPU per record {cpu['median']}x "
              f"-> {ratio['verdict']} (target {ratio['target']})"
              + ("" if ceiling is None else f"; ceiling (filter floor / Airflow) {ceiling}x")
              + ("" if reached is None else f", ours at {reached:.0%} of the floor"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def listed(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
        def parse(text: str) -> list[str]:
            values = text.split(",")
            wrong = [v for v in values if v not in allowed]
            if wrong:
                raise argparse.ArgumentTypeError(f"unknown {wrong}; choose from {allowed}")
            return values
        return parse

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000, help="records per run (20,000)")
    parser.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[10],
                        help="watcher counts, comma-separated (default 10)")
    parser.add_argument("--partitions", type=int, default=4, help="of the topic (default 4)")
    parser.add_argument("--modes", type=listed(MODES), default=list(MODES),
                        help="live,backlog (default both)")
    parser.add_argument("--sides", type=listed(SIDES), default=list(SIDES),
                        help="airflow,sharedstream (default both)")
    parser.add_argument("--store", type=listed(STORES), default=["sqlite"],
                        help="both sides' metadata DB: sqlite, postgresql or sqlite,postgresql "
                             "(default sqlite); every case runs on each")
    parser.add_argument("--airflow-log-level", type=str.upper, choices=LOG_LEVELS,
                        default="WARNING", help="Airflow's [logging] logging_level (WARNING)")
    parser.add_argument("--rounds", type=int, default=3, help="every case once per round (3)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds a run may take before it is reported unfinished (900)")
    parser.add_argument("--smoke", action="store_true",
                        help="500 records, K = 10, one round: a check that it runs")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", help="file stem in the output folder (default airflow_e2e)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.messages, args.ks, args.rounds, args.timeout = 500, [10], 1, 180.0
    if args.messages < 1 or args.rounds < 1 or args.partitions < 1 or min(args.ks) < 1:
        parser.error("--messages, --rounds, --partitions and --ks must be positive")
    return args


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bench-airflow-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_all(args: argparse.Namespace, bootstrap: str, workdir: Path,
                  postgres: str | None) -> tuple[list[Run], list[Floor]]:
    """Every (store, mode, K, side) once per round, and each K's filter floor once per round.

    ``postgres``: the server's admin URL. The floor of a round is timed
    first, before any triggerer of the round starts (nothing else runs then).

    A SIGTERM (a CI timeout, ``kill``) cancels it as Ctrl-C does: every Airflow and
    triggerer it started is stopped on the way out (then the caller's servers).
    """
    task = asyncio.current_task()
    assert task is not None  # noqa: S101 - run by asyncio.run
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    runs, floors = [], []
    for round_ in range(args.rounds):
        for k in args.ks:
            floor = await filter_floor(workdir / f"floor-{k}-{round_}", k, args.messages, round_)
            say(f"filter floor K={k} #{round_}: {floor.per_s:,.0f} records/s "
                f"({floor.seconds:.3f} s for {args.messages:,} records, fastest of "
                f"{FLOOR_PASSES})")
            floors.append(floor)
        for store, mode, k in itertools.product(args.store, args.modes, args.ks):
            case = Case(bootstrap, args.messages, args.partitions, mode, k, store, round_,
                        workdir, args.timeout, postgres, args.airflow_log_level)
            # Alternate which side goes first, round by round.
            sides = args.sides if round_ % 2 == 0 else list(reversed(args.sides))
            for side in sides:
                run = await RUNNERS[side](case)
                say(f"{case.label(side)}: {run.per_s:,.1f} msgs/s "
                    f"({'finished' if run.finished else 'UNFINISHED'} in "
                    f"{run.seconds:.1f} s), {run.distinct}/{run.expected} distinct stored, "
                    f"{run.duplicates} duplicates, {run.cpu_ms_per_message:.3f} CPU ms/record, "
                    f"peak PSS {run.peak_pss_mb:.0f} MB")
                runs.append(run)
    return runs, floors


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "sharedstream" in args.sides:
        compile_checkout()  # a backlog run's clock includes our start; Airflow's is compiled
    load: dict[str, Any] = {"start": list(os.getloadavg())}
    with _workdir() as workdir, tansu_broker(workdir) as bootstrap, contextlib.ExitStack() as on:
        # One PostgreSQL server for the whole benchmark (fsync on), a fresh database per run.
        postgres = (on.enter_context(postgres_server(durable=True))
                    if "postgresql" in args.store else None)
        runs, floors = asyncio.run(run_all(args, bootstrap, workdir, postgres))
    load["end"] = list(os.getloadavg())
    write_results(args, runs, load, floors)
    print_table(runs, floors)
    wrong = [f"{r.side} {case_name(r.mode, r.k, r.store)} #{r.round}" for r in runs
             if not r.finished or (r.side == "sharedstream" and (
                 r.duplicates or r.stored != r.expected))]
    if wrong:
        say(f"error: unfinished runs, or wrong counts on our side, in {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C or SIGTERM, all stopped
        print("airflow_e2e: interrupted; no results written", file=sys.stderr)
        sys.exit(130)
