"""The triggerer: runs the watchers of a definitions file and stores what they fire.

Start-up registers the definitions in the metadata store (identical
triggers collapse into one row), then runs up to ``capacity`` active
triggers. A trigger with a shared-stream key subscribes through the
:class:`SharedStreamManager`, on every triggerer (the broker spreads the
messages over them); any other (standalone) runs its own ``run()`` on the
one triggerer the store assigns it to (:mod:`sharedstream.runtime.assignment`):
each heartbeat renews this triggerer's lease, records what it runs, and
claims the standalone triggers nobody live owns, up to the capacity the
shared ones leave. Every event
goes through the :class:`PersistGate`; in ack mode the broker is advanced
only after the gate confirmed the event's seq.

Supervision (:mod:`sharedstream.runtime.supervisor`): a trigger that raises
is recorded in the store (error and traceback) and restarted with
exponential backoff - a watcher never stops silently. A trigger whose
class is not registered, or whose stored kwargs cannot be decrypted, is
marked failed and not restarted. ``cleanup()`` always runs.

A shared-stream trigger is a durable member of its stream
(:meth:`SharedStreamManager.join`) and each attempt of its filter is one
:meth:`Membership.run_attempt`: when its filter raises, hangs past the ack
timeout or returns, only the raw event it was on fails (the broker
redelivers it, and the redelivery reaches the restarted filter); everything
fanned out meanwhile waits in its queue, and a full queue pauses the stream
instead of failing the trigger. The backoff is spent inside the next
attempt, before it starts consuming (capped there at half the ack
timeout). An event whose payload cannot be stored is refused at the
trigger: its raw event is rejected (dead-lettered by the producer) with the
reason.

Time-scheduled DAGs: the schedule loop (:mod:`sharedstream.runtime.schedule_loop`)
queues their runs, an owned task beside the triggers; with any such DAG
the triggerer runs until stopped, even with no trigger left.

Shutdown (SIGINT/SIGTERM): close every stream's intake first (no new raw
event is fanned out, whatever the backlog), give the watchers up to half of
``shutdown_timeout`` to work through what they already hold and the store
to write it, then stop the triggers and groups (resolved events are
advanced, producers closed), store the rest, sign off in the store (its
``triggerers`` row is deleted and its standalone triggers released, so
nobody counts it alive), exit 0 - all within ``shutdown_timeout``. A
trigger whose code turns the stop's cancellation into another exception
is not failed nor restarted for it. A second signal exits at once; the broker redelivers
whatever was not advanced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from opentelemetry.trace import TracerProvider

from sharedstream.connections import ConnectionNotFound, InvalidConnection
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.manager import SharedStreamManager
from sharedstream.engine.names import STREAM_NAMES
from sharedstream.engine.producer import DeadLetter
from sharedstream.engine.tracing import TRACER_NAME
from sharedstream.engine.trigger import BaseEventTrigger, uses_ack_mode
from sharedstream.runtime.assignment import Assignment
from sharedstream.runtime.batch_loop import BatchLoop
from sharedstream.runtime.collector import Collector, tune_collector
from sharedstream.runtime.config import Config
from sharedstream.runtime.config_connections import install_connections
from sharedstream.runtime.crypto import KwargsCipher
from sharedstream.runtime.definitions import Definitions, timetable_registry
from sharedstream.runtime.dispatch_setup import DispatchService, dispatch_plan
from sharedstream.runtime.failure_ledger import StoreFailureLedger
from sharedstream.runtime.ops import open_endpoint
from sharedstream.runtime.persist import PersistGate
from sharedstream.runtime.progress_log import report_progress
from sharedstream.runtime.registry import TriggerRegistry
from sharedstream.runtime.replay_loop import ReplayLoop
from sharedstream.runtime.retention import Retention
from sharedstream.runtime.schedule_loop import ScheduleLoop, dag_specs
from sharedstream.runtime.serde import (
    pack_kwargs,
)
from sharedstream.runtime.supervisor import Progress, Supervisor, TriggerEnded, Unrunnable
from sharedstream.runtime.traces import open_tracer_provider
from sharedstream.store import (
    Claim,
    MetadataStore,
    PendingEvent,
    TriggerRow,
    TriggerSpec,
    WatcherSpec,
    WriteResult,
    serves_one_triggerer,
    triggerer_guard,
)

__all__ = ["TriggerEnded", "Triggerer"]

log = key_value_logger("sharedstream.runtime")


def _say_stopping(signal_name: str) -> None:
    """The default :attr:`Triggerer.on_stop_signal`: one log line."""
    log.info("stopping (send the signal again to exit at once)", signal=signal_name)

T = TypeVar("T")

class Triggerer:
    """One triggerer process: its store thread, gate, engine and supervised triggers."""

    def __init__(
        self, config: Config, definitions: Definitions, *,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``tracer_provider``: trace with this provider whatever ``[traces]`` says (embedders)."""
        if not config.store.kwargs_key:
            raise SharedStreamError(
                "no kwargs encryption key configured ([store] kwargs_key or "
                "SHAREDSTREAM__STORE__KWARGS_KEY); `sharedstream init --path NEW.toml` writes a "
                "configuration with a new one"
            )
        self.config = config
        self.definitions = definitions
        # Triggers given a conn_id find the file's [connections.*] when their producer is built.
        install_connections(config.connections, config.file)
        self.cipher = KwargsCipher(config.store.kwargs_key)
        self.registry = TriggerRegistry()
        self.registry.load_entry_points()
        for classpath, cls in definitions.trigger_classes.items():
            self.registry.register(classpath, cls)
        self.triggerer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.dispatch = DispatchService(config, definitions, dispatch_plan(definitions, config),
                                        self.triggerer_id) if config.dispatch.enabled else None
        """Hands the queued runs to their targets (``[dispatch] enabled``), else ``None``."""
        tconf = config.triggerer
        self._close_traces: Callable[[], None] | None = None  # what shuts down our provider
        if tracer_provider is None:
            tracer_provider, self._close_traces = open_tracer_provider(config.traces)
        self.manager = SharedStreamManager(
            max_subscriber_queue=tconf.shared_stream_subscriber_queue_size,
            ack_timeout=tconf.shared_stream_ack_timeout,
            cohort_grace_period=tconf.shared_stream_cohort_grace_period,
            tracer_provider=tracer_provider,
        )
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sharedstream-db")
        self._store: MetadataStore | None = None
        self._guard = contextlib.ExitStack()  # what the store needs held while we run
        self.gate = PersistGate(
            write=partial(self.db, self._write),
            confirm=self.manager.confirm_persisted,
            batch_max=config.store.persist_batch_max,
            linger=config.store.persist_linger_ms / 1000,
            on_pressure=self._store_pressure,
            tracer=None if tracer_provider is None else tracer_provider.get_tracer(TRACER_NAME),
        )
        self.manager.dead_letter_fallback = self._keep_dead_letter
        self.manager.failure_ledger = StoreFailureLedger(lambda: self.store, self.db)
        self.progress = Progress()
        self.supervisor = Supervisor(
            config=tconf, cipher=self.cipher, registry=self.registry, manager=self.manager,
            gate=self.gate, progress=self.progress, store=lambda: self.store, db=self.db,
        )
        self._idle = False  # stopped because no trigger was left running
        self._schedules: ScheduleLoop | None = None  # set when a DAG is scheduled on time
        self._batches: BatchLoop | None = None  # set when a DAG's runs are batches
        self.on_stop_signal: Callable[[str], None] = _say_stopping
        """Says that a first signal (its name: ``"SIGTERM"``) began the graceful stop.

        By default a log line; the demo prints it instead."""
        self.exit_at_once: Callable[[int], None] = os._exit
        """What a second signal does, with the exit status (the demo cleans up first)."""
        self._stop = asyncio.Event()
        self._signals = 0
        self._standalone: dict[int, TriggerRow] = {}  # candidates for this triggerer
        self._shared: list[asyncio.Task[None]] = []
        self._room = 0  # standalone triggers it may own (capacity left by the shared ones)
        self._assignment: Assignment | None = None
        self._claim_now = asyncio.Event()  # a standalone trigger ended: claim again at once
        self._round_done = asyncio.Event()  # a claim round ended (the idle watch looks)
        self._shared_ids: list[int] = []
        self.replays: ReplayLoop | None = None
        """Runs the replays of this triggerer's watchers (set when it runs a shared stream)."""
        self.api = open_endpoint(self)
        """The operations endpoint (``[api] enabled``), served while :meth:`run` runs."""

    def _store_pressure(self, on: bool) -> None:
        """The gate is behind or the store failing: hold every stream's intake meanwhile."""
        if on:
            self.manager.intake.close("store")
            log.warning("the store is behind; pausing intake", queued=self.gate.queued,
                        store_failing=self.gate.store_failing)
        else:
            self.manager.intake.open("store")
            log.info("the store has caught up; intake resumed")

    async def _keep_dead_letter(self, letter: DeadLetter) -> None:
        """A producer's dead-letter fallback: the store's dead-letter table, durably.

        Raises if the store cannot write it (the producer's ``advance`` then
        fails, its group restarts and the broker redelivers the raw event).
        """
        new = await self.db(self.store.add_dead_letter, letter)
        if new:
            self.progress.fallbacks += 1
            log.warning("kept a dead letter in the store's table; see `sharedstream "
                        "deadletters list`", source=letter.source, stream=letter.stream,
                        reason=letter.reason)

    # -- database thread -------------------------------------------------------

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the single database thread (the store's connection lives there)."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, fn, *args)

    @property
    def store(self) -> MetadataStore:
        """The metadata store (``[store] url``); opened by :meth:`run` before anything uses it."""
        if self._store is None:
            raise SharedStreamError("the metadata store is not open (the triggerer is not running)")
        return self._store

    def _open_store(self) -> int:
        """Open the store, hold what it needs held (SQLite: the one-triggerer lock), migrate."""
        store = self.config.store.open_store()
        try:
            self._guard.enter_context(triggerer_guard(self.config.store.url))
            version = store.migrate()
        except BaseException:
            store.close()
            self._guard.close()
            raise
        self._store = store
        return version

    def _write(self, batch: Sequence[PendingEvent]) -> WriteResult:
        result = self.store.write_events(batch)
        if result.dag_runs and self.dispatch is not None:
            self.dispatch.wake_threadsafe()  # new runs: the dispatcher claims them now
        return result

    # -- start-up ---------------------------------------------------------------

    async def _register(self) -> list[TriggerRow]:
        version = await self.db(self._open_store)
        defs = self.definitions
        specs = [
            TriggerSpec(t.fingerprint, t.classpath, self.cipher.encrypt(pack_kwargs(t.kwargs)),
                        pinned=t.pinned, queue=t.queue)
            for t in defs.triggers.values()
        ]
        watchers = [
            WatcherSpec(asset, name, t.fingerprint)
            for t in defs.triggers.values()
            for asset, name in t.watchers
        ]
        plan = None if self.dispatch is None else self.dispatch.plan
        dags = dag_specs(defs, plan.stored_target if plan is not None else lambda _: None,
                         batch_asset_events=self.config.scheduler.batch_asset_events)
        store = self.store
        await self.db(store.sync_definitions, specs, watchers, dags)
        every = await self.db(store.active_triggers, sys.maxsize)
        rows = self._served(every)
        shared_ids = self._preflight(rows)
        capacity = self.config.triggerer.capacity
        shared = [row for row in rows if row.id in shared_ids][:capacity]
        self._standalone = {row.id: row for row in rows if row.id not in shared_ids}
        self._room = capacity - len(shared)
        log.info(
            "definitions registered; running triggers",
            store=store.location, schema=version, asset_count=len(defs.assets),
            watcher_count=len(watchers), trigger_count=len(specs), dag_count=len(dags),
            running=len(shared) + len(self._standalone), shared=len(shared),
            standalone=len(self._standalone),
        )
        if len(rows) < len(every):
            log.info("triggers of other trigger queues are left to their triggerers",
                     queues=self.config.triggerer.queues or "(none)",
                     other=len(every) - len(rows))
        log.info("this triggerer's id (see `sharedstream triggerers list`)",
                 triggerer=self.triggerer_id)
        for dag_id, why in ({} if plan is None else plan.waiting).items():
            log.info("this DAG's runs wait in the store", dag=dag_id, why=why)
        return shared

    def _served(self, rows: list[TriggerRow]) -> list[TriggerRow]:
        """The rows of the trigger queues this triggerer serves (``[triggerer] queues``).

        With no queue configured, the triggers with none; otherwise those
        whose queue is listed. Only these are built, subscribed and offered
        to the store's assignment: another queue's standalone triggers are
        never claimed here.
        """
        served = self.config.triggerer.served_queues
        if not served:
            return [row for row in rows if row.queue is None]
        return [row for row in rows if row.queue in served]

    def _preflight(self, rows: list[TriggerRow]) -> set[int]:
        """Build every trigger (and each stream's producer) once; refuse to start if one fails.

        Returns the ids of the shared-stream triggers (the others are standalone).

        A trigger whose kwargs its class no longer accepts, or whose broker
        extra is not installed, would otherwise fail and back off forever:
        that is a definitions or installation error, said in one line per
        watcher before anything runs. Producers connect to nothing when
        built (the producer contract), so this touches no broker. A missing
        or invalid connection fails only its own watchers (logged; the
        others run), unless no watcher is left: then it too refuses the start.
        Every stream is named here, all at once (see :mod:`sharedstream.engine.names`).
        """
        names = {t.fingerprint: t.watchers for t in self.definitions.triggers.values()}
        problems = []
        unconnected: list[tuple[str, str, Exception]] = []
        shared: set[int] = set()
        streams: list[tuple[Hashable, str | None]] = []
        for row in rows:
            watchers = ", ".join(f"{asset}/{name}" for asset, name in names.get(
                row.fingerprint, [])) or f"trigger {row.id}"
            try:
                trigger = self.supervisor.rehydrate(row)
                event = trigger if isinstance(trigger, BaseEventTrigger) else None
                key = None if event is None else event.shared_stream_key()
                if event is not None and key is not None:
                    shared.add(row.id)
                    streams.append((key, event.shared_stream_name()))
                    if uses_ack_mode(type(event)):
                        type(event).create_shared_stream_producer(trigger.serialize()[1])
            except (ConnectionNotFound, InvalidConnection) as exc:
                # The environment's fault, not the definitions': this stream is marked failed
                # when it starts (its producer raises the same), the others run.
                unconnected.append((watchers, row.classpath, exc))
            except (Unrunnable, SharedStreamError, ImportError, TypeError, ValueError) as exc:
                cause = exc.__cause__ if isinstance(exc, Unrunnable) and exc.__cause__ else exc
                problems.append(f"watcher {watchers} ({row.classpath}) cannot run: {cause}")
        if unconnected and len(unconnected) == len(rows):  # nothing could run: a start-up error
            problems += [f"watcher {who} ({classpath}) cannot run: {error}"
                         for who, classpath, error in unconnected]
        if problems:
            raise SharedStreamError("; ".join(problems))
        for who, classpath, error in unconnected:
            log.error("watcher cannot run", watchers=who, classpath=classpath, error=error)
        # Every stream named at once, before any starts: the same names on every restart.
        STREAM_NAMES.name_all(streams)
        return shared

    # -- running ------------------------------------------------------------------

    async def run(self) -> int:
        """Run until a stop signal; return the process exit code."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum)
        switch_interval = sys.getswitchinterval()
        if self.config.store.switch_interval_ms:
            # The database thread takes the GIL back after every SQLite statement;
            # with the default 5 ms it waits that long whenever the loop is busy.
            sys.setswitchinterval(self.config.store.switch_interval_ms / 1000)
        collector: Collector | None = None
        try:
            shared = await self._register()
            collector = tune_collector(self.config.triggerer.gc_gen0_threshold)
            if self.api is not None:
                await self.api.start()  # listens now: an address in use stops the start-up here
            async with asyncio.TaskGroup() as tasks:
                ops = None if self.api is None else tasks.create_task(
                    self.api.serve(), name="sharedstream-api")  # first: it owns the socket
                gate_task = tasks.create_task(self.gate.run(), name="sharedstream-persist-gate")
                self._shared = [
                    tasks.create_task(self.supervisor.supervise(row),
                                      name=f"sharedstream-trigger[{row.id}]")
                    for row in shared
                ]
                self._shared_ids = [row.id for row in shared]
                one = serves_one_triggerer(self.config.store.url)
                lease = None if one else self.config.triggerer.triggerer_health_check_threshold
                dispatching = await self._start_dispatch(tasks, alone=one)
                assignment = self._assignment = Assignment(
                    partial(self._start_standalone, tasks), lease)
                heartbeat = tasks.create_task(self._heartbeat(assignment, one),
                                              name="sharedstream-heartbeat")
                side = self._side_tasks(tasks, assignment, stay=dispatching)
                if ops is not None:
                    side.append(ops)  # cancelled last: the probes answer while it drains
                await self._stop.wait()
                await self._shutdown(assignment, heartbeat, side, gate_task)
        finally:
            try:
                await self._close(switch_interval, collector)
            finally:
                # Last: a signal while closing is still ours (a second one exits at once),
                # never a KeyboardInterrupt through whoever runs this coroutine.
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)
        totals = self.manager.totals
        log.info("stopped", stored=self.gate.stored, duplicates=self.gate.duplicates,
                 dag_runs=self.runs_queued, rejected=totals.rejected,
                 dead_lettered=totals.dead_lettered, kept_in_store=self.progress.fallbacks,
                 not_storable=self.progress.refused, store_retries=self.gate.failed_writes)
        if self._idle and self.progress.unrunnable:
            return 1  # it could do nothing useful: a supervisor restarts it, a person looks
        return 0

    def _side_tasks(self, tasks: asyncio.TaskGroup, assignment: Assignment, *,
                    stay: bool) -> list[asyncio.Task[None]]:
        """Progress lines, pruning, and the schedule loop or (unless ``stay``) the idle watch."""
        side = [tasks.create_task(report_progress(self), name="sharedstream-progress")]
        keep = self.config.store.retention_period
        if keep is not None:
            side.append(tasks.create_task(Retention(lambda: self.store, self.db, keep).run(),
                                          name="sharedstream-retention"))
        if any(spec.batching for spec in dag_specs(
                self.definitions, batch_asset_events=self.config.scheduler.batch_asset_events)):
            self._batches = BatchLoop(lambda: self.store, self.db, self._runs_made)
            side.append(tasks.create_task(self._batches.run(), name="sharedstream-batches"))
        if self._shared_ids:
            one = serves_one_triggerer(self.config.store.url)
            self.replays = ReplayLoop(
                store=lambda: self.store, db=self.db, write=self._write,
                rehydrate=self.supervisor.rehydrate, triggerer_id=self.triggerer_id,
                trigger_ids=lambda: self._shared_ids,
                threshold=0.0 if one else self.config.triggerer.triggerer_health_check_threshold)
            side.append(tasks.create_task(self.replays.run(), name="sharedstream-replays"))
        schedules = self._run_schedules(tasks)
        if schedules is not None:
            side.append(schedules)
        elif not stay:  # runs to dispatch are work enough to stay for
            side.append(tasks.create_task(self._stop_when_idle(assignment),
                                          name="sharedstream-idle-watch"))
        return side

    async def _close(self, switch_interval: float, collector: Collector | None) -> None:
        """Close the dispatcher's and the gate's stores, restore what :meth:`run` changed."""
        if self.dispatch is not None:
            await self.dispatch.close()
        if self._store is not None:
            await self.db(self._store.close)
        self._guard.close()
        self._db_thread.shutdown(wait=True)
        sys.setswitchinterval(switch_interval)
        if collector is not None:
            collector.restore()
        if self._close_traces is not None:  # flushes the spans still batched, off the loop
            await asyncio.to_thread(self._close_traces)

    async def _start_dispatch(self, tasks: asyncio.TaskGroup, *, alone: bool) -> bool:
        """Start the dispatcher if some DAG's runs have a target; whether it started.

        ``alone`` (a store serving one triggerer): every other claim is a
        dead triggerer's, taken over at once (threshold 0).
        """
        if self.dispatch is None or not self.dispatch.plan.routes:
            return False
        threshold = 0.0 if alone else self.config.triggerer.triggerer_health_check_threshold
        await self.dispatch.start(tasks, float(threshold))
        return True

    def _run_schedules(self, tasks: asyncio.TaskGroup) -> asyncio.Task[None] | None:
        """Start the schedule loop if a DAG is scheduled on time; ``None`` if none is.

        With it, the triggerer never stops for want of triggers (see
        :mod:`sharedstream.runtime.schedule_loop`; it sleeps at most
        ``job_heartbeat_sec`` between passes).
        """
        if not self.definitions.timetables:
            return None
        loop = self._schedules = ScheduleLoop(
            self.store, self.db, timetable_registry(self.definitions.timetable_classes),
            max_runs=self.config.scheduler.max_catchup_runs_per_loop,
            max_sleep=self.config.triggerer.job_heartbeat_sec)
        return tasks.create_task(loop.run(), name="sharedstream-schedule-loop")

    @property
    def runs_queued(self) -> int:
        """DAG runs this triggerer queued: asset-triggered (by the gate, batched) and scheduled."""
        return (self.gate.runs_queued + (self._schedules.queued if self._schedules else 0)
                + (self._batches.queued if self._batches else 0))

    def _runs_made(self, _runs: list[str]) -> None:
        """New runs outside the gate's writes (batches): the dispatcher looks now."""
        if self.dispatch is not None and self.dispatch.dispatcher is not None:
            self.dispatch.dispatcher.wake()

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what the first SIGINT/SIGTERM does)."""
        self._stop.set()

    @property
    def interrupted(self) -> bool:
        """Whether a stop signal arrived (as opposed to stopping because nothing was left)."""
        return self._signals > 0

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second stop signal: exiting at once", signal=signal.Signals(signum).name)
            self.exit_at_once(128 + signum)
            return
        self.on_stop_signal(signal.Signals(signum).name)
        self.request_stop()

    async def _shutdown(
        self,
        assignment: Assignment,
        heartbeat: asyncio.Task[None],
        side: list[asyncio.Task[None]],
        gate_task: asyncio.Task[None],
    ) -> None:
        budget = self.config.triggerer.shutdown_timeout
        self.supervisor.stopping = True  # a trigger failing from now on is not restarted
        self.manager.intake.close("stopping")  # from now on, only what is in flight
        assignment.close()  # no standalone trigger starts from now on
        heartbeat.cancel()  # nor is one claimed (the lease runs out, or is released below)
        supervisors = [*self._shared, *assignment.tasks]
        try:
            async with asyncio.timeout(budget):
                await self._finish_in_flight(budget / 2)
                for task in supervisors:
                    task.cancel()
                await asyncio.wait(supervisors) if supervisors else None
                await self.manager.stop_all()
                self.gate.stop()
                await gate_task
        except TimeoutError:
            log.error(  # noqa: TRY400 - a timeout has no useful traceback
                "shutdown timed out; leaving the rest to broker redelivery", timeout_s=budget)
            for task in [*supervisors, gate_task]:
                task.cancel()
        if self.dispatch is not None:  # after the gate: the runs it stored are queued
            await self.dispatch.stop(within=max(1.0, budget / 3))
        for task in side:
            task.cancel()
        await self._sign_off()

    async def _sign_off(self) -> None:
        """A clean stop: hand the standalone triggers back and remove this triggerer's row.

        Others take its triggers now, not after the health-check threshold,
        and ``triggerers list`` stops showing it alive. The single database
        thread runs this after any heartbeat still being written.
        """
        try:
            await self.db(self.store.sign_off, self.triggerer_id)
        except Exception:
            # Nothing is lost: its triggers are taken over, and it counts dead, once its
            # heartbeat is stale; retention removes the row.
            log.exception("could not sign this triggerer off in the store")

    async def _finish_in_flight(self, within: float) -> None:
        """Wait until the watchers hold no raw event and the store has written everything.

        Bounded by ``within`` seconds: what is left then is abandoned to
        broker redelivery (nothing unstored is ever advanced).
        """
        try:
            async with asyncio.timeout(within):
                while self.manager.lag() or self.gate.queued:  # noqa: ASYNC110 - several sources
                    await asyncio.sleep(0.02)
                await self.gate.flush()
        except TimeoutError:
            log.warning("stopping: watchers still held raw events; the broker redelivers them",
                        held=sum(q for _, _, q in self.manager.lag()), timeout_s=within)

    async def _stop_when_idle(self, assignment: Assignment) -> None:
        """Stop the triggerer once no trigger is left to run (all finished or failed).

        A standalone trigger another triggerer runs is still to run: this one
        stands by to take it over.
        """
        if self._shared:
            await asyncio.wait(self._shared)
        while not assignment.idle:
            self._round_done.clear()
            await self._round_done.wait()
        if self._stop.is_set():
            return
        self._idle = True
        if self.progress.unrunnable:
            log.error("no trigger left running; exiting", unrunnable=self.progress.unrunnable)
        else:
            log.info("every trigger finished; nothing left to run")
        self._stop.set()

    def _start_standalone(self, tasks: asyncio.TaskGroup, trigger_id: int) -> asyncio.Task[None]:
        """Supervise a standalone trigger the store assigned to this triggerer."""
        task = tasks.create_task(self.supervisor.supervise(self._standalone[trigger_id]),
                                 name=f"sharedstream-trigger[{trigger_id}]")
        task.add_done_callback(lambda _: self._claim_now.set())  # its end may free capacity
        return task

    def _beat(self, host: str, running: list[int], threshold: float) -> Claim:
        """One claim round, on the database thread: heartbeat (the lease), then claim."""
        store = self.store
        store.heartbeat(self.triggerer_id, host, os.getpid(), running)
        return store.claim_triggers(self.triggerer_id, sorted(self._standalone), self._room,
                                    threshold)

    async def _heartbeat(self, assignment: Assignment, alone: bool) -> None:
        """Claim rounds every ``job_heartbeat_sec`` (at once after a standalone trigger ended).

        ``alone`` (a store serving one triggerer, which holds its guard):
        every other triggerer recorded is dead, so their triggers are taken at
        once (threshold 0). A round that fails is logged and retried next
        interval; it does not stop shared-stream triggers, but once the lease
        of the last good round ends the standalone ones are stopped here
        (:meth:`Assignment.expire`), since another triggerer may take them.
        """
        tconf = self.config.triggerer
        interval = tconf.job_heartbeat_sec
        threshold = 0.0 if alone else tconf.triggerer_health_check_threshold
        host = socket.gethostname()
        loop = asyncio.get_running_loop()
        while True:
            self._claim_now.clear()
            began = loop.time()
            running = sorted({*assignment.running, *(
                row_id for row_id, task in zip(self._shared_ids, self._shared, strict=True)
                if not task.done())})
            beat = loop.run_in_executor(self._db_thread, self._beat, host, running, threshold)
            try:
                while not (await asyncio.wait({beat}, timeout=assignment.expire(loop.time())))[0]:
                    pass  # late: expire() fenced the standalone triggers if the lease ended
                assignment.apply(beat.result(), began)
            except Exception:
                # A missed heartbeat: retried next interval; the lease (above) decides.
                log.exception("heartbeat failed")
            self._round_done.set()
            wait = min(interval, assignment.expire(loop.time()) or interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._claim_now.wait()
