"""The replay loop: runs the replays the store holds for this triggerer's watchers, one at a time.

A triggerer task beside the triggers. Every ``poll`` seconds (at once when
:meth:`ReplayLoop.wake` is called) it claims the oldest active replay of a
shared-stream trigger it serves that nobody live runs
(:meth:`~sharedstream.store.replays.ReplayStore.claim_replay`), and runs it:

1. The trigger is built from its stored row, as the supervisor builds it,
   and its stream's producer is built (not started) for its
   :meth:`~sharedstream.engine.producer.SharedStreamProducer.replay_source`;
   a broker that cannot replay fails the replay with one line. A replay of
   the watcher's dead letters reads the store's instead
   (:mod:`sharedstream.runtime.replay_deadletters`), rebuilt by the
   producer's ``dead_letter_event``.
2. Unplanned: the source plans it (each lane's ``[start, end)``, ending
   where the live consumer's commits were) and the plan is stored.
3. The lanes are read from the stored positions and fed to *this* trigger's
   ``filter_shared_stream`` alone, in its own task: other watchers, the live
   consumer and its commits are untouched. Each event gets the idempotency
   key and fingerprint the live stream gives the same message
   (``<trigger id>/<raw event name>#<index>``), so what the watcher stored
   already is not stored again.
4. Events are written in batches (at most ``batch`` events or ``flush_every``
   seconds); after each write the positions reached are recorded, so a
   replay claimed again (its triggerer died) resumes there; anything
   written after the last record is written again under the same keys,
   i.e. not at all. The record also tells whether a cancel was asked.
5. A filter's ``reject_shared_stream_event()`` counts the raw event as
   rejected (logged; nothing is dead-lettered: the replay never touches the
   broker's messages). A filter that raises fails the replay, with the
   error and where it stopped.

Memory: one source fetch, plus at most ``batch`` events waiting for their
write.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.replay import (
    ReplayError,
    ReplayItem,
    ReplayPlan,
    ReplayRequest,
    ReplaySource,
)
from sharedstream.engine.stream import rejections_to
from sharedstream.engine.trigger import BaseEventTrigger, BaseTrigger
from sharedstream.runtime.replay_deadletters import (
    DeadLetterReplaySource,
    can_rebuild_dead_letters,
)
from sharedstream.runtime.serde import SerializationError
from sharedstream.runtime.supervisor import pending_event
from sharedstream.store import MetadataStore, PendingEvent, StoreError, TriggerRow, WriteResult
from sharedstream.store.replays import ReplayProgress, ReplayRow

__all__ = ["ReplayLoop", "ReplayRun", "request_of"]

log = key_value_logger("sharedstream.replay")

T = TypeVar("T")


def request_of(stored: dict[str, Any]) -> ReplayRequest:
    """The :class:`ReplayRequest` a replay row's ``request`` JSON holds."""
    def when(key: str) -> datetime | None:
        value = stored.get(key)
        return None if value is None else datetime.fromisoformat(value)

    offsets = stored.get("offsets")
    return ReplayRequest(since=when("from"), until=when("to"),
                         offsets=None if offsets is None else {k: int(v)
                                                               for k, v in offsets.items()},
                         dead_letters=bool(stored.get("dead_letters")))


class _Stop(Exception):
    """The replay ends early: ``state`` is how (``cancelled``, or ``lost``: claimed elsewhere)."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


@dataclass
class ReplayRun:
    """The replay this loop runs now, as the operations view shows it (read on the loop)."""

    row: ReplayRow
    progress: ReplayProgress
    started: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when this triggerer started (or resumed) it."""
    resumed_at: int = 0
    """``progress.done`` when this triggerer took it (the rate counts from there)."""

    def rate(self) -> float:
        """Raw events per second read by this triggerer so far."""
        elapsed = time.monotonic() - self.started
        return 0.0 if elapsed <= 0 else (self.progress.done - self.resumed_at) / elapsed


class ReplayLoop:
    """Claims and runs replays (see the module docstring)."""

    def __init__(
        self, *, store: Callable[[], MetadataStore],
        db: Callable[..., Awaitable[Any]],
        write: Callable[[Sequence[PendingEvent]], WriteResult],
        rehydrate: Callable[[TriggerRow], BaseTrigger],
        triggerer_id: str, trigger_ids: Callable[[], Sequence[int]], threshold: float,
        poll: float = 2.0, batch: int = 500, flush_every: float = 1.0,
    ) -> None:
        self._store, self._db, self._write = store, db, write
        self._rehydrate = rehydrate
        self._triggerer_id = triggerer_id
        self._trigger_ids = trigger_ids
        self._threshold = threshold
        self.poll, self.batch, self.flush_every = poll, batch, flush_every
        self._wake = asyncio.Event()
        self.current: ReplayRun | None = None
        """The replay running now (``None``: none)."""

    def wake(self) -> None:
        """Look for a replay to claim now (one was just asked for)."""
        self._wake.set()

    async def run(self) -> None:
        """Claim and run replays until cancelled; a store error is logged and retried."""
        while True:
            self._wake.clear()
            row: ReplayRow | None = None
            ids = list(self._trigger_ids())
            try:
                row = await self._db(self._store().claim_replay, self._triggerer_id, ids,
                                     self._threshold)
            except StoreError as exc:
                log.warning("claiming a replay failed; trying again", error=str(exc))
            if row is not None:
                await self._run(row)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await self._wake.wait()

    async def _run(self, row: ReplayRow) -> None:
        progress = ReplayProgress(dict(row.positions), row.done, row.matched, row.stored,
                                  row.rejected)
        run = self.current = ReplayRun(row, progress, resumed_at=row.done)
        log.info("replay started" if row.done == 0 else "replay resumed", replay=row.id,
                 watcher=row.watcher, done=row.done, total=row.total)
        state, error = "done", None
        sources: list[ReplaySource] = []
        try:
            feeder = await self._prepare(run, sources)
            await feeder.run(sources[0].read(feeder.plan, progress.positions))
        except _Stop as stop:
            state = stop.state
        except (SharedStreamError, ValueError, TypeError, OSError) as exc:
            state, error = "failed", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - the filter's own code: fail the replay, go on
            state, error = "failed", f"the filter raised {type(exc).__name__}: {exc}"
        finally:
            self.current = None
            for source in sources:
                with contextlib.suppress(Exception):
                    await source.aclose()
        await self._end(run.row, progress, state, error)

    async def _prepare(self, run: ReplayRun, sources: list[ReplaySource]) -> _Feeder:
        """Build the trigger, its producer and source (into ``sources``); plan if unplanned."""
        row = run.row
        trigger, producer = await self._build(row)
        request = request_of(dict(row.request))
        source = (self._dead_letter_source(row, trigger, producer) if request.dead_letters
                  else producer.replay_source())
        if source is None:
            raise ReplayError(
                f"{trigger.shared_stream_name()}: this broker cannot replay a watcher (Kafka "
                "can; for SQS and Service Bus, replay the dead letters the watcher caused: "
                "--dead-letters)")
        sources.append(source)
        if row.plan is None:
            plan = await source.plan(request)
            if not await self._db(self._store().plan_replay, row.id, self._triggerer_id, plan):
                raise _Stop("lost")
            run.progress.positions = {lane: start for lane, (start, _) in plan.items()}
            run.row = row = await self._db(self._store().get_replay, row.id) or row
            log.info("replay planned", replay=row.id, watcher=row.watcher, total=row.total,
                     lanes={lane: f"{s}..{e}" for lane, (s, e) in plan.items()})
        if row.plan is None:
            raise _Stop("lost")
        if row.state == "cancelling":
            raise _Stop("cancelled")
        return _Feeder(self, row, row.plan, trigger, producer, run.progress)

    def _dead_letter_source(self, row: ReplayRow, trigger: BaseEventTrigger,
                            producer: SharedStreamProducer) -> ReplaySource:
        """The store's letters of ``row``'s trigger, rebuilt by ``producer`` (or one line)."""
        if not can_rebuild_dead_letters(producer):
            raise ReplayError(f"{trigger.shared_stream_name()}: this broker cannot rebuild a dead "
                              "letter as a message (SQS and Service Bus can; Kafka replays "
                              "--from a time or offsets)")
        return DeadLetterReplaySource(trigger_id=row.trigger_id, store=self._store, db=self._db,
                                      producer=producer)

    async def flush(self, row: ReplayRow, batch: list[PendingEvent],
                    progress: ReplayProgress) -> None:
        """Write ``batch``, then record ``progress``; :class:`_Stop` when cancelled or lost."""
        if batch:
            result = await self._db(self._write, batch)
            progress.matched += len(batch)
            progress.stored += result.stored
        state = await self._db(self._store().record_replay, row.id, self._triggerer_id, progress)
        if state is None:
            raise _Stop("lost")
        if state == "cancelling":
            raise _Stop("cancelled")

    async def _end(self, row: ReplayRow, progress: ReplayProgress, state: str,
                   error: str | None) -> None:
        if state == "lost":
            log.warning("replay taken over by another triggerer; stopped here", replay=row.id)
            return
        try:
            await self._db(self._store().finish_replay, row.id, self._triggerer_id, state, error)
        except StoreError as exc:  # the claim lapses; another round resumes it
            log.warning("recording the end of a replay failed", replay=row.id, error=str(exc))
            return
        fields = {"replay": row.id, "watcher": row.watcher, "done": progress.done,
                  "total": row.total, "new_events": progress.stored,
                  "already_stored": progress.matched - progress.stored,
                  "rejected": progress.rejected}
        if state == "failed":
            log.error("replay failed", **fields, error=error, positions=progress.positions)
        elif state == "cancelled":
            log.info("replay cancelled", **fields)
        else:
            log.info("replay done", **fields)

    async def _build(self, row: ReplayRow) -> tuple[BaseEventTrigger, SharedStreamProducer]:
        trigger_row = await self._db(self._store().get_trigger, row.trigger_id)
        if trigger_row is None:
            raise ReplayError(f"trigger {row.trigger_id} is gone from the store")
        trigger = self._rehydrate(trigger_row)
        if not isinstance(trigger, BaseEventTrigger) or trigger.shared_stream_key() is None:
            raise ReplayError(f"watcher {row.watcher} does not read a shared stream: nothing to "
                              "replay")
        producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        if not isinstance(producer, SharedStreamProducer):
            raise ReplayError(f"watcher {row.watcher}'s trigger has no broker producer to replay")
        return trigger, producer


class _Feeder:
    """One replay's pass: the filter over the source's items, events batched to the store."""

    def __init__(self, loop: ReplayLoop, row: ReplayRow, plan: ReplayPlan,  # noqa: PLR0917
                 trigger: BaseEventTrigger, producer: SharedStreamProducer,
                 progress: ReplayProgress) -> None:
        self.loop, self.row, self.plan = loop, row, plan
        self.trigger, self.producer, self.progress = trigger, producer, progress
        self.fingerprints = (type(producer).raw_event_fingerprint
                             is not SharedStreamProducer.raw_event_fingerprint)
        self.pending: list[PendingEvent] = []
        self.item: ReplayItem | None = None  # the one being filtered
        self.index = 0  # the next event's index among those of self.item
        self.rejected = False  # self.item was rejected
        self.read_all = False
        self.last_flush = time.monotonic()

    async def run(self, items: AsyncIterator[ReplayItem]) -> None:
        """Filter every item; write what it fires; record progress after each write."""
        trigger_id = self.row.trigger_id
        native = self.trigger.payload_is_native
        with rejections_to(self.reject):
            async for event in self.trigger.filter_shared_stream(self._raws(items)):
                item = self.item
                if item is None or self.rejected:
                    continue  # after its reject, as live: nothing more is bound to the message
                try:
                    self.pending.append(pending_event(trigger_id, event, self._identity(item),
                                                      native))
                except SerializationError as exc:
                    self.reject(f"the trigger event cannot be stored: {exc}")
        if not self.read_all:
            raise ReplayError("the filter returned before the replay's end (a shared-stream "
                              "filter reads its stream to the end)")
        await self._flush()

    def _identity(self, item: ReplayItem) -> tuple[str, str | None] | None:
        """The live stream's ``(name#index, fingerprint)`` for the next event of ``item``."""
        name = self.producer.raw_event_name(item.broker_payload)
        if name is None:
            return None
        index, self.index = self.index, self.index + 1
        fingerprint = (self.producer.raw_event_fingerprint(item.broker_payload)
                       if self.fingerprints else None)
        return f"{name}#{index}", fingerprint

    async def _raws(self, items: AsyncIterator[ReplayItem]) -> AsyncIterator[Any]:
        progress = self.progress
        async for item in items:
            self.item, self.index, self.rejected = item, 0, False
            yield item.raw_event
            progress.positions[item.lane] = item.next_position
            progress.done += 1 + item.skipped
            if (len(self.pending) >= self.loop.batch
                    or time.monotonic() - self.last_flush >= self.loop.flush_every):
                await self._flush()
        self.read_all = True

    async def _flush(self) -> None:
        batch, self.pending = self.pending, []
        await self.loop.flush(self.row, batch, self.progress)
        self.last_flush = time.monotonic()

    def reject(self, reason: str | None) -> bool:
        """The filter rejected the item it is on: count it and say so (what it fired stays)."""
        item = self.item
        if item is None or self.rejected:
            return False
        self.rejected = True
        self.progress.rejected += 1
        log.warning("the filter rejected a replayed message; a replay does not dead-letter it",
                    replay=self.row.id, lane=item.lane, position=item.next_position - 1,
                    reason=reason)
        return True
