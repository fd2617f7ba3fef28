"""The triggerer: runs the watchers of a definitions file and stores what they fire.

Start-up registers the definitions in the metadata store (identical
triggers collapse into one row), then runs up to ``capacity`` active
triggers. A trigger with a shared-stream key subscribes through the
:class:`SharedStreamManager`; any other runs its own ``run()``. Every event
goes through the :class:`PersistGate`; in ack mode the broker is advanced
only after the gate confirmed the event's seq.

Supervision: a trigger that raises is recorded in the store (error and
traceback) and restarted with exponential backoff - a watcher never stops
silently. A trigger whose class is not registered, or whose stored kwargs
cannot be decrypted, is marked failed and not restarted. ``cleanup()``
always runs.

Restarting a shared-stream subscriber leaves no gap: when it fails while
its group lives on, its old subscription is failed (everything it owed is
redelivered) and a new one is taken *in the same synchronous step*, before
anything else runs. The redelivered events therefore reach the restarted
trigger too, instead of being acknowledged by the other subscribers alone.
The backoff is then spent before the new filter starts consuming (capped
at half the ack timeout, so waiting does not itself time out).

Shutdown (SIGINT/SIGTERM): stop taking work, store what is queued, stop
the triggers and groups (resolved events are advanced, producers closed),
store the rest, exit 0 - all within ``shutdown_timeout``. A second signal
exits at once; the broker redelivers whatever was not advanced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from sharedstream.config import Config
from sharedstream.crypto import KwargsCipher
from sharedstream.definitions import Definitions
from sharedstream.errors import SharedStreamError
from sharedstream.events import TriggerEvent
from sharedstream.manager import SharedStreamManager
from sharedstream.persist import PersistGate
from sharedstream.registry import TriggerRegistry
from sharedstream.serde import pack_event_payload, pack_kwargs, unpack_kwargs
from sharedstream.store.base import DagSpec, PendingEvent, TriggerRow, TriggerSpec, WatcherSpec
from sharedstream.store.sqlite import SqliteStore
from sharedstream.telemetry import instruments
from sharedstream.trigger import BaseEventTrigger, BaseTrigger

__all__ = ["TriggerEnded", "Triggerer"]

log = logging.getLogger("sharedstream.runtime")

T = TypeVar("T")

CLEANUP_TIMEOUT = 10.0
"""Seconds one trigger's ``cleanup()`` may take before it is abandoned."""

STABLE_AFTER = 60.0
"""A trigger that ran this many seconds before failing restarts with the initial backoff."""


class TriggerEnded(SharedStreamError):
    """A watcher's filter or ``run()`` ended in a way a watcher must not (restarted)."""

    retryable = True


class _Unrunnable(SharedStreamError):
    """The trigger cannot be built at all (unregistered class, undecryptable kwargs)."""


@dataclass
class _Attempt:
    """A supervised trigger's subscription, kept across restarts to avoid gaps."""

    trigger_id: int
    stream: AsyncIterator[Any] | None = None
    key: Hashable | None = None


@dataclass
class _Progress:
    running: int = 0
    restarts: int = 0


class Triggerer:
    """One triggerer process: its store thread, gate, engine and supervised triggers."""

    def __init__(self, config: Config, definitions: Definitions) -> None:
        if not config.store.kwargs_key:
            raise SharedStreamError(
                "no kwargs encryption key configured ([store] kwargs_key or "
                "SHAREDSTREAM__STORE__KWARGS_KEY); run `sharedstream init` to create one"
            )
        self.config = config
        self.definitions = definitions
        self.cipher = KwargsCipher(config.store.kwargs_key)
        self.registry = TriggerRegistry()
        self.registry.load_entry_points()
        for classpath, cls in definitions.trigger_classes.items():
            self.registry.register(classpath, cls)
        self.triggerer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        tconf = config.triggerer
        self.manager = SharedStreamManager(
            max_subscriber_queue=tconf.shared_stream_subscriber_queue_size,
            ack_timeout=tconf.shared_stream_ack_timeout,
            cohort_grace_period=tconf.shared_stream_cohort_grace_period,
        )
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sharedstream-db")
        self._store: SqliteStore | None = None
        self.gate = PersistGate(
            write=partial(self._db, self._write),
            confirm=self.manager.confirm_persisted,
            batch_max=config.store.persist_batch_max,
            linger=config.store.persist_linger_ms / 1000,
        )
        self.progress = _Progress()
        self._stop = asyncio.Event()
        self._signals = 0

    # -- database thread -------------------------------------------------------

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the single database thread (the store's connection lives there)."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, fn, *args)

    def _open_store(self) -> int:
        self._store = SqliteStore(self.config.sqlite_path())
        return self._store.migrate()

    def _write(self, batch: Any) -> Any:
        assert self._store is not None  # noqa: S101 - opened before any write
        return self._store.write_events(batch)

    def _call_store(self, method: str, *args: Any) -> Any:
        assert self._store is not None  # noqa: S101 - opened before any call
        return getattr(self._store, method)(*args)

    async def _store_call(self, method: str, *args: Any) -> Any:
        return await self._db(self._call_store, method, *args)

    # -- start-up ---------------------------------------------------------------

    async def _register(self) -> list[TriggerRow]:
        version = await self._db(self._open_store)
        defs = self.definitions
        specs = [
            TriggerSpec(t.fingerprint, t.classpath, self.cipher.encrypt(pack_kwargs(t.kwargs)))
            for t in defs.triggers.values()
        ]
        watchers = [
            WatcherSpec(asset, name, t.fingerprint)
            for t in defs.triggers.values()
            for asset, name in t.watchers
        ]
        dags = [DagSpec(d.dag_id, d.schedule.to_tree()) for d in defs.dags.values()]
        await self._store_call("sync_definitions", specs, watchers, dags)
        rows: list[TriggerRow] = await self._store_call(
            "active_triggers", self.config.triggerer.capacity
        )
        log.info(
            "store %s (schema v%d): %d assets, %d watchers -> %d triggers, %d DAGs; running %d",
            self.config.sqlite_path(), version, len(defs.assets), len(watchers), len(specs),
            len(dags), len(rows),
        )
        return rows

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
        try:
            rows = await self._register()
            async with asyncio.TaskGroup() as tasks:
                gate_task = tasks.create_task(self.gate.run(), name="sharedstream-persist-gate")
                side = [
                    tasks.create_task(self._heartbeat(), name="sharedstream-heartbeat"),
                    tasks.create_task(self._report_progress(), name="sharedstream-progress"),
                ]
                supervisors = [
                    tasks.create_task(self._supervise(row), name=f"sharedstream-trigger[{row.id}]")
                    for row in rows
                ]
                await self._stop.wait()
                await self._shutdown(supervisors, side, gate_task)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            if self._store is not None:
                await self._db(self._store.close)
            self._db_thread.shutdown(wait=True)
            sys.setswitchinterval(switch_interval)
        log.info("stopped: %d events stored, %d duplicates skipped, %d DAG runs queued, "
                 "%d refused by the store", self.gate.stored, self.gate.duplicates,
                 self.gate.runs_queued, self.gate.dropped)
        return 0

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what the first SIGINT/SIGTERM does)."""
        self._stop.set()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: exiting at once", signal.Signals(signum).name)
            os._exit(128 + signum)
        log.info("%s: stopping (send it again to exit at once)", signal.Signals(signum).name)
        self.request_stop()

    async def _shutdown(
        self,
        supervisors: list[asyncio.Task[None]],
        side: list[asyncio.Task[None]],
        gate_task: asyncio.Task[None],
    ) -> None:
        budget = self.config.triggerer.shutdown_timeout
        try:
            async with asyncio.timeout(budget):
                await self.gate.flush()  # what is queued now is confirmed before groups stop
                for task in supervisors:
                    task.cancel()
                await asyncio.wait(supervisors) if supervisors else None
                await self.manager.stop_all()
                self.gate.stop()
                await gate_task
        except TimeoutError:
            log.error(  # noqa: TRY400 - a timeout has no useful traceback
                "shutdown took over %ss; leaving the rest to broker redelivery", budget
            )
            for task in [*supervisors, gate_task]:
                task.cancel()
        for task in side:
            task.cancel()

    async def _heartbeat(self) -> None:
        interval = self.config.triggerer.job_heartbeat_sec
        host = socket.gethostname()
        while True:
            try:
                await self._store_call("heartbeat", self.triggerer_id, host, os.getpid())
            except Exception:
                # A missed heartbeat is reported and retried next interval; it
                # does not stop the triggers.
                log.exception("heartbeat failed")
            await asyncio.sleep(interval)

    async def _report_progress(self, every: float = 10.0) -> None:
        last = 0
        while True:
            await asyncio.sleep(every)
            stored = self.gate.stored
            log.info(
                "progress: %d triggers running, %d events stored (+%d), %d duplicates, "
                "%d DAG runs queued, %d refused by the store, last commit %.1f ms",
                self.progress.running, stored, stored - last, self.gate.duplicates,
                self.gate.runs_queued, self.gate.dropped, self.gate.last_confirm_latency * 1000,
            )
            last = stored

    # -- one trigger ------------------------------------------------------------------

    def _rehydrate(self, row: TriggerRow) -> BaseTrigger:
        try:
            kwargs = unpack_kwargs(self.cipher.decrypt(row.kwargs_blob))
            trigger = self.registry.rehydrate(row.classpath, kwargs)
        except (SharedStreamError, TypeError, ValueError) as exc:
            raise _Unrunnable(f"trigger {row.id} ({row.classpath}): {exc}") from exc
        trigger.trigger_id = row.id
        return trigger

    async def _supervise(self, row: TriggerRow) -> None:
        tconf = self.config.triggerer
        backoff = tconf.restart_backoff_initial
        delay = 0.0  # before consuming (a kept subscription) or before starting again
        attempt = _Attempt(row.id)
        loop = asyncio.get_running_loop()
        while True:
            try:
                trigger = self._rehydrate(row)
            except _Unrunnable as exc:
                log.error("not running %s", exc)  # noqa: TRY400 - the reason is the message
                await self._release(attempt)
                await self._note("record_trigger_error", row.id, str(exc), "")
                await self._note("set_trigger_state", row.id, "failed")
                return
            if attempt.stream is None and delay:
                await asyncio.sleep(delay)  # nothing held: back off before starting again
                delay = 0.0
            started = loop.time()
            finished = False
            self.progress.running += 1
            instruments().triggers_running.add(1)
            try:
                finished = await self._run_once(attempt, trigger, delay)
            except Exception as exc:  # noqa: BLE001 - the trigger's own code failed
                # Any failure of the trigger's own code: record it, restart it.
                log.warning("trigger %d (%s) failed: %s: %s; restarting in %.1fs",
                            row.id, row.classpath, type(exc).__name__, exc, backoff)
                await self._note(
                    "record_trigger_error", row.id, f"{type(exc).__name__}: {exc}",
                    "".join(traceback.format_exception(exc)),
                )
            finally:
                self.progress.running -= 1
                instruments().triggers_running.add(-1)
                await self._cleanup(row.id, trigger)
            if finished:
                await self._note("set_trigger_state", row.id, "finished")
                return
            if loop.time() - started >= STABLE_AFTER:
                backoff = tconf.restart_backoff_initial
            self.progress.restarts += 1
            delay = backoff
            if attempt.stream is not None:  # consuming waits; keep clear of the ack timeout
                delay = min(delay, tconf.shared_stream_ack_timeout / 2)
            backoff = min(backoff * 2, tconf.restart_backoff_max)

    async def _note(self, method: str, *args: Any) -> None:
        """Record trigger bookkeeping in the store; a failure is logged, not raised.

        Losing an error note must not stop the supervisor (and with it the
        triggerer): the trigger keeps being supervised either way.
        """
        try:
            await self._store_call(method, *args)
        except Exception:
            # Only the record is lost; the log line carries the same facts.
            log.exception("could not record %s for trigger %s in the store", method, args[0])

    async def _release(self, attempt: _Attempt) -> None:
        if attempt.stream is not None and attempt.key is not None:
            attempt.stream = None
            await self.manager.unsubscribe(attempt.trigger_id, attempt.key)

    async def _cleanup(self, trigger_id: int, trigger: BaseTrigger) -> None:
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT):
                await trigger.cleanup()
        except Exception:
            # cleanup() is best-effort by contract; its failure is only logged.
            log.exception("cleanup() of trigger %d failed", trigger_id)

    async def _run_once(self, attempt: _Attempt, trigger: BaseTrigger, delay: float) -> bool:
        """Run one attempt; return True when a standalone trigger finished for good."""
        trigger_id = attempt.trigger_id
        if isinstance(trigger, BaseEventTrigger):
            key = trigger.shared_stream_key()
            if key is not None:
                await self._run_shared(attempt, trigger, key, delay)
                return False
        fired = 0
        async for event in trigger.run():
            await self._store_event(trigger_id, event)
            fired += 1
        if not fired:
            raise TriggerEnded(f"trigger {trigger_id}: run() ended without firing an event")
        return True

    async def _run_shared(
        self, attempt: _Attempt, trigger: BaseEventTrigger, key: Hashable, delay: float
    ) -> None:
        manager = self.manager
        trigger_id = attempt.trigger_id
        if attempt.stream is None:
            attempt.stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
            attempt.key = key
        stream = attempt.stream
        try:
            if delay:
                await asyncio.sleep(delay)
            native = trigger.payload_is_native
            offer = self.gate.offer
            async for event in trigger.filter_shared_stream(stream):
                seq = manager.bind_pending_event(trigger_id=trigger_id, key=key)
                name = manager.raw_event_key(trigger_id=trigger_id, key=key)
                pending = self._pending_event(trigger_id, event, name, native)
                if not offer(pending, seq):  # the gate's queue is full: wait for room
                    await self.gate.put(pending, seq)
            raise TriggerEnded(  # noqa: TRY301 - handled below like any filter failure
                f"trigger {trigger_id}: filter_shared_stream returned"
            )
        except asyncio.CancelledError:
            await self._release(attempt)
            raise
        except Exception as exc:
            manager.fail_subscriber(trigger_id=trigger_id, key=key, error=exc)
            attempt.stream = None
            await manager.unsubscribe(trigger_id, key)  # does not suspend while others remain
            if manager.has_group(key):
                # Same synchronous step: the redelivery of what it owed reaches it.
                attempt.stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
            raise

    async def _store_event(self, trigger_id: int, event: TriggerEvent) -> None:
        """Queue an event of a standalone trigger (not gated, no idempotency key)."""
        await self.gate.put(self._pending_event(trigger_id, event, None), None)

    @staticmethod
    def _pending_event(
        trigger_id: int, event: TriggerEvent, name: str | None,
        native: Callable[[TriggerEvent], bool] | None = None,
    ) -> PendingEvent:
        """What the gate stores for ``event``: its packed payload and idempotency key.

        ``native`` is the trigger's ``payload_is_native``, asked once the event
        is known to be a :class:`TriggerEvent`.
        """
        if not isinstance(event, TriggerEvent):
            raise TypeError(f"trigger {trigger_id} yielded {type(event).__qualname__}, "
                            "not a TriggerEvent")
        vouched = native is not None and native(event)
        payload = pack_event_payload(event.payload, native=vouched)
        idem_key = None if name is None else f"{trigger_id}/{name}"
        return PendingEvent(trigger_id, idem_key, payload)

