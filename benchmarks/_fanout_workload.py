"""Child process of the fan-out benchmark: one configuration of one implementation.

``benchmarks/fanout.py`` runs this file once per configuration, in a fresh
interpreter, so peak memory is measured per configuration::

    python benchmarks/_fanout_workload.py --impl ours --mode ack --subscribers 100 \\
        --events 20000 --emit-every 10 --batch 256

It prints exactly one JSON object (the measurements) on stdout.

The same file drives both implementations. Importing it imports neither of
them: :func:`load_api` loads the one under test by module name, so the
Airflow child runs in a virtualenv where ``sharedstream`` is not installed
and ours never imports Airflow. The workload classes are built at run time
on top of the loaded base classes (:func:`build_trigger_class`), so the
trigger, producer, filter and runner code is byte-for-byte the same for both.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import dataclasses
import gc
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import resource
import sys
import time
import types
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

KEY = ("benchmark", "fanout")
"""The shared-stream key every trigger of a run returns: one group per run."""

MAX_SUBSCRIBER_QUEUE = 1024
"""Passed explicitly to both managers (it is also both defaults)."""

ACK_TIMEOUT = 300.0
"""Passed explicitly to both managers (it is also both defaults); never reached here."""

RUN_TIMEOUT = 300.0
"""Seconds a run may take before the child gives up and reports an error."""


@dataclass(frozen=True)
class Api:
    """The pieces of one implementation the workload needs, loaded by name."""

    impl: str
    version: str
    module_file: str
    manager_factory: Callable[[], Any]
    trigger_base: type[Any]
    producer_base: type[Any]
    trigger_event: Callable[[Any], Any]
    keyed_prefilter: Callable[[Any, Callable[[Any], Any], Any], Any] | None = None
    """Ours only: ``KeyedPrefilter(shape, select, wanted)``; Airflow's engine has no prefilter."""


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_api(impl: str) -> Api:
    """Import the implementation ``impl`` (``"ours"`` or ``"airflow"``) and quiet its logging.

    Airflow logs through structlog; it is reconfigured to drop everything
    below WARNING, and the manager gets such a logger explicitly, so log
    calls cost both implementations next to nothing.
    """
    if impl == "ours":
        ours = importlib.import_module("sharedstream")
        logging.getLogger("sharedstream").setLevel(logging.WARNING)

        def make_ours() -> Any:
            return ours.SharedStreamManager(
                max_subscriber_queue=MAX_SUBSCRIBER_QUEUE, ack_timeout=ACK_TIMEOUT
            )

        return Api(
            impl=impl,
            version=str(ours.__version__),
            module_file=str(ours.__file__),
            manager_factory=make_ours,
            trigger_base=ours.BaseEventTrigger,
            producer_base=ours.SharedStreamProducer,
            trigger_event=ours.TriggerEvent,
            keyed_prefilter=importlib.import_module("sharedstream.engine.fanout").KeyedPrefilter,
        )
    if impl == "airflow":
        shared = importlib.import_module("airflow.triggers.shared_stream")
        base = importlib.import_module("airflow.triggers.base")
        structlog = importlib.import_module("structlog")
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            cache_logger_on_first_use=True,
        )
        logging.getLogger().setLevel(logging.WARNING)
        quiet_log = structlog.get_logger("benchmark.fanout")

        def make_airflow() -> Any:
            return shared.SharedStreamManager(
                log=quiet_log, max_subscriber_queue=MAX_SUBSCRIBER_QUEUE, ack_timeout=ACK_TIMEOUT
            )

        return Api(
            impl=impl,
            version=_dist_version("apache-airflow-core"),
            module_file=str(shared.__file__),
            manager_factory=make_airflow,
            trigger_base=base.BaseEventTrigger,
            producer_base=shared.SharedStreamProducer,
            trigger_event=base.TriggerEvent,
        )
    raise ValueError(f"unknown implementation {impl!r} (expected 'ours' or 'airflow')")


class PlainEvent:
    """A minimal event both implementations can carry (``--trigger-event plain``).

    Neither engine looks inside the events a filter yields, so swapping each
    implementation's own ``TriggerEvent`` (Airflow's is a pydantic model) for
    this class isolates the engines' costs from the event class's.
    """

    __slots__ = ("payload",)

    def __init__(self, payload: Any) -> None:
        self.payload = payload


class Stats:
    """What one run measures, shared by the source, the producer and the filters.

    Both float arrays are allocated before the memory baseline is taken,
    so they do not count as growth.
    """

    def __init__(self, n_events: int, subscribers: int, done: asyncio.Future[None]) -> None:
        self.n_events = n_events
        self.subscribers = subscribers
        self.done = done
        self.fanout_at = array.array("d", bytes(8 * n_events))
        self.latency = array.array("d", bytes(8 * n_events))
        self.advanced = 0
        self.advance_calls = 0
        self.unclean = 0
        self.unclean_samples: list[tuple[int, int, int, int]] = []
        self.subscribers_done = 0
        self.emitted = 0
        self.bound = 0

    def record_unclean(self, offset: int, outcome: Any) -> None:
        """Count an event advanced with failed or rejected subscribers (or none acked)."""
        self.unclean += 1
        if len(self.unclean_samples) < 5:
            sample = (offset, outcome.acked, outcome.failed, outcome.rejected)
            self.unclean_samples.append(sample)

    def finish(self) -> None:
        """Mark the run complete (idempotent)."""
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, error: BaseException) -> None:
        """End the run with ``error`` (idempotent)."""
        if not self.done.done():
            self.done.set_exception(error)


def build_producer_class(api: Api, stats: Stats) -> type[Any]:
    """An in-memory ack-mode producer on top of ``api``'s ``SharedStreamProducer``.

    ``open_stream`` yields ``(i, i)`` for ``i`` in ``range(n)``, stamping the
    fan-out time of each event and suspending every ``batch`` events, then
    waits forever. ``advance`` records each item's fan-out-to-advance
    latency and finishes the run once all ``n`` events are advanced.
    """

    def init(self: Any, kwargs: dict[str, Any]) -> None:
        self.n_events = kwargs["n_events"]
        self.batch = kwargs["batch"]

    async def open_stream(self: Any) -> AsyncIterator[tuple[int, int]]:
        stamps = stats.fanout_at
        clock = time.perf_counter
        sleep = asyncio.sleep
        batch = self.batch
        for i in range(self.n_events):
            stamps[i] = clock()
            yield i, i
            if not (i + 1) % batch:
                await sleep(0)
        await asyncio.get_running_loop().create_future()  # never returns: cancelled at stop

    async def advance(self: Any, batch: Sequence[Any]) -> None:
        now = time.perf_counter()
        stamps = stats.fanout_at
        latency = stats.latency
        done = stats.advanced
        for item in batch:
            offset = item.broker_payload
            latency[done] = now - stamps[offset]
            done += 1
            if not item.outcome.is_clean:
                stats.record_unclean(offset, item.outcome)
        stats.advanced = done
        stats.advance_calls += 1
        if done >= stats.n_events:
            stats.finish()

    def body(ns: dict[str, Any]) -> None:
        ns.update(__init__=init, open_stream=open_stream, advance=advance)

    return types.new_class("FanoutBenchProducer", (api.producer_base,), exec_body=body)


def build_trigger_class(api: Api, stats: Stats, *, ack: bool) -> type[Any]:
    """The benchmark trigger on top of ``api``'s ``BaseEventTrigger``.

    Fast path (``ack=False``): the classmethod ``open_shared_stream`` yields
    the raw events exactly as the producer does. Ack mode: the classmethod
    ``create_shared_stream_producer`` returns the producer of
    :func:`build_producer_class`. The filter emits a ``TriggerEvent`` for
    every raw event with ``raw % emit_every == 0`` and counts the raw events
    it saw; a subscriber that saw all of them reports itself done.

    Selective workload (``modulus > 0``): trigger ``i`` wants the raw events
    with ``raw % modulus == i`` (one customer, one tenant, one device) and
    emits one event for each. The filter tests that itself, so it is the
    same code on both engines; ours also declares it as a keyed prefilter
    (one selection per raw event for all subscribers, then a dict lookup),
    so its filter only sees the raw events it wants. Airflow's engine has no
    prefilter: every filter sees every raw event.
    """
    trigger_event = api.trigger_event
    base_init = api.trigger_base.__init__
    producer_class = build_producer_class(api, stats) if ack else None

    keyed_prefilter = api.keyed_prefilter

    def init(
        self: Any, *, n_events: int, batch: int, emit_every: int, modulus: int = 0, wanted: int = 0
    ) -> None:
        base_init(self)
        self.n_events = n_events
        self.batch = batch
        self.emit_every = emit_every
        self.modulus = modulus
        self.wanted = wanted
        # How many raw events this filter is handed: with a prefilter, only its own.
        prefiltered = modulus and keyed_prefilter is not None
        self.expected_seen = len(range(wanted, n_events, modulus)) if prefiltered else n_events

    def serialize(self: Any) -> tuple[str, dict[str, Any]]:
        kwargs = {
            "n_events": self.n_events, "batch": self.batch, "emit_every": self.emit_every,
            "modulus": self.modulus, "wanted": self.wanted,
        }  # fmt: skip
        return f"{__name__}.FanoutBenchTrigger", kwargs

    def shared_stream_prefilter(self: Any) -> Any:
        if not self.modulus or keyed_prefilter is None:
            return None
        modulus = self.modulus
        return keyed_prefilter(("residue", modulus), lambda raw: raw % modulus, self.wanted)

    def run(self: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the benchmark trigger only runs through a shared stream")

    def shared_stream_key(self: Any) -> Any:
        return KEY

    async def open_shared_stream(cls: Any, kwargs: dict[str, Any]) -> AsyncIterator[int]:
        stamps = stats.fanout_at
        clock = time.perf_counter
        sleep = asyncio.sleep
        batch = kwargs["batch"]
        for i in range(kwargs["n_events"]):
            stamps[i] = clock()
            yield i
            if not (i + 1) % batch:
                await sleep(0)
        await asyncio.get_running_loop().create_future()  # never returns: cancelled at stop

    def create_shared_stream_producer(cls: Any, kwargs: dict[str, Any]) -> Any:
        if producer_class is None:  # only installed in ack mode
            raise RuntimeError("create_shared_stream_producer called on the fast path")
        return producer_class(kwargs)

    async def filter_shared_stream(
        self: Any, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        emit_every = self.emit_every
        modulus, wanted = self.modulus, self.wanted
        expected_seen = self.expected_seen
        seen = 0
        async for raw in shared_stream:
            seen += 1
            if modulus:
                if raw % modulus == wanted:
                    yield trigger_event(raw)
            elif raw % emit_every == 0:
                yield trigger_event(raw)
            if seen == expected_seen:
                stats.subscribers_done += 1
                if not ack and stats.subscribers_done == stats.subscribers:
                    stats.finish()

    def body(ns: dict[str, Any]) -> None:
        ns.update(
            __init__=init,
            serialize=serialize,
            run=run,
            shared_stream_key=shared_stream_key,
            filter_shared_stream=filter_shared_stream,
        )
        if keyed_prefilter is not None:
            ns["shared_stream_prefilter"] = shared_stream_prefilter
        if ack:
            ns["create_shared_stream_producer"] = classmethod(create_shared_stream_producer)
        else:
            ns["open_shared_stream"] = classmethod(open_shared_stream)

    return types.new_class("FanoutBenchTrigger", (api.trigger_base,), exec_body=body)


def _proc_status_kb(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or ``None`` off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; ``False`` if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def current_rss_kb() -> int:
    """Resident set size now, in KiB (falls back to ``ru_maxrss`` off Linux)."""
    rss = _proc_status_kb("VmRSS")
    return rss if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_rss_kb() -> int:
    """Peak resident set size of this process, in KiB.

    ``ru_maxrss`` is the kernel's high-water mark of this process's memory,
    but it also folds in the high-water mark of the address space that
    exec'd it - with ``vfork``-based ``subprocess`` that is the parent's.
    ``VmHWM`` is the same high-water mark for this address space alone (and
    :func:`reset_peak_rss` resets it), so it is preferred where it exists.
    """
    hwm = _proc_status_kb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def percentiles_us(samples: array.array[float], count: int) -> dict[str, float]:
    """p50/p95/p99/max of the first ``count`` samples (seconds), in microseconds."""
    if count == 0:
        return {}
    ordered = sorted(samples[:count])

    def at(q: float) -> float:
        return ordered[min(count - 1, int(q * count))] * 1e6

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1] * 1e6}


@dataclass(frozen=True)
class Config:
    """One benchmark configuration."""

    impl: str
    mode: str
    subscribers: int
    n_events: int
    emit_every: int
    batch: int
    trigger_event: str = "native"
    selective: bool = False
    """Trigger ``i`` of K wants only the raw events ``raw % K == i`` (see build_trigger_class)."""
    gc_gen0: int = 0
    """The collector's young-generation threshold during the run (0: Python's 700)."""


class Confirmer:
    """The runner's persist confirmations: seqs waiting, and the one task confirming them.

    Runners append each bound seq and wake the task, which confirms
    everything pending in one ``confirm_persisted`` call as soon as it runs
    (prompt confirmations, batched per event-loop pass).
    """

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.pending: list[int] = []
        self.wakeup = asyncio.Event()
        self.calls = 0

    def add(self, seq: int) -> None:
        """Queue one seq for confirmation and wake the confirming task."""
        self.pending.append(seq)
        self.wakeup.set()

    async def run(self) -> None:
        """Confirm whatever is pending each time it is woken, until cancelled."""
        confirm = self.manager.confirm_persisted
        pending = self.pending
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            if pending:
                batch = pending.copy()
                pending.clear()
                confirm(batch)
                self.calls += 1


async def _run_subscriber(
    manager: Any, trigger: Any, trigger_id: int, stats: Stats, confirmer: Confirmer
) -> None:
    """Drive one trigger the way a trigger runner does."""
    bind = manager.bind_pending_event
    add = confirmer.add
    stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=KEY)
    async for _event in trigger.filter_shared_stream(stream):
        stats.emitted += 1
        seq = bind(trigger_id=trigger_id, key=KEY)
        if seq is not None:
            stats.bound += 1
            add(seq)


async def run_config(api: Api, config: Config) -> dict[str, Any]:
    """Run one configuration to completion and return its measurements."""
    loop = asyncio.get_running_loop()
    ack = config.mode == "ack"
    stats = Stats(config.n_events, config.subscribers, loop.create_future())
    trigger_class = build_trigger_class(api, stats, ack=ack)
    manager = api.manager_factory()
    triggers = []
    for trigger_id in range(config.subscribers):
        trigger = trigger_class(
            n_events=config.n_events,
            batch=config.batch,
            emit_every=config.emit_every,
            modulus=config.subscribers if config.selective else 0,
            wanted=trigger_id,
        )
        trigger.trigger_id = trigger_id
        triggers.append(trigger)
    confirmer = Confirmer(manager)

    def on_runner_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            stats.fail(task.exception() or RuntimeError("runner failed"))

    gc.collect()
    gc.freeze()
    if config.gc_gen0 > 0:  # what a triggerer sets ([triggerer] gc_gen0_threshold), for both
        gc.set_threshold(config.gc_gen0, *gc.get_threshold()[1:])
    peak_reset = reset_peak_rss()
    rss_before = current_rss_kb()
    gc_before = [gen["collections"] for gen in gc.get_stats()]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    confirm_task = loop.create_task(confirmer.run())
    runners = []
    for trigger_id, trigger in enumerate(triggers):
        task = loop.create_task(_run_subscriber(manager, trigger, trigger_id, stats, confirmer))
        task.add_done_callback(on_runner_done)
        runners.append(task)
    await asyncio.wait([stats.done], timeout=RUN_TIMEOUT)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    peak = peak_rss_kb()
    gc_runs = [gen["collections"] - n for gen, n in zip(gc.get_stats(), gc_before, strict=True)]

    error = None
    if not stats.done.done():
        error = f"timed out after {RUN_TIMEOUT}s"
    elif (failure := stats.done.exception()) is not None:  # a runner failed
        error = f"{type(failure).__qualname__}: {failure}"

    t1 = time.perf_counter()
    for task in [*runners, confirm_task]:
        task.cancel()
    await asyncio.gather(*runners, confirm_task, return_exceptions=True)
    await manager.stop_all()
    teardown = time.perf_counter() - t1

    pairs = config.n_events * config.subscribers
    if config.selective:  # every raw event is wanted by exactly one subscriber
        emitted_expected = config.n_events
    else:
        emitted_expected = len(range(0, config.n_events, config.emit_every)) * config.subscribers
    checks = {
        "subscribers_done": stats.subscribers_done == config.subscribers,
        "emitted": stats.emitted == emitted_expected,
    }
    if ack:
        checks["advanced"] = stats.advanced == config.n_events
        checks["all_clean"] = stats.unclean == 0
        checks["bound"] = stats.bound == stats.emitted
    result: dict[str, Any] = {
        "impl": config.impl,
        "version": api.version,
        "module_file": api.module_file,
        "mode": config.mode,
        "emit_every": config.emit_every,
        "workload": "selective" if config.selective else "broadcast",
        "prefilter": bool(config.selective and api.keyed_prefilter is not None),
        "subscribers": config.subscribers,
        "events": config.n_events,
        "batch": config.batch,
        "trigger_event": config.trigger_event,
        "pairs": pairs,
        "wall_s": wall,
        "cpu_s": cpu,
        "us_per_pair": wall / pairs * 1e6,
        "events_per_s": config.n_events / wall,
        "rss_before_mb": rss_before / 1024,
        "rss_peak_mb": peak / 1024,
        "rss_growth_mb": max(0, peak - rss_before) / 1024,
        "rss_peak_reset": peak_reset,
        "teardown_s": teardown,
        "trigger_events": stats.emitted,
        "advance_calls": stats.advance_calls,
        "unclean_events": stats.unclean,
        "unclean_samples": stats.unclean_samples,
        "confirm_calls": confirmer.calls,
        "latency_us": percentiles_us(stats.latency, stats.advanced) if ack else None,
        "checks": checks,
        "ok": error is None and all(checks.values()),
        "error": error,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "gc_frozen": gc.get_freeze_count(),
        "gc_gen0_threshold": gc.get_threshold()[0],
        "gc_collections": gc_runs,
    }
    return result


def _parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=["ours", "airflow"], required=True)
    parser.add_argument("--mode", choices=["ack", "fast"], required=True)
    parser.add_argument("--subscribers", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--emit-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--trigger-event", choices=["native", "plain"], default="native")
    parser.add_argument(
        "--selective",
        action="store_true",
        help="trigger i of K wants only the raw events with raw %% K == i (keyed prefilter)",
    )
    parser.add_argument("--gc-gen0", type=int, default=0,
                        help="the garbage collector's young-generation threshold during the run "
                             "(0: Python's default)")
    args = parser.parse_args(argv)
    if args.subscribers < 1 or args.events < 1 or args.emit_every < 1 or args.batch < 1:
        parser.error("--subscribers, --events, --emit-every and --batch must be >= 1")
    if args.selective and args.events < args.subscribers:
        parser.error("--selective needs --events >= --subscribers (every trigger wants one)")
    return Config(
        impl=args.impl,
        mode=args.mode,
        subscribers=args.subscribers,
        n_events=args.events,
        emit_every=args.emit_every,
        batch=args.batch,
        trigger_event=args.trigger_event,
        selective=args.selective,
        gc_gen0=args.gc_gen0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: run one configuration and print its JSON result on stdout."""
    config = _parse_args(argv)
    api = load_api(config.impl)
    if config.trigger_event == "plain":
        api = dataclasses.replace(api, trigger_event=PlainEvent)
    result = asyncio.run(run_config(api, config))
    result["platform"] = platform.platform()
    result["pid"] = os.getpid()
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
