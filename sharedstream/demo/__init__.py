"""``sharedstream demo``: the whole pipeline against a broker started locally.

Starts the broker of ``--broker`` (Tansu for ``kafka``, the testing kit's
Pub/Sub test server for ``pubsub``, its Service Bus test server for
``servicebus``), writes a configuration like
``sharedstream init``, runs the triggerer in-process on
:mod:`sharedstream.demo.definitions` (four watchers with different filters on
one stream, three DAGs), produces N JSON records (every 50th malformed, to
show the dead-letter destination), reports progress on stderr every 0.5 s and
prints a summary once the broker counts every record as done: the counts
per DAG, where the dead letters went, and the events each watcher stored.
Ctrl-C stops cleanly at any time, the publisher first; a second one exits
at once, killing the broker. The broker is always stopped. ``--keep DIR``
must be a new or empty directory (checked before anything starts).

Everything here is broker-neutral; what differs per broker is a
:class:`~sharedstream.demo.brokers.DemoBroker` (:mod:`.kafka`, :mod:`.pubsub`,
:mod:`.servicebus`), picked by name from :data:`~sharedstream.demo.brokers.DEMO_BROKERS`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sharedstream.demo.brokers import DEMO_BROKERS, TOPIC, DemoBroker, demo_broker
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.runtime.config import Config, load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.logs import configure_logging
from sharedstream.testing.brokers import (  # for callers of the old names
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

log = key_value_logger(__name__)

DEFINITIONS = Path(__file__).with_name("definitions.py")
REGIONS = ("eu", "us", "apac")
MALFORMED_EVERY = 50
RUNS_GRACE = 60.0
"""Seconds the demo waits, once every record is committed, for the DAG runs still running."""
BIG_ORDER = 500  # as in sharedstream.demo.definitions.BIG_ORDER


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


class CleanUp(Protocol):
    """Stops the demo's broker (``at_once``: kills it) and drops its temp directory."""

    def __call__(self, *, at_once: bool = False) -> None: ...


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


@dataclass(frozen=True)
class _Labels:
    """The broker's words in the progress line (from its :class:`DemoBroker`)."""

    advanced: str = "consumed and committed"
    waiting: str = "waiting for the consumer group to form (about a second)..."


@dataclass
class _State:
    produced: int = 0
    committed: int = 0
    """How far the broker advanced: offsets committed (Kafka), messages acked (Pub/Sub)."""
    consuming_since: float | None = None
    """The last moment nothing was committed yet, once something is: consuming began
    after it (a rate from it never overstates, even when the whole run is done between
    two looks at the broker)."""
    idle_at: float = 0.0  # the last look that found nothing committed (the start at first)

    def rate(self, now: float) -> float:
        """Messages committed per second since consuming began (the group join excluded)."""
        since = self.idle_at if self.consuming_since is None else self.consuming_since
        if not self.committed or now <= since:
            return 0.0
        return self.committed / (now - since)


def _on_signals(triggerer: Triggerer, clean_up: CleanUp) -> Callable[[int], None]:
    """Ctrl-C: say at once that the demo is stopping; a second one cleans up, then exits.

    Returns that exit (cleaning up, then ``os._exit`` with the status given),
    for :func:`_exit_at_once_on_signals` once the triggerer's run is over.
    """

    def say_stopping(signal_name: str) -> None:
        print(f"{signal_name}: stopping (send it again to exit at once); finishing what is in "
              "flight", file=sys.stderr, flush=True)

    def exit_at_once(code: int) -> None:
        clean_up(at_once=True)  # the broker (killed: no graceful stop) and the temp directory
        print("stopped at once", file=sys.stderr, flush=True)
        os._exit(code)

    triggerer.on_stop_signal = say_stopping
    triggerer.exit_at_once = exit_at_once
    return exit_at_once


def _exit_at_once_on_signals(exit_at_once: Callable[[int], None]) -> None:
    """From now on SIGINT and SIGTERM exit at once (cleaning up), as a second Ctrl-C does.

    Called when the triggerer's run is over: its handlers end with it, and
    Python's default one would raise ``KeyboardInterrupt`` wherever the
    demo is then (counting, reading dead letters, closing its clients),
    with gRPC calls of this loop in flight. That loop then closes under
    them while the Pub/Sub demo's server thread still serves them, and
    gRPC prints a traceback ("Event loop is closed"). The handlers go with
    the loop, when ``asyncio.run`` closes it.
    """
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, exit_at_once, 128 + signum)
    log.info("the triggerer's run is over: Ctrl-C now exits at once")


def _line(state: _State, stored: int, runs: int, started: float, *,
          labels: _Labels = _Labels(), ran: int = 0) -> str:
    now = time.monotonic()
    if not state.committed:
        state.idle_at = now
    elif state.consuming_since is None:
        state.consuming_since = state.idle_at
    head = f"[{now - started:6.1f}s] produced {state.produced:>7}"
    if state.consuming_since is None:
        return f"{head}  {labels.waiting}"
    return (f"{head}  {labels.advanced} {state.committed:>7}  events stored "
            f"{stored:>7}  runs queued {runs:>7}  ran {ran:>7}  {state.rate(now):7.0f} msgs/s")


async def _produce(broker: DemoBroker, messages: int, state: _State) -> None:
    def sent(count: int) -> None:
        state.produced += count

    await broker.produce(messages, sent)


def _ran(triggerer: Triggerer) -> int:
    """Runs the triggerer's dispatcher has run so far (0 before it started)."""
    service = triggerer.dispatch
    dispatcher = None if service is None else service.dispatcher
    return 0 if dispatcher is None else dispatcher.runs_delivered


async def _run_triggerer(broker: DemoBroker, triggerer: Triggerer, messages: int,
                         state: _State, started: float) -> tuple[int, float]:
    """Run the triggerer and the producer; print progress every 0.5 s.

    Waits until the broker counted every record done and every DAG run queued
    had run (for at most :data:`RUNS_GRACE` seconds more), or the triggerer
    ended first (Ctrl-C, a failure). Returns the triggerer's exit code and
    the seconds until the broker counted every record done (or it ended).
    The producer is cancelled as soon as a stop signal arrives (before the
    triggerer finishes what is in flight), and the triggerer stopped and
    awaited on every exit path; a failed producer raises ``SharedStreamError`` once both are
    done.
    """
    labels = _Labels(broker.advanced_label, broker.waiting_label)
    trigger_task = asyncio.create_task(triggerer.run(), name="sharedstream-demo-triggerer")
    committed_at: float | None = None
    produce_task = asyncio.create_task(_produce(broker, messages, state),
                                       name="sharedstream-demo-producer")
    say_stopping = triggerer.on_stop_signal

    def stop_producing_first(signal_name: str) -> None:
        # The publisher stops before the triggerer finishes what is in flight: publishing on
        # would keep the broker (a Service Bus server) busy, and the stop waiting for it.
        produce_task.cancel()
        say_stopping(signal_name)

    triggerer.on_stop_signal = stop_producing_first
    try:
        while True:
            done, _ = await asyncio.wait({trigger_task}, timeout=0.5)
            if done:
                break
            state.committed = await broker.advanced()
            queued, ran = triggerer.gate.runs_queued, _ran(triggerer)
            print(_line(state, triggerer.gate.stored, queued, started, labels=labels, ran=ran),
                  file=sys.stderr, flush=True)
            if produce_task.done() and not produce_task.cancelled():
                error = produce_task.exception()
                if error is not None:
                    raise SharedStreamError(f"producing failed: {error}") from error
            if state.committed >= messages:
                committed_at = committed_at or time.monotonic()
                if ran >= queued or time.monotonic() - committed_at > RUNS_GRACE:
                    break
        elapsed = (committed_at or time.monotonic()) - started
    finally:
        produce_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await produce_task  # a failure that matters was raised above
        triggerer.request_stop()
        code = await trigger_task
    return code, elapsed


async def _demo(broker: DemoBroker, config: Config, messages: int, workdir: Path, *,
                keep: bool, clean_up: CleanUp) -> int:
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - imports user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415 - heavy, only here

    os.environ.update({"SHAREDSTREAM_DEMO_BROKER": broker.name, **broker.environment()})
    try:
        await broker.create_stream()
        triggerer = Triggerer(config, load_definitions(DEFINITIONS))
        exit_at_once = _on_signals(triggerer, clean_up)
        state = _State()
        started = state.idle_at = time.monotonic()
        try:
            code, elapsed = await _run_triggerer(broker, triggerer, messages, state, started)
        finally:
            _exit_at_once_on_signals(exit_at_once)
        with contextlib.suppress(Exception):  # the true count after the final acks; else the last
            state.committed = max(state.committed, await broker.advanced())
        interrupted = triggerer.interrupted
        dead = await broker.dead_letters(0 if interrupted
                                         else expected_counts(messages).dead_lettered)
    finally:
        await broker.close()
    with config.store.open_store() as store:
        counts = store.counts()
        rows = store.list_runs(limit=10_000_000)
        watchers = [(watcher, trigger.events_stored) for trigger in store.list_triggers()
                    for watcher in trigger.watchers]
    runs = Counter(run.dag_id for run in rows)
    outcomes = Counter(run.state for run in rows)
    per_dag = ", ".join(f"{dag} {runs.get(dag, 0)}" for dag in ("ship", "reconcile", "notify"))
    ran = ", ".join(f"{state_} {n}" for state_, n in sorted(outcomes.items()))
    rate = state.rate(started + elapsed)
    print(("interrupted: " if interrupted else "done: ")
          + f"{state.committed} messages, {counts['trigger_events']} trigger events stored, "
          f"{counts['asset_events']} asset events, DAG runs: {per_dag} ({ran or 'none'}), "
          f"{dead} dead-lettered (to {broker.dead_letters_at} on the demo's broker, gone with "
          f"it), {elapsed:.2f}s, {rate:.0f} msgs/s once consuming")
    print("events stored per watcher: "
          + ", ".join(f"{watcher} {stored}" for watcher, stored in sorted(watchers)))
    print("the runs ran here, on the local target (each Dag's run= in "
          f"{DEFINITIONS.name}); to run them in an Apache Airflow, see docs/dispatch.md",
          file=sys.stderr)
    _say_where(workdir, keep=keep)
    return 130 if interrupted and code == 0 else code


def _say_where(workdir: Path, *, keep: bool) -> None:
    if keep:
        print(f"kept {workdir} (inspect: sharedstream --config "
              f"{workdir / 'sharedstream.toml'} runs list)")
    else:
        print("(run with --keep DIR to keep the database and inspect it with the CLI)",
              file=sys.stderr)


def _check_keep(keep: Path) -> Path:
    """``--keep DIR`` made absolute; ``SharedStreamError`` (one line) unless new or empty.

    Creates nothing: the directory is made once the broker's extras are known to be there.
    """
    workdir = keep.resolve()
    try:
        if workdir.exists() and not workdir.is_dir():
            raise SharedStreamError(f"--keep {keep}: not a directory (give a new or empty one)")
        if workdir.is_dir() and next(workdir.iterdir(), None) is not None:
            held = " already holds a demo" if (workdir / "sharedstream.toml").exists() else (
                " is not empty")
            raise SharedStreamError(f"--keep {keep}{held} (give a new or empty directory)")
    except OSError as exc:
        raise SharedStreamError(f"--keep {keep}: {exc.strerror}") from None
    return workdir


def _workdir(keep: Path | None) -> Path:
    """The temp directory, or ``keep`` (checked by :func:`_check_keep`) created."""
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="sharedstream-demo-"))
    try:
        keep.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SharedStreamError(f"--keep {keep}: cannot create it: {exc.strerror}") from None
    return keep


def run_demo(args: argparse.Namespace) -> int:
    """The ``sharedstream demo`` command on ``--broker`` (default ``kafka``).

    Checks the broker's extras (one line and exit 2 when missing), starts the
    broker, runs, and always stops the broker and drops the temp directory,
    whether the run ends, fails or is interrupted. Returns 0, 130 after
    Ctrl-C, or the triggerer's exit code.
    """
    if args.messages < 1:
        raise SharedStreamError("--messages must be at least 1")
    name = getattr(args, "broker", "kafka")
    if name not in DEMO_BROKERS:
        raise SharedStreamError(f"--broker {name!r}: the demo runs on "
                                f"{', '.join(sorted(DEMO_BROKERS))} only for now")
    keep = None if args.keep is None else _check_keep(Path(args.keep))
    broker_class = demo_broker(name)
    broker_class.check_installed()
    configure_logging(args.log_level)
    workdir = _workdir(keep)
    broker: DemoBroker | None = None

    def clean_up(*, at_once: bool = False) -> None:
        """Stop the broker (``at_once``: kill it) and drop the temp directory; safe twice."""
        if broker is not None:
            broker.stop(at_once=at_once)
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)

    try:
        config = _write_config(workdir)
        with config.store.open_store(create=True) as store:
            store.migrate()
        broker = broker_class()
        where = broker.start(workdir)
        print(f"{where}; {args.messages} messages to {TOPIC}; working in {workdir}",
              file=sys.stderr, flush=True)
        return asyncio.run(_demo(broker, config, args.messages, workdir,
                                 keep=keep is not None, clean_up=clean_up))
    except KeyboardInterrupt:  # before the triggerer's handlers were in place
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        # A Ctrl-C now would leave the broker running: cleaning up is quick, let it finish.
        # Nor is it restored after: the demo is over, and a Ctrl-C on the way out would
        # only turn its exit status into a KeyboardInterrupt traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        clean_up()
