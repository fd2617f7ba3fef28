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

Ownership: this module is the only one that changes resolution state (the
records, the books and the :class:`AckSubscriber` fields). The iterators in
:mod:`sharedstream.engine.stream` step :meth:`ResolutionBook.pulls`, the
manager binds through :meth:`ResolutionBook.bind_for` and confirms through
:meth:`SeqRouter.confirm`; nothing else writes here.

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

Seqs carry their subscriber: each subscriber is enrolled in the manager's
:class:`SeqRouter` under a slot, and its seqs are ``slot << SLOT_SHIFT``
plus a counter. Routing a confirmation is one lookup by slot, and the only
per-seq state is the subscriber's own ``seqs`` entry.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable, Iterable
from typing import Any

from sharedstream.engine.errors import AckTimeout, SubscriberOverflow
from sharedstream.engine.fanout import Accept, FanOut, Subscriber
from sharedstream.engine.producer import AdvanceItem, AdvanceOutcome, Verdict, annotated_outcome

__all__ = [
    "SLOT_SHIFT", "AckSubscriber", "EventRecord", "ResolutionBook", "SeqRouter", "overflow_error",
]

_new_tuple = tuple.__new__
"""Builds the NamedTuples below without their Python-level ``__new__`` (hot path)."""

SLOT_SHIFT = 48
"""Bits of a seq that count a subscriber's own binds (2**48: centuries at any rate)."""


class EventRecord:
    """One fanned-out raw event and how far its snapshot got in resolving it."""

    __slots__ = (
        "acked",
        "broker_payload",
        "created_at",
        "failed",
        "lane",
        "lane_queue",
        "pending",
        "position",
        "raw",
        "rejected",
        "unseen",
        "verdicts",
    )

    def __init__(  # noqa: PLR0917 - built once per raw event on the hot path
        self,
        position: int,
        raw: Any,
        broker_payload: Any,
        lane: Hashable,
        lane_queue: deque[EventRecord],
        created_at: float,
    ) -> None:
        self.position = position
        self.raw = raw
        self.broker_payload = broker_payload
        self.lane = lane
        self.lane_queue = lane_queue
        self.created_at = created_at
        self.pending = 0
        self.acked = 0
        self.failed = 0
        self.rejected = 0
        self.unseen = 0  # failures of subscribers that never pulled it (part of failed)
        self.verdicts: list[Verdict] | None = None  # who failed on it or rejected it, and why

    def outcome(self) -> AdvanceOutcome:
        """The resolution counts handed to the producer."""
        if self.unseen or self.verdicts:
            return annotated_outcome(
                self.acked, self.failed, self.rejected, unseen=self.unseen,
                verdicts=tuple(self.verdicts or ()),
            )
        return _new_tuple(AdvanceOutcome, (self.acked, self.failed, self.rejected))

    def __repr__(self) -> str:
        return (
            f"EventRecord(#{self.position}, lane={self.lane!r}, pending={self.pending}, "
            f"acked={self.acked}, failed={self.failed}, rejected={self.rejected})"
        )


class AckSubscriber(Subscriber):
    """A subscriber in ack mode: its inbox holds records, plus its window ledger.

    ``current`` is the record whose window is open (``None`` when none is);
    ``window_seqs`` counts seqs bound to it and not yet confirmed.

    ``ledger`` holds one slot per seq this subscriber bound and has not had
    confirmed yet, in seq order: ``ledger[i]`` is the record of seq
    ``ledger_base + i``, or ``None`` once confirmed (a subscriber's seqs are
    consecutive, and the seqs of one window contiguous). A record it moved
    past while still in the ledger is *owed*: it resolves as acked when its
    last slot is confirmed. Leading ``None`` slots are trimmed at once, so
    ``ledger_base + len(ledger) == next_seq`` always holds.
    """

    __slots__ = (
        "bind_index", "book", "bound_record", "current", "departed", "fences", "interrupt",
        "ledger", "ledger_base", "next_seq", "on_interrupt", "window_seqs",
    )

    def __init__(
        self, trigger_id: Hashable, book: ResolutionBook, *, durable: bool = False
    ) -> None:
        super().__init__(trigger_id, durable=durable)
        self.book = book
        self.inbox: deque[EventRecord]  # narrowed: an ack inbox holds records only
        self.current: EventRecord | None = None
        self.window_seqs = 0
        self.ledger: deque[EventRecord | None] = deque()
        self.ledger_base = 0
        self.departed = False
        self.bound_record: EventRecord | None = None  # the window the last bind went to
        self.bind_index = 0  # that bind's index among the binds of its window
        self.next_seq = 0  # set by SeqRouter.enroll: slot << SLOT_SHIFT
        # Durable members only: an error for the attempt now consuming (its filter hung on
        # a record past the ack timeout), raised at its next pull, and who to tell at once.
        self.interrupt: BaseException | None = None
        self.on_interrupt: Callable[[BaseException], None] | None = None
        # Durable members only: lane -> the record that failed for it there, until that
        # record is advanced; the lane's later records fail for it (see _fence).
        self.fences: dict[Hashable, EventRecord] | None = None

    def owes(self, record: EventRecord) -> bool:
        """Whether ``record`` is still pending for this subscriber."""
        if record is self.current or record in self.ledger:
            return True
        inbox = self.inbox
        if not inbox or inbox[0].position > record.position:
            return False
        # A prefiltered subscriber's inbox has gaps: look the record up (rare path).
        return self.accept is None or record in inbox


class SeqRouter:
    """Gives each ack-mode subscriber a slot and routes seqs back to it.

    One router per manager, shared by its groups, so seqs are unique per
    manager. A subscriber stays enrolled while a confirmation can still
    matter to it; afterwards its seqs route nowhere and are ignored.
    """

    def __init__(self) -> None:
        self._slots: dict[int, AckSubscriber] = {}
        self._next_slot = itertools.count(1)

    def enroll(self, sub: AckSubscriber) -> None:
        """Give ``sub`` a fresh slot; its seqs start at ``slot << SLOT_SHIFT``."""
        slot = next(self._next_slot)
        sub.next_seq = sub.ledger_base = slot << SLOT_SHIFT
        self._slots[slot] = sub

    def withdraw(self, sub: AckSubscriber) -> None:
        """Stop routing ``sub``'s seqs. Idempotent."""
        slot = sub.next_seq >> SLOT_SHIFT
        if self._slots.get(slot) is sub:
            del self._slots[slot]

    def route(self, seq: int) -> AckSubscriber | None:
        """The enrolled subscriber that bound ``seq``, if any."""
        return self._slots.get(seq >> SLOT_SHIFT)

    def confirm(self, seqs: Iterable[int]) -> None:
        """The trigger events behind ``seqs`` are stored: confirm each in its subscriber's book.

        Seqs are unique per manager, so a confirmation goes straight to the
        book of the subscriber that bound it (one lookup by slot), whatever
        group that is. Unknown seqs (already confirmed, or whose subscriber
        failed, left for good or whose group ended) are ignored.
        """
        slots = self._slots
        for seq in seqs:
            sub = slots.get(seq >> SLOT_SHIFT)
            if sub is not None:
                sub.book.confirm(sub, seq)

    def refuse(self, seq: int, reason: str) -> None:
        """The store refused the event behind ``seq`` for good: :meth:`ResolutionBook.refuse`."""
        sub = self._slots.get(seq >> SLOT_SHIFT)
        if sub is not None:
            sub.book.refuse(sub, seq, reason)

    def unconfirmed(self) -> set[int]:
        """Every seq still awaiting confirmation (for tests and diagnostics)."""
        return {
            sub.ledger_base + i
            for sub in self._slots.values()
            for i, record in enumerate(sub.ledger)
            if record is not None
        }


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
    ) -> None:
        self.key = key
        self.fanout = fanout
        self.ack_timeout = ack_timeout
        self.clock = clock
        self.router = router if router is not None else SeqRouter()
        self.on_ready: Callable[[], None] = on_ready or _nothing
        self.subscribers: dict[Hashable, AckSubscriber] = {}
        self.lanes: dict[Hashable, deque[EventRecord]] = {}
        self.ready: dict[Hashable, None] = {}  # insertion-ordered set of ready lanes
        self._timeline: deque[EventRecord] = deque()
        self._departed: set[AckSubscriber] = set()
        self._fenced: set[AckSubscriber] = set()
        self._positions = itertools.count()
        self._clean_outcomes: dict[int, AdvanceOutcome] = {}

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
                self._resolve_failed(record, unseen=True)
            sub.inbox.clear()
            self.next_record(sub)  # with an empty inbox this only closes the window
        if sub.ledger:
            self._departed.add(sub)
        else:
            self.router.withdraw(sub)

    # -- fan-out ------------------------------------------------------------

    def broadcast(
        self, raw: Any, broker_payload: Any, lane: Hashable, now: float
    ) -> list[AckSubscriber] | None:
        """Create the record of one raw event and deliver it to every live subscriber.

        The snapshot is the live set at this moment. A subscriber whose
        prefilter declines ``raw`` resolves the record as acked at once (it
        never sees it). A subscriber whose inbox is full is force-failed with
        :class:`SubscriberOverflow` (this record counts as failed for it);
        those subscribers are returned, ``None`` when there are none. Raises
        ``TypeError`` before changing anything if ``lane`` is unhashable.
        """
        lane_queue = self.lanes.get(lane)
        if lane_queue is None:
            lane_queue = self.lanes[lane] = deque()
        record = EventRecord(next(self._positions), raw, broker_payload, lane, lane_queue, now)
        lane_queue.append(record)
        fanout = self.fanout
        record.pending = len(fanout.live)
        if not record.pending:
            self.record_resolved(record)
            return None
        self._timeline.append(record)
        overflowed: list[AckSubscriber] | None = fanout.broadcast(record, raw)  # type: ignore[assignment]
        skipped = fanout.skipped
        fenced = self._apply_fences(record) if self._fenced else 0
        if skipped or fenced:  # declined by prefilters, or fenced off (see _fence)
            record.acked += skipped
            record.failed += fenced
            record.unseen += fenced
            record.pending -= skipped + fenced
            if not record.pending:
                self.record_resolved(record)
        if overflowed is not None:
            for sub in overflowed:
                self._resolve_failed(record, unseen=True)
                self.fail(sub, overflow_error(self.key, sub.trigger_id, fanout.capacity))
        return overflowed

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
        durable subscriber's pending interrupt (see :meth:`_expire_durable`)
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
        if at < 0:  # the usual in-order confirmation: _still_owed's forward scan, inlined
            if ledger and ledger[0] is record:
                return
        elif _still_owed(ledger, at, record):
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
            self._forget_seqs(sub, record)
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
        self._forget_seqs(sub, record)
        self._resolve_rejected(record, sub, reason)
        if sub.departed and not sub.ledger:
            self._departed.discard(sub)
            self.router.withdraw(sub)

    def set_interrupt_handler(
        self, sub: AckSubscriber, handler: Callable[[BaseException], None] | None
    ) -> None:
        """Who to tell, synchronously, when the ack timeout interrupts durable ``sub``'s attempt.

        Called from :meth:`_expire_durable` (in the watchdog's task) with the
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
        so nothing is resolved as done for it while it is away. No-op for a
        subscriber that already failed for good or whose group ended.
        """
        if sub.error is not None:
            return
        sub.interrupt = None
        record = sub.current
        if record is None:
            return
        sub.current = None
        if sub.window_seqs:
            self._forget_seqs(sub, record)
            sub.window_seqs = 0
        self._fence(sub, record)
        self._resolve_failed(record, verdict=_failure(sub, error))

    def fail(self, sub: AckSubscriber, error: BaseException) -> None:
        """Force-fail one subscriber: every record it owes resolves as failed.

        It leaves the live set (excluded from later snapshots) and ``error``
        becomes the next thing its iterator raises. Idempotent.
        """
        if sub.error is not None:
            return
        self.fanout.drop(sub)
        self._fenced.discard(sub)
        for record in sub.inbox:
            self._resolve_failed(record, unseen=True)
        current = sub.current
        if current is not None:
            sub.current = None
            sub.window_seqs = 0
            self._resolve_failed(current)
        # Records it moved past and still owes, each once (the open window's
        # record, resolved above, has slots here too).
        for owed in dict.fromkeys(sub.ledger):
            if owed is not None and owed is not current:
                self._resolve_failed(owed)
        self._forget_seqs(sub, None)
        self._departed.discard(sub)
        self.router.withdraw(sub)
        sub.set_error(error)

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
        only the overdue record (see :meth:`_expire_durable`) and stays.
        Returns the ``(subscriber, record)`` pairs that timed out, for
        logging. Looks only at the oldest records.
        """
        expired: list[tuple[AckSubscriber, EventRecord]] = []
        timeline = self._timeline
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > now:
                return expired
            record = timeline[0]
            candidates = itertools.chain(list(self.subscribers.values()), list(self._departed))
            for sub in candidates:
                if sub.error is None and sub.owes(record):
                    expired.append((sub, record))
                    error = AckTimeout(
                        f"shared stream {self.key!r}: trigger {sub.trigger_id!r} did not "
                        f"resolve event #{record.position} within {self.ack_timeout}s "
                        "(its filter was still on the event, or trigger events it "
                        "derived were not confirmed persisted)"
                    )
                    if sub.durable and not sub.departed:
                        self._expire_durable(sub, record, error)
                    else:
                        self.fail(sub, error)
            if record.pending:  # pragma: no cover - would be a bookkeeping bug
                raise AssertionError(f"{record!r} still pending after its subscribers timed out")

    def _expire_durable(self, sub: AckSubscriber, record: EventRecord, error: AckTimeout) -> None:
        """``record`` timed out for durable ``sub``: it fails for ``sub``, which stays a member.

        * Its filter is still on it (hung): a failure of its own; the attempt
          is interrupted (``on_interrupt``, then raised at its next pull).
        * It moved past it but the events it derived were not confirmed (the
          store is slow): an unseen failure; those seqs are dropped.
        * It never pulled it (behind, or away): an unseen failure; the record
          leaves its inbox.

        Either way the broker redelivers the record, and the redelivery
        reaches ``sub`` because it is still in the snapshot.
        """
        if record is sub.current:
            self.fail_attempt(sub, error)
            sub.interrupt = error  # its filter is not in our iterator: it hangs elsewhere
            if sub.on_interrupt is not None:
                sub.on_interrupt(error)
            return
        if record in sub.ledger:  # it saw the record: a redelivery repeats it, in order
            self._forget_seqs(sub, record)
        else:
            sub.inbox.remove(record)
            self._fence(sub, record)
        self._resolve_failed(record, unseen=True)

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
                self._unfence(record)
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
            self._forget_seqs(sub, None)
            self.router.withdraw(sub)
            sub.current = None
            sub.window_seqs = 0
            sub.set_error(error)
        self.fanout.fail_all(error)
        self._departed.clear()
        self._fenced.clear()
        self._timeline.clear()

    # -- lane fences (durable members) ------------------------------------------------

    def _fence(self, sub: AckSubscriber, record: EventRecord) -> None:
        """``record`` fails for durable ``sub``: keep the rest of its lane from ``sub`` for now.

        The broker redelivers ``record``; the lane's later records must not
        reach ``sub`` before that, or it would see the lane out of order.
        So those queued for it fail for it at once (unseen), and so do those
        broadcast until ``record`` is taken for advancing - the producer
        then rewinds the lane (or holds it), and what it delivers next comes
        in order again. Every other member is unaffected.
        """
        lane = record.lane
        inbox = sub.inbox
        if any(queued.lane == lane for queued in inbox):
            kept = [queued for queued in inbox if queued.lane != lane]
            dropped = [queued for queued in inbox if queued.lane == lane]
            inbox.clear()  # in place: the fan-out holds this very deque
            inbox.extend(kept)
            for queued in dropped:
                self._resolve_failed(queued, unseen=True)
            self.fanout.relieve(sub)
        if sub.fences is None:
            sub.fences = {}
        sub.fences[lane] = record
        self._fenced.add(sub)

    def _apply_fences(self, record: EventRecord) -> int:
        """Take ``record`` back from members whose fence covers its lane; how many."""
        lane = record.lane
        fenced = 0
        for sub in self._fenced:
            inbox = sub.inbox
            if sub.fences and lane in sub.fences and inbox and inbox[-1] is record:
                inbox.pop()
                fenced += 1
        return fenced

    def _unfence(self, record: EventRecord) -> None:
        """``record`` is being advanced: lift the fences it put up."""
        for sub in list(self._fenced):
            fences = sub.fences
            if fences is not None and fences.get(record.lane) is record:
                del fences[record.lane]
                if not fences:
                    sub.fences = None
                    self._fenced.discard(sub)

    # -- internals ---------------------------------------------------------------

    def _resolve_failed(
        self, record: EventRecord, *, unseen: bool = False, verdict: Verdict | None = None
    ) -> None:
        """One subscriber failed on ``record``; ``unseen``: it never pulled it."""
        record.failed += 1
        if unseen:
            record.unseen += 1
        if verdict is not None:
            _add_verdict(record, verdict)
        record.pending -= 1
        if not record.pending:
            self.record_resolved(record)

    def _resolve_rejected(
        self, record: EventRecord, sub: AckSubscriber, reason: str | None
    ) -> None:
        record.rejected += 1
        _add_verdict(record, Verdict(sub.trigger_id, "rejected", reason or "rejected by a filter"))
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

    def _forget_seqs(self, sub: AckSubscriber, record: EventRecord | None) -> None:
        """Drop ``sub``'s unconfirmed seqs (only those bound to ``record`` unless ``None``)."""
        ledger = sub.ledger
        if record is None:
            ledger.clear()
            sub.ledger_base = sub.next_seq
            return
        for index, bound in enumerate(ledger):
            if bound is record:
                ledger[index] = None
        while ledger and ledger[0] is None:
            ledger.popleft()
            sub.ledger_base += 1


def overflow_error(key: Hashable, trigger_id: Hashable, capacity: int) -> SubscriberOverflow:
    """The error a subscriber gets when its inbox was full at fan-out."""
    return SubscriberOverflow(
        f"shared stream {key!r}: trigger {trigger_id!r} fell behind; its queue already "
        f"held {capacity} unprocessed events (shared_stream_subscriber_queue_size)"
    )


def _still_owed(ledger: deque[EventRecord | None], index: int, record: EventRecord) -> bool:
    """Whether ``record`` has another unconfirmed slot around position ``index``.

    A record's slots are contiguous; confirmed slots (``None``) may sit
    among them, so the scan crosses ``None`` and stops at another record.
    ``index`` is negative when the confirmed slot was trimmed off the front
    together with confirmed slots right after it: the forward scan then
    starts at the new front.
    """
    for step in (-1, 1):
        at = index - 1 if step < 0 else max(index + 1, 0)
        while 0 <= at < len(ledger):
            bound = ledger[at]
            if bound is record:
                return True
            if bound is not None:
                break
            at += step
    return False


def _nothing() -> None:
    """Default ``on_ready``: nobody to wake."""


def _add_verdict(record: EventRecord, verdict: Verdict) -> None:
    if record.verdicts is None:
        record.verdicts = [verdict]
    else:
        record.verdicts.append(verdict)


def _failure(sub: AckSubscriber, error: BaseException) -> Verdict:
    """The verdict of ``sub`` failing on a record with ``error``."""
    return Verdict(sub.trigger_id, "failed", _describe(error))


def _describe(error: BaseException) -> str:
    """``"RuntimeError: boom"`` on one line, at most 500 characters."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= 500 else text[:497] + "..."
