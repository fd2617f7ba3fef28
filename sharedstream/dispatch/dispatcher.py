"""The dispatcher: hands queued DAG runs from the store to their targets, and follows them.

One :class:`Dispatcher` runs in each triggerer, beside the watchers, on its
own store connection and database thread, so nothing it does - a slow
target, a failing one, its own transactions - holds up the persistence
gate, and the broker's acks wait for the store alone.

Three owned loops (tasks of one task group):

* **claims** - for each target with room, claim due runs of its DAGs
  (:meth:`~sharedstream.store.OutboxStore.claim_runs`: id order, never a
  paused DAG, never a run another live triggerer holds) and start one
  attempt task per run while slots are free. It claims ahead: up to
  ``claim_ahead`` runs more than are under way wait in a local line, so a
  slot that comes free starts the next run at once, and the line is
  refilled in one claim when it runs low, so the claim's transaction is
  off the delivery path and paid once per many runs; on a graceful stop the runs still
  in line are handed back (:meth:`~sharedstream.store.OutboxStore.unclaim_runs`),
  after a crash they are recovered like any other claim. Woken by
  :meth:`Dispatcher.wake` (the triggerer calls it when it stored new
  runs), by a slot coming free, and every
  ``poll_interval`` seconds (runs queued by other triggerers or the CLI,
  retries coming due, claims of dead triggerers to recover).
* **attempts** - build the run document, await the target's ``deliver``
  (bounded by its timeout), turn the answer into a
  :class:`~sharedstream.store.DispatchResult`: the target's state; on a
  retryable error ``queued`` again with exponential backoff, until
  ``max_attempts``; otherwise ``undeliverable``.
* **follow-ups** - every ``follow_interval`` seconds, ask the targets that
  can tell (``Target.follows``) what became of the runs they accepted.

Results are written in batches by a fourth loop (**records**); a write that
fails is retried, nothing is dropped. Every write is fenced by the claim
(the store applies a result only while the run is still this triggerer's),
so a triggerer taken for dead cannot overwrite its successor's record.

Invariants:

1. At most ``max_concurrency`` deliveries of one target run at once in this
   process (:class:`Slots`); follow-up questions have a budget of their own
   of the same size.
2. A run is delivered at least once: it leaves ``dispatching`` only through
   a recorded result; a crash leaves it to be recovered by whoever claims it
   next, told so (``recovered``), so the target can find out whether it
   already has it.
3. Retry delays are ``retry_backoff_initial * 2 ** (tries - 1)`` seconds,
   at most ``retry_backoff_max``, where ``tries`` counts the attempts of
   the current retry budget.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sharedstream.dispatch.document import RunDocument, document_of
from sharedstream.dispatch.target import Delivery, Target, TargetError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.store import ClaimedRun, DispatchResult, OutboxStore, StoreError

__all__ = ["LATENCY_BUCKETS", "DispatchSettings", "Dispatcher", "Route", "Slots", "TargetStats"]

log = key_value_logger("sharedstream.dispatch")

Db = Callable[..., Awaitable[Any]]
"""Runs ``fn(*args)`` on the dispatcher's database thread: ``await db(fn, *args)``."""

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the queued-to-dispatched latency histogram."""

_GRACE = 5.0  # seconds past a target's own timeout before the dispatcher gives up on it
_FAILING_AFTER = 3  # consecutive failed attempts after which a target counts as down


@dataclass(frozen=True)
class DispatchSettings:
    """How often the dispatcher looks, and how many runs one claim takes.

    ``claim_ahead`` runs per target may wait claimed in the local line
    beyond those under way (0: claim only for free slots). ``threshold`` is
    the claim lease: a claim whose triggerer's heartbeat is older is taken
    over (0 for a store that serves one triggerer).
    """

    poll_interval: float = 1.0
    follow_interval: float = 5.0
    claim_batch: int = 100
    claim_ahead: int = 1
    threshold: float = 30.0
    flush_interval: float = 0.02


@dataclass(frozen=True)
class Route:
    """Where one DAG's runs go: the target's name (the store records it) and its instance."""

    target_name: str
    target: Target


class Slots:
    """A count of deliveries under way against a capacity; :attr:`free` says how many more."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.busy = 0

    @property
    def free(self) -> int:
        """How many more deliveries may start now."""
        return max(0, self.capacity - self.busy)


@dataclass
class TargetStats:
    """What one target's deliveries came to, since this process started (for metrics)."""

    attempts: int = 0
    dispatched: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    undeliverable: int = 0
    errors: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    latency_count: int = 0
    latency_sum: float = 0.0

    def observe_latency(self, seconds: float) -> None:
        """Count one run's time from queued to reaching its target."""
        self.latency_count += 1
        self.latency_sum += seconds
        for index, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.latency_buckets[index] += 1

    @property
    def failing(self) -> bool:
        """Whether the last few attempts all failed: the target looks down."""
        return self.consecutive_failures >= _FAILING_AFTER


class Dispatcher:
    """One triggerer's dispatcher (see the module docstring).

    ``routes`` maps each DAG it delivers to its :class:`Route`; ``store`` is
    a store of its own, used only through ``db`` (its database thread);
    ``payload_of`` unpacks a stored event payload. Call :meth:`open`, then
    run :meth:`run` as an owned task; :meth:`stop` ends it gracefully.
    """

    def __init__(
        self, *, triggerer_id: str, routes: Mapping[str, Route], store: OutboxStore, db: Db,
        payload_of: Callable[[bytes], Any], settings: DispatchSettings | None = None,
    ) -> None:
        self.triggerer_id = triggerer_id
        self.routes = dict(routes)
        self.settings = settings or DispatchSettings()
        self._store = store
        self._db = db
        self._payload_of = payload_of
        self.targets: dict[str, list[Target]] = {}
        for route in self.routes.values():
            instances = self.targets.setdefault(route.target_name, [])
            if route.target not in instances:
                instances.append(route.target)
        self._dags = {name: {dag: name for dag, route in self.routes.items()
                             if route.target_name == name} for name in self.targets}
        self.slots = {name: Slots(int(found[0].settings["max_concurrency"]))
                      for name, found in self.targets.items()}
        self._asking = {name: asyncio.Semaphore(slots.capacity)
                        for name, slots in self.slots.items()}
        self.stats = {name: TargetStats() for name in self.targets}
        self._wake = asyncio.Event()
        self._pending: deque[tuple[str, DispatchResult]] = deque()
        self._have_pending = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._stopping = False
        self._attempts: set[asyncio.Task[None]] = set()
        self._ready: dict[str, deque[ClaimedRun]] = {name: deque() for name in self.targets}
        self._tasks: asyncio.TaskGroup | None = None
        self._opened: list[Target] = []
        self.runs_delivered = 0
        """Runs that reached their target (dispatched or ran) in this process."""
        self.unfinished: dict[tuple[str, str, str], int] = {}
        """Unfinished runs in the whole store per ``(dag_id, target, state)``, as last counted
        (every ``follow_interval``; for operations: what waits where)."""

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Open every target; a target that cannot open raises (one line) and none stays open."""
        try:
            for instances in self.targets.values():
                for target in instances:
                    await target.open()
                    self._opened.append(target)
        except BaseException:
            await self._close_targets()
            raise

    async def run(self) -> None:
        """Claim, deliver, follow and record until :meth:`stop` (or cancellation)."""
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                try:
                    records = tasks.create_task(self._records(),
                                                name="sharedstream-dispatch-records")
                    side = [tasks.create_task(self._counts(),
                                              name="sharedstream-dispatch-counts")]
                    if any(t.follows for found in self.targets.values() for t in found):
                        side.append(tasks.create_task(self._follows(),
                                                      name="sharedstream-dispatch-follow"))
                    await self._claims()
                    await self._unclaim()
                    for task in side:
                        task.cancel()
                    while self._attempts:  # stop(): those under way finish (it bounds the wait)
                        await asyncio.wait(set(self._attempts))
                    await self._flush_all()
                    records.cancel()
                except BaseException:
                    self._tasks = None  # the group is shutting down: start nothing more
                    raise
        finally:
            self._tasks = None
            try:
                if any(self._ready.values()):  # cancelled: hand back what never started
                    async with asyncio.timeout(2.0):
                        await self._unclaim()
            except TimeoutError:
                log.warning("stopped with claimed runs not handed back; they are recovered "
                            "after the heartbeat threshold")
            try:
                if self._pending:  # cancelled: keep what is known (else those runs are recovered)
                    async with asyncio.timeout(2.0):
                        await self._flush_all()
            except TimeoutError:
                log.warning("stopped with dispatch results unrecorded; their runs are recovered "
                            "by the next claim", results=len(self._pending))
            finally:
                await self._close_targets()

    def wake(self) -> None:
        """Look for runs now (new ones were stored); safe to call often, from the loop only."""
        self._wake.set()

    def begin_stop(self) -> None:
        """Stop claiming; attempts under way go on until they end or :meth:`run` is cancelled."""
        self._stopping = True
        self._wake.set()

    async def release(self) -> None:
        """Hand the runs this triggerer follows to others now (a graceful stop); best effort."""
        try:
            await self._db(self._store.release_runs, self.triggerer_id)
        except StoreError as exc:
            log.warning("could not hand over the runs this triggerer follows; others take them "
                        "over after the heartbeat threshold", error=str(exc))

    async def _close_targets(self) -> None:
        opened, self._opened = self._opened, []
        for target in opened:
            try:
                await target.aclose()
            except Exception:  # closing is best effort: every delivery is recorded already
                log.warning("closing a target failed", target=target.name, exc_info=True)

    @property
    def in_flight(self) -> int:
        """Deliveries under way in this process."""
        return len(self._attempts)

    # -- claims and attempts -------------------------------------------------------------

    async def _claims(self) -> None:
        settings = self.settings
        failures = 0
        while not self._stopping:
            self._wake.clear()
            more = False
            try:
                for name, dags in self._dags.items():
                    slots, ready = self.slots[name], self._ready[name]
                    # refill when the line runs low, or free slots would find it empty
                    low = min(slots.capacity, settings.claim_ahead)
                    if len(ready) >= low and slots.free <= len(ready):
                        continue
                    room = min(slots.free + settings.claim_ahead - len(ready),
                               settings.claim_batch)
                    if room <= 0:
                        continue
                    runs = await self._db(self._store.claim_runs, self.triggerer_id, dags, room,
                                          settings.threshold)
                    more = more or len(runs) == room
                    ready.extend(runs)
                    self._fill(name)
                failures = 0
            except StoreError as exc:
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("claiming runs failed; trying again", error=str(exc),
                                failures=failures)
            if more and not self._stopping:
                await asyncio.sleep(0)
                continue
            try:
                async with asyncio.timeout(settings.poll_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _fill(self, name: str) -> None:
        """Start runs from ``name``'s line while it has free slots (never once stopping)."""
        ready, slots = self._ready[name], self.slots[name]
        while ready and slots.free and not self._stopping and self._tasks is not None:
            self._start(self._tasks, name, ready.popleft())

    async def _unclaim(self) -> None:
        """Hand the runs claimed but never started back to the queue (a graceful stop)."""
        runs = [(run.id, run.attempt) for ready in self._ready.values() for run in ready]
        if not runs:
            return
        try:
            await self._db(self._store.unclaim_runs, self.triggerer_id, runs)
        except StoreError as exc:
            log.warning("could not hand back runs claimed ahead; they are recovered after the "
                        "heartbeat threshold", runs=len(runs), error=str(exc))
        for ready in self._ready.values():
            ready.clear()

    def _start(self, tasks: asyncio.TaskGroup, name: str, run: ClaimedRun) -> None:
        self.slots[name].busy += 1
        task = tasks.create_task(self._attempt(name, run),
                                 name=f"sharedstream-dispatch[{run.dag_id}/{run.run_id}]")
        self._attempts.add(task)
        task.add_done_callback(self._attempts.discard)

    async def _attempt(self, name: str, run: ClaimedRun) -> None:
        """Deliver one claimed run and queue its result; never raises (but cancellation)."""
        stats = self.stats[name]
        stats.attempts += 1
        try:
            target = self.routes[run.dag_id].target
            result = await self._deliver(target, run, stats)
            self._record(name, result)
        finally:
            self.slots[name].busy -= 1
            self._fill(name)
            self._wake.set()

    async def _deliver(self, target: Target, run: ClaimedRun, stats: TargetStats
                       ) -> DispatchResult:
        try:
            document = document_of(run, self._payload_of)
        except Exception as exc:  # noqa: BLE001 - a stored payload that cannot be read: say so
            return self._failed(run, stats, f"an event payload cannot be read: {exc}",
                                retryable=False, settings=target.settings)

        def progress(state: str) -> None:
            if state == "running":
                self._record(target.name, DispatchResult(run.id, "running"))

        try:
            async with asyncio.timeout(target.timeout + _GRACE):
                delivery = await target.deliver(document, progress)
        except TargetError as exc:
            return self._failed(run, stats, str(exc), retryable=exc.retryable,
                                settings=target.settings)
        except TimeoutError:
            return self._failed(run, stats, f"no answer within {target.timeout:g} s",
                                retryable=True, settings=target.settings)
        except Exception as exc:  # a target's bug: retried (delivery stays at least once)
            log.exception("a target raised an unexpected error; the run is retried",
                          target=target.name, dag=run.dag_id, run=run.run_id)
            return self._failed(run, stats, f"{type(exc).__name__}: {exc}", retryable=True,
                                settings=target.settings)
        stats.consecutive_failures = 0
        self.runs_delivered += 1
        stats.observe_latency(max(0.0, (datetime.now(UTC) - run.queued_at).total_seconds()))
        if delivery.state == "success":
            stats.succeeded += 1
        elif delivery.state == "failed":
            stats.failed += 1
        else:
            stats.dispatched += 1
        return DispatchResult(run.id, delivery.state, attempt=run.attempt,
                              detail=delivery.detail, external_id=delivery.external_id,
                              external_url=delivery.external_url, output=delivery.output)

    def _failed(self, run: ClaimedRun, stats: TargetStats, detail: str, *, retryable: bool,
                settings: Mapping[str, Any]) -> DispatchResult:
        stats.errors += 1
        stats.consecutive_failures += 1
        stats.last_error = detail
        if retryable and run.tries < int(settings["max_attempts"]):
            delay = min(float(settings["retry_backoff_initial"]) * 2 ** (run.tries - 1),
                        float(settings["retry_backoff_max"]))
            stats.retried += 1
            log.info("delivery failed; retrying later", dag=run.dag_id, run=run.run_id,
                     attempt=run.attempt, retry_in_s=round(delay, 3), error=detail)
            return DispatchResult(run.id, "queued", attempt=run.attempt, detail=detail,
                                  next_attempt_at=datetime.now(UTC) + timedelta(seconds=delay))
        stats.undeliverable += 1
        why = "no retry can help" if not retryable else f"{run.tries} attempts failed"
        log.warning("run undeliverable", dag=run.dag_id, run=run.run_id, attempt=run.attempt,
                    why=why, error=detail)
        return DispatchResult(run.id, "undeliverable", attempt=run.attempt, detail=detail)

    # -- follow-ups ----------------------------------------------------------------------

    async def _follows(self) -> None:
        following = {dag: route.target_name for dag, route in self.routes.items()
                     if route.target.follows}
        while True:
            await asyncio.sleep(self.settings.follow_interval)
            try:
                runs = await self._db(self._store.follow_runs, self.triggerer_id, following,
                                      self.settings.claim_batch, self.settings.threshold)
            except StoreError as exc:
                log.warning("listing runs to follow failed; trying again", error=str(exc))
                continue
            if runs:
                await asyncio.gather(*(self._ask(run) for run in runs))

    async def _ask(self, run: ClaimedRun) -> None:
        route = self.routes[run.dag_id]
        try:
            document: RunDocument = document_of(run, self._payload_of)
        except Exception:  # a payload that cannot be read: asking cannot help, nor may it stop us
            log.exception("a followed run's document cannot be built", run=run.run_id)
            return
        async with self._asking[route.target_name]:
            try:
                async with asyncio.timeout(route.target.timeout + _GRACE):
                    found: Delivery | None = await route.target.status(document)
            except (TargetError, TimeoutError) as exc:
                log.info("could not ask a target about a run; asking again later",
                         target=route.target_name, run=run.run_id, error=str(exc) or "timeout")
                return
            except Exception:  # a target's bug: asked again at the next follow-up
                log.exception("a target's status raised", target=route.target_name,
                              run=run.run_id)
                return
        if found is None or found.state == run.state:
            # Nothing new: recorded all the same, so the run goes to the back of the follow-up
            # line (oldest update first) and a long line is asked about in turn.
            self._record(route.target_name, DispatchResult(run.id, run.state))
            return
        stats = self.stats[route.target_name]
        if found.state == "success":
            stats.succeeded += 1
        elif found.state == "failed":
            stats.failed += 1
        self._record(route.target_name, DispatchResult(
            run.id, found.state, detail=found.detail, external_id=found.external_id,
            external_url=found.external_url))

    async def _counts(self) -> None:
        """Count the unfinished runs every ``follow_interval`` (one indexed store read)."""
        while True:
            try:
                self.unfinished = await self._db(self._store.run_counts)
            except StoreError as exc:
                log.info("counting unfinished runs failed; trying again", error=str(exc))
            await asyncio.sleep(self.settings.follow_interval)

    # -- records -------------------------------------------------------------------------

    def _record(self, target: str, result: DispatchResult) -> None:
        self._pending.append((target, result))
        self._have_pending.set()

    async def _records(self) -> None:
        while True:
            await self._have_pending.wait()
            await asyncio.sleep(self.settings.flush_interval)  # gather a batch
            await self._flush()

    async def _flush(self) -> bool:
        """Write what is pending in one transaction; ``False`` (kept, retried) if it failed.

        One flush at a time (the records loop and a stop may both flush):
        results added while it writes stay pending for the next.
        """
        async with self._flushing:
            return await self._flush_once()

    async def _flush_once(self) -> bool:
        self._have_pending.clear()
        batch = list(self._pending)
        if not batch:
            return True
        try:
            applied = await self._db(self._store.record_dispatch, self.triggerer_id,
                                     [result for _, result in batch])
        except StoreError as exc:
            log.warning("recording dispatch results failed; trying again", error=str(exc),
                        pending=len(batch))
            self._have_pending.set()
            await asyncio.sleep(min(1.0, self.settings.poll_interval))
            return False
        for _ in batch:  # the oldest len(batch): what was just written
            self._pending.popleft()
        if applied < len(batch):
            log.warning("some results were not recorded: their runs were taken over by another "
                        "triggerer (this one's heartbeat was late) or marked by hand",
                        results=len(batch), recorded=applied)
        return True

    async def _flush_all(self, attempts: int = 50) -> None:
        """Flush until nothing is pending, or ``attempts`` writes were tried."""
        for _ in range(attempts):
            if not self._pending:
                return
            await self._flush()

    # -- what operations read ------------------------------------------------------------

    def health(self) -> list[tuple[str, bool, str]]:
        """``(target, ok, detail)`` per target; one whose last attempts all failed is not ok."""
        found = []
        for name, stats in sorted(self.stats.items()):
            slots = self.slots[name]
            if stats.failing:
                found.append((name, False, f"{stats.consecutive_failures} attempts failed in a "
                              f"row; last: {stats.last_error}"))
            else:
                found.append((name, True, f"{slots.busy}/{slots.capacity} delivering"))
        return found

