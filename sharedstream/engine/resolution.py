"""Resolution bookkeeping for ack mode: a pure, synchronous state machine.

Nothing here awaits or needs an event loop; the async pieces (the stream
iterators, the advance pump, the ack watchdog) call into it. Terms:

* **record** - one raw event after fan-out (:class:`EventRecord`). Its
  *snapshot* is the set of subscribers live at broadcast; ``pending`` counts
  those that have not resolved it yet.
* **window** - a subscriber's *binding window* is open on the record it
  pulled last, until it pulls the next one or leaves. Trigger events the
  subscriber emits meanwhile are *bound* to that record through a seq.
* **resolution** - each snapshot subscriber resolves each record exactly
  once: *acked* (window closed and every bound seq confirmed persisted, or
  declined by the subscriber's prefilter at broadcast),
  *rejected* (it called reject while the window was open) or *failed*
  (force-failed, or left before pulling it).
* **lane** - records with equal lanes are advanced in fan-out order; a lane
  is *ready* when its oldest record is fully resolved.

Invariants (checked by ``tests/unit/test_resolution_properties.py``):

1. ``acked + failed + rejected + pending`` equals the snapshot size, always.
2. A record leaves its lane only through :meth:`ResolutionBook.take_batch`,
   only when ``pending == 0``, and only together with every older record of
   its lane - so nothing is advanced twice or out of lane order.
3. A record is never resolved as acked while a seq bound to it by that
   subscriber is unconfirmed.
4. A failed or departed subscriber owes nothing: its inbox is empty and
   its seqs are forgotten, so late confirmations are ignored.

Ownership: the resolution modules are the only ones that change resolution
state (the records, the books, the :class:`AckSubscriber` fields and the seq
router), each with one job:

* :mod:`sharedstream.engine.resolution` (this one) - :class:`ResolutionBook`,
  the book of one group: membership, fan-out, pulls, binds, confirmations,
  rejects and refusals, the timeline of deadlines and advancing;
* :mod:`sharedstream.engine.records` - :class:`EventRecord`, its counts and
  verdicts;
* :mod:`sharedstream.engine.ack_subscriber` - :class:`AckSubscriber`, one
  subscriber's binding window and seq ledger;
* :mod:`sharedstream.engine.seqs` - :class:`SeqRouter`, which routes a seq
  to the subscriber that bound it;
* :mod:`sharedstream.engine.failures` - :class:`Failures`, the failure
  paths: force-failing a subscriber, the ack timeout, the failed attempts
  of durable members and their lane fences.

The iterators in :mod:`sharedstream.engine.stream` step
:meth:`ResolutionBook.pulls`, the manager binds through
:meth:`ResolutionBook.bind_for` and confirms through
:meth:`SeqRouter.confirm`; nothing else writes resolution state.

Threads: everything that changes state runs on the event loop. The
readers :meth:`ResolutionBook.outstanding`, ``lanes_snapshot``,
``queued_snapshot`` and ``oldest_unresolved_at`` change nothing and copy
each container they walk with one C-level call (``tuple(...)``, which runs
no Python code and so holds the GIL throughout: it cannot see the container
change size), so they are safe from another thread (the OpenTelemetry
gauges, see :mod:`sharedstream.engine.telemetry`).

Cost model: a subscriber pulling a record is O(1); failing or removing a
subscriber is O(what it still owes); the ack watchdog looks only at the
oldest unresolved record (the fan-out timeline is in creation order).

Seqs carry their subscriber (see :mod:`sharedstream.engine.seqs`): routing a
confirmation is one lookup by slot, and the only per-seq state is the
subscriber's own ledger slot.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Generator, Hashable
from typing import TYPE_CHECKING, Any

from sharedstream.engine.ack_subscriber import AckSubscriber, still_owed
from sharedstream.engine.errors import SubscriberOverflow
from sharedstream.engine.failures import Failures
from sharedstream.engine.fanout import Accept, FanOut
from sharedstream.engine.names import stream_name
from sharedstream.engine.producer import AdvanceItem, AdvanceOutcome, Verdict
from sharedstream.engine.records import EventRecord, add_failed_by, add_verdict
from sharedstream.engine.seqs import SeqRouter

if TYPE_CHECKING:
    from sharedstream.engine.tracing import StreamTracer

__all__ = ["ResolutionBook", "overflow_error"]

_new_tuple = tuple.__new__
"""Builds :class:`AdvanceItem` without its Python-level ``__new__`` (hot path)."""


class ResolutionBook:
    """Ack-mode bookkeeping of one group: records, subscriber ledgers, lanes, seqs.

    ``router`` is the manager's :class:`SeqRouter`, shared by its groups.
    ``on_ready`` is called (synchronously) whenever some lane becomes ready.
    ``clock`` is the monotonic clock that stamps the ``now`` given to
    :meth:`broadcast` (the group's, injectable in tests); readers such as the
    head-of-line gauge measure ages with it.
    """

    def __init__(
        self,
        *,
        key: Hashable,
        fanout: FanOut,
        ack_timeout: float,
        router: SeqRouter | None = None,
        on_ready: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str | None = None,
    ) -> None:
        self.key = key
        self.name = name if name is not None else stream_name(key)
        """The stream's name in log lines, errors and metrics (:mod:`sharedstream.engine.names`)."""
        self.fanout = fanout
        self.ack_timeout = ack_timeout
        self.clock = clock
        self.router = router if router is not None else SeqRouter()
        self.on_ready: Callable[[], None] = on_ready or _nothing
        self.subscribers: dict[Hashable, AckSubscriber] = {}
        self.lanes: dict[Hashable, deque[EventRecord]] = {}
        self.ready: dict[Hashable, None] = {}  # insertion-ordered set of ready lanes
        self._failures = failures = Failures(self)
        # The containers the failure paths walk, aliased: the hot path uses them directly.
        self._timeline = failures.timeline
        self._departed = failures.departed
        self._fenced = failures.fenced
        self._positions = itertools.count()
        self._clean_outcomes: dict[int, AdvanceOutcome] = {}
        self.broadcasts = 0
        """Raw events broadcast so far (a subscriber saw those since its ``joined_at``)."""
        self.tracer: StreamTracer | None = None
        """The group's spans (:mod:`sharedstream.engine.tracing`), ``None`` while tracing is off.

        Not resolution state: the iterators and the pump report to it.
        """

    # -- membership ---------------------------------------------------------

    def add_subscriber(
        self, trigger_id: Hashable, accept: Accept | None = None, *, durable: bool = False
    ) -> AckSubscriber:
        """Register a subscriber; it is in the snapshot of every later broadcast.

        ``accept`` is its prefilter: a raw event it declines is resolved as
        acked for it at broadcast, without reaching its inbox. A ``durable``
        subscriber stays in the snapshot when an attempt of its filter fails
        (see :meth:`fail_attempt`); only :meth:`remove_subscriber` takes it out.
        """
        sub = AckSubscriber(trigger_id, self, durable=durable)
        sub.accept = accept
        sub.joined_at = self.broadcasts
        self.router.enroll(sub)
        self.subscribers[trigger_id] = sub
        self.fanout.add(sub)
        return sub

    def remove_subscriber(self, trigger_id: Hashable) -> None:
        """The subscriber left (unsubscribe).

        Records still in its inbox were never pulled: they resolve as failed.
        Its open window closes as if it had moved past (acked once the seqs
        bound to it are confirmed). Records waiting on confirmations keep
        waiting; the ack timeout still bounds them.
        """
        sub = self.subscribers.pop(trigger_id, None)
        if sub is None:
            return
        self.fanout.drop(sub)
        self._fenced.discard(sub)
        sub.departed = True
        if sub.error is None:
            for record in sub.inbox:
                self.resolve_failed(record, trigger_id, unseen=True)
            sub.inbox.clear()
            self.next_record(sub)  # with an empty inbox this only closes the window
        if sub.ledger:
            self._departed.add(sub)
        else:
            self.router.withdraw(sub)

    # -- fan-out ------------------------------------------------------------

    def broadcast(
        self, raw: Any, broker_payload: Any, lane: Hashable, now: float,
        audience: Collection[Hashable] | None = None,
    ) -> list[AckSubscriber] | None:
        """Create the record of one raw event and deliver it to every live subscriber.

        The snapshot is the live set at this moment. A subscriber whose
        prefilter declines ``raw`` resolves the record as acked at once (it
        never sees it). A subscriber whose inbox is full is force-failed with
        :class:`SubscriberOverflow` (this record counts as failed for it);
        those subscribers are returned, ``None`` when there are none. Raises
        ``TypeError`` before changing anything if ``lane`` is unhashable.

        ``audience`` (a redelivery for some subscribers only, see
        :meth:`~sharedstream.engine.producer.SharedStreamProducer.delivery_audience`):
        the trigger ids that get the record; every other subscriber of the
        snapshot resolves it as acked at once, as if its prefilter had
        declined it (it already resolved an earlier delivery). One of them
        whose inbox was full still leaves (it was dropped from the fan-out),
        but the record does not fail for it. ``None``: everyone.
        """
        lane_queue = self.lanes.get(lane)
        if lane_queue is None:
            lane_queue = self.lanes[lane] = deque()
        record = EventRecord(next(self._positions), raw, broker_payload, lane, lane_queue, now)
        lane_queue.append(record)
        self.broadcasts += 1  # the one per-raw-event cost of the watchers' counts
        fanout = self.fanout
        record.pending = len(fanout.live)
        if not record.pending:
            self.record_resolved(record)
            return None
        self._timeline.append(record)
        overflowed: list[AckSubscriber] | None = fanout.broadcast(record, raw)  # type: ignore[assignment]
        skipped = fanout.skipped
        outside: list[AckSubscriber] | None = None
        if audience is not None:
            skipped, overflowed, outside = self._narrow(record, audience, skipped, overflowed)
        fenced = self._failures.apply_fences(record) if self._fenced else 0
        if skipped or fenced:  # declined by prefilters, or fenced off (see Failures.fence)
            record.acked += skipped
            record.failed += fenced
            record.unseen += fenced
            record.pending -= skipped + fenced
            if not record.pending:
                self.record_resolved(record)
        if overflowed is not None:
            for sub in overflowed:
                self.resolve_failed(record, sub.trigger_id, unseen=True)
                self.fail(sub, overflow_error(self.name, sub.trigger_id, fanout.capacity))
        if outside is not None:
            for sub in outside:
                self.fail(sub, overflow_error(self.name, sub.trigger_id, fanout.capacity))
            overflowed = [*(overflowed or ()), *outside]
        return overflowed

    def _narrow(
        self, record: EventRecord, audience: Collection[Hashable], skipped: int,
        overflowed: list[AckSubscriber] | None,
    ) -> tuple[int, list[AckSubscriber] | None, list[AckSubscriber] | None]:
        """Take ``record`` back from every subscriber outside ``audience`` (see :meth:`broadcast`).

        Returns the skipped count with them added, the overflowed subscribers
        in the audience and those outside it (each ``None`` when empty): the
        record fails for the first, not for the second.
        """
        for sub in self.fanout.live:
            if sub.trigger_id in audience:
                continue
            inbox = sub.inbox
            if inbox and inbox[-1] is record:
                inbox.pop()
                skipped += 1
        if overflowed is None:
            return skipped, None, None
        kept = [sub for sub in overflowed if sub.trigger_id in audience]
        outside = [sub for sub in overflowed if sub.trigger_id not in audience]
        return skipped + len(outside), kept or None, outside or None

    # -- subscriber progress ---------------------------------------------------

    def next_record(self, sub: AckSubscriber) -> EventRecord | None:
        """The subscriber pulls: close its open window, then open one on its next record.

        Returns ``None`` when its inbox is empty (the window is closed
        anyway: pulling is what moves a subscriber past an event).
        """
        # pulls() inlines this transition for the hot path; the property test
        # drives both interchangeably.
        current = sub.current
        if current is not None:
            sub.current = None
            if sub.window_seqs:
                self.owe(sub, current)
            else:
                current.acked += 1
                current.pending -= 1
                if not current.pending:
                    self.record_resolved(current)
        inbox = sub.inbox
        if inbox:
            record = sub.current = inbox.popleft()
            return record
        return None

    def pulls(self, sub: AckSubscriber) -> Generator[EventRecord | None, None, None]:
        """The subscriber's pulls, one per ``next()``: the fast path of its iterator.

        Each step is :meth:`next_record`: it closes the open window, then
        yields the record whose window it opened, or ``None`` when the inbox
        is empty (the caller waits for the fan-out and steps again). A
        durable subscriber's pending interrupt (see :meth:`Failures.expire`)
        is raised by the first step that finds no window open, and ends the
        generator. :func:`sharedstream.engine.stream.ack_stream` iterates it,
        one generator per attempt; steps may interleave with any other
        method of the book, since each step reads the state afresh.
        """
        # An inlined copy of next_record: resuming a generator is cheaper than a
        # method call, and this runs once per (raw event, subscriber) pair.
        inbox = sub.inbox
        record_resolved = self.record_resolved
        while True:
            current = sub.current
            if current is not None:
                sub.current = None
                if sub.window_seqs:
                    self.owe(sub, current)
                else:
                    current.acked += 1
                    current.pending -= 1
                    if not current.pending:
                        record_resolved(current)
            elif sub.interrupt is not None:
                error, sub.interrupt = sub.interrupt, None
                raise error
            if inbox:
                record = sub.current = inbox.popleft()
                yield record
            else:
                yield None

    def bind_for(self, trigger_id: Hashable) -> int | None:
        """Bind one trigger event subscriber ``trigger_id`` just emitted to its open window.

        Returns the seq to confirm once the event is stored, or ``None`` when
        nothing is to gate (no such subscriber, or no open window). What
        ``SharedStreamManager.bind_pending_event`` calls through its group:
        one lookup, then the bind, in one call (it runs once per trigger
        event).
        """
        sub = self.subscribers.get(trigger_id)
        if sub is None:
            return None
        record = sub.current
        if record is None:
            return None
        seq = sub.next_seq
        sub.next_seq = seq + 1
        sub.matched += 1
        if sub.bound_record is record:
            sub.bind_index += 1
        else:
            sub.bound_record = record
            sub.bind_index = 0
        sub.window_seqs += 1
        sub.ledger.append(record)
        return seq

    def bind(self, sub: AckSubscriber) -> int | None:
        """:meth:`bind_for` through a subscriber handle; ``None`` once it is not subscribed."""
        if self.subscribers.get(sub.trigger_id) is not sub:
            return None
        return self.bind_for(sub.trigger_id)

    def confirm(self, sub: AckSubscriber, seq: int) -> None:
        """Record that ``sub``'s event bound under ``seq`` is stored. Unknown seqs are ignored."""
        ledger = sub.ledger
        index = seq - sub.ledger_base
        if not 0 <= index < len(ledger):
            return
        record = ledger[index]
        if record is None:
            return
        ledger[index] = None
        while ledger and ledger[0] is None:
            ledger.popleft()
            sub.ledger_base += 1
        if record is sub.current:
            sub.window_seqs -= 1
            return
        # Where the confirmed slot sits now (negative when trimmed off the front).
        at = seq - sub.ledger_base
        if at < 0:  # the usual in-order confirmation: still_owed's forward scan, inlined
            if ledger and ledger[0] is record:
                return
        elif still_owed(ledger, at, record):
            return
        record.acked += 1
        record.pending -= 1
        if not record.pending:
            self.record_resolved(record)
        if sub.departed and not sub.ledger:
            self._departed.discard(sub)
            self.router.withdraw(sub)

    def reject(self, sub: AckSubscriber, reason: str | None = None) -> bool:
        """Resolve the subscriber's open-window record as rejected, at once.

        Seqs already bound to the record are dropped (there is nothing left to
        gate). ``reason`` becomes the record's :class:`Verdict` for this
        subscriber. Returns ``False`` when no window is open, so the caller
        can warn.
        """
        record = sub.current
        if record is None:
            return False
        sub.current = None
        if sub.window_seqs:
            sub.forget_seqs(record)
            sub.window_seqs = 0
        self._resolve_rejected(record, sub, reason)
        return True

    def refuse(self, sub: AckSubscriber, seq: int, reason: str) -> None:
        """The store refused the event bound under ``seq`` for good: reject its record.

        Redelivering a record whose derived event cannot be stored would fail
        the same way, so the record resolves as *rejected* for ``sub`` (with
        ``reason``) whether its window is still open or ``sub`` moved past
        it; its other unconfirmed seqs are dropped. Unknown seqs are ignored.
        """
        index = seq - sub.ledger_base
        if not 0 <= index < len(sub.ledger):
            return
        record = sub.ledger[index]
        if record is None:
            return
        if record is sub.current:
            self.reject(sub, reason)
            return
        sub.forget_seqs(record)
        self._resolve_rejected(record, sub, reason)
        if sub.departed and not sub.ledger:
            self._departed.discard(sub)
            self.router.withdraw(sub)

    def set_interrupt_handler(
        self, sub: AckSubscriber, handler: Callable[[BaseException], None] | None
    ) -> None:
        """Who to tell, synchronously, when the ack timeout interrupts durable ``sub``'s attempt.

        Called from :meth:`expire` (in the watchdog's task) with the
        :class:`AckTimeout`; ``None`` tells nobody (the error is still raised
        at the attempt's next pull).
        """
        sub.on_interrupt = handler

    def fail_attempt(self, sub: AckSubscriber, error: BaseException) -> None:
        """A durable subscriber's filter failed: only the record it was on fails.

        That record resolves as *failed* for ``sub`` (a failure of its own,
        with a :class:`Verdict` naming ``error``) and the seqs bound to it are
        dropped. Everything else stays owed by ``sub``: records it moved past
        resolve as their events are confirmed, records in its inbox wait for
        its next attempt, and it stays in the snapshot of later broadcasts -
        so nothing is resolved as done for it while it is away; the rest of
        that record's lane is fenced off for it until the record is advanced
        (see :meth:`Failures.fence`). No-op for a subscriber that
        already failed for good or whose group ended.
        """
        sub.failed_attempts += 1
        self._failures.fail_attempt(sub, error)

    def fail(self, sub: AckSubscriber, error: BaseException) -> None:
        """Force-fail one subscriber: every record it owes resolves as failed.

        It leaves the live set (excluded from later snapshots) and ``error``
        becomes the next thing its iterator raises. Idempotent.
        """
        self._failures.fail(sub, error)

    # -- ack timeout -----------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When the oldest unresolved record times out, or ``None`` if none is outstanding."""
        timeline = self._timeline
        while timeline and not timeline[0].pending:
            timeline.popleft()
        if not timeline:
            return None
        return timeline[0].created_at + self.ack_timeout

    def oldest_unresolved_at(self) -> float | None:
        """When the oldest record still pending was fanned out, or ``None``.

        A read: trims nothing (unlike :meth:`next_deadline`); safe from
        another thread (see the module docstring).
        """
        for record in tuple(self._timeline):
            if record.pending:
                return record.created_at
        return None

    def expire(self, now: float) -> list[tuple[AckSubscriber, EventRecord]]:
        """Time out every subscriber still owing a record created ``ack_timeout`` ago or more.

        The boundary is inclusive. A plain subscriber is force-failed with
        :class:`AckTimeout` (everything it owes fails). A durable one fails
        only the overdue record (see :meth:`Failures.expire`) and stays.
        Returns the ``(subscriber, record)`` pairs that timed out, for
        logging. Looks only at the oldest records.
        """
        return self._failures.expire(now)

    # -- advancing -------------------------------------------------------------

    def take_batch(self, lane: Hashable) -> list[AdvanceItem]:
        """Remove and return ``lane``'s contiguous prefix of fully resolved records.

        The lane stops being ready; an emptied lane is forgotten.
        """
        self.ready.pop(lane, None)
        lane_queue = self.lanes.get(lane)
        batch: list[AdvanceItem] = []
        if lane_queue is None:
            return batch
        clean = self._clean_outcomes
        fenced = self._fenced
        while lane_queue and not lane_queue[0].pending:
            record = lane_queue.popleft()
            if fenced:
                self._failures.lift(record)
            if record.failed or record.rejected or not record.acked:
                outcome = record.outcome()
            else:  # the common case: one shared immutable outcome per snapshot size
                outcome = clean.get(record.acked) or clean.setdefault(
                    record.acked, record.outcome()
                )
            batch.append(_new_tuple(AdvanceItem, (record.broker_payload, outcome)))
        if not lane_queue:
            del self.lanes[lane]
        self.next_deadline()  # trims resolved records off the timeline
        return batch

    def outstanding(self) -> int:
        """How many records were fanned out and not yet taken for advancing.

        A read, safe from another thread (see the module docstring).
        """
        return sum(map(len, tuple(self.lanes.values())))

    def lanes_snapshot(self) -> list[tuple[Hashable, int]]:
        """``(lane, records not yet advanced)`` per lane. A read, safe from another thread."""
        return [(lane, len(records)) for lane, records in tuple(self.lanes.items())]

    def queued_snapshot(self) -> list[tuple[Hashable, int]]:
        """``(trigger_id, records queued, not pulled)`` per subscriber. A read, thread-safe."""
        return [(sub.trigger_id, len(sub.inbox)) for sub in tuple(self.subscribers.values())]

    # -- whole-group teardown --------------------------------------------------

    def terminate(self, error: BaseException) -> None:
        """The group is ending: every subscriber gets ``error``; nothing more resolves.

        Unresolved records are abandoned to broker redelivery; already ready
        lanes can still be taken. Seqs are forgotten so the shared index does
        not keep them.
        """
        for sub in itertools.chain(self.subscribers.values(), self._departed):
            sub.forget_seqs(None)
            self.router.withdraw(sub)
            sub.current = None
            sub.window_seqs = 0
            sub.set_error(error)
        self.fanout.fail_all(error)
        self._departed.clear()
        self._fenced.clear()
        self._timeline.clear()

    # -- internals ---------------------------------------------------------------

    def resolve_failed(
        self, record: EventRecord, by: Hashable, *, unseen: bool = False,
        verdict: Verdict | None = None,
    ) -> None:
        """Subscriber ``by`` (a trigger id) failed on ``record``; ``unseen``: it never pulled it.

        ``by`` is named in the outcome's ``failed_by``, ``verdict`` in its
        verdicts. Marks the lane ready when this was the last pending
        subscriber of its head record.
        """
        record.failed += 1
        add_failed_by(record, by)
        if unseen:
            record.unseen += 1
        if verdict is not None:
            add_verdict(record, verdict)
        record.pending -= 1
        if not record.pending:
            self.record_resolved(record)

    def _resolve_rejected(
        self, record: EventRecord, sub: AckSubscriber, reason: str | None
    ) -> None:
        record.rejected += 1
        sub.rejected += 1
        sub.last_reject = reason or "rejected by a filter"
        add_verdict(record, Verdict(sub.trigger_id, "rejected", sub.last_reject))
        record.pending -= 1
        if not record.pending:
            self.record_resolved(record)

    def owe(self, sub: AckSubscriber, record: EventRecord) -> None:
        """``sub`` moved past ``record`` with bound seqs unconfirmed: it now owes them.

        Its slots stay in the ledger; the last confirmation resolves it.
        """
        sub.window_seqs = 0

    def record_resolved(self, record: EventRecord) -> None:
        """``record`` has no pending subscriber left: mark its lane ready if it is the head."""
        if record.lane_queue[0] is record:
            self.ready[record.lane] = None
            self.on_ready()


def overflow_error(stream: str, trigger_id: Hashable, capacity: int) -> SubscriberOverflow:
    """The error a subscriber of the stream named ``stream`` gets when its inbox was full."""
    return SubscriberOverflow(
        f"shared stream {stream}: trigger {trigger_id!r} fell behind; its queue already "
        f"held {capacity} unprocessed events (shared_stream_subscriber_queue_size)"
    )


def _nothing() -> None:
    """Default ``on_ready``: nobody to wake."""
