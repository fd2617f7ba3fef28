"""The failure paths of a resolution book: forced failures, the ack timeout, durable members.

:class:`Failures` is the part of a group's
:class:`~sharedstream.engine.resolution.ResolutionBook` that resolves records
as *failed* when something went wrong, rather than as a subscriber's own
doing:

* a subscriber is **force-failed** (queue overflow, ack timeout): every
  record it owes fails and it leaves the live set for good;
* the **ack timeout** walks the book's timeline (records in fan-out order)
  and times out whoever still owes its oldest records - live subscribers
  and those that left with seqs unconfirmed (``departed``);
* a **durable member** (a trigger the runner restarts in place, see
  :mod:`sharedstream.engine.membership`) stays in the snapshot when an
  attempt of its filter fails or hangs: only the record the attempt was on
  fails for it (the broker redelivers it, and the redelivery reaches the
  member), and a *fence* keeps the rest of that record's lane from the
  member until the record is taken for advancing, so the member never sees
  a lane out of order. Every other member is unaffected.

Invariants: a member is in :attr:`Failures.fenced` exactly while its
``fences`` map is not empty, and a fence is lifted by the advance of the
record that put it up (:meth:`Failures.lift`) or dropped with the member;
a subscriber in :attr:`Failures.departed` has left and still has unconfirmed
seqs; the timeline holds records in creation order, so the ack timeout only
looks at its front.

Ownership: one of the resolution modules listed in
:mod:`sharedstream.engine.resolution`, the only modules that change
resolution state. Only its book calls it, on the event loop; records resolve
through the book's ``resolve_failed``. It knows its book only as a
:class:`FailingBook` (what the failure paths read and call), so it does not
import the book's module: that one imports it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable, Mapping
from typing import Protocol

from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.errors import AckTimeout
from sharedstream.engine.fanout import FanOut
from sharedstream.engine.producer import Verdict
from sharedstream.engine.records import EventRecord, add_failed_by, failure_verdict
from sharedstream.engine.seqs import SeqRouter

__all__ = ["FailingBook", "Failures"]


class FailingBook(Protocol):
    """The book :class:`Failures` works for, as the failure paths see it.

    :class:`~sharedstream.engine.resolution.ResolutionBook` is the one
    implementation (its attributes and methods state the contracts). Read
    and called on the event loop only, from inside the book's own calls.
    """

    @property
    def name(self) -> str:
        """The stream's name (in ack timeout errors: see :mod:`sharedstream.engine.names`)."""

    @property
    def ack_timeout(self) -> float:
        """Seconds a subscriber has to resolve a record."""

    @property
    def fanout(self) -> FanOut:
        """The group's fan-out: a failed subscriber is dropped from it."""

    @property
    def router(self) -> SeqRouter:
        """The manager's seq router: a failed subscriber is withdrawn from it."""

    @property
    def subscribers(self) -> Mapping[Hashable, AckSubscriber]:
        """The live subscribers, by trigger id."""

    def next_deadline(self) -> float | None:
        """When the oldest unresolved record times out; ``None`` when none is left."""

    def resolve_failed(
        self, record: EventRecord, by: Hashable, *, unseen: bool = False,
        verdict: Verdict | None = None,
    ) -> None:
        """Subscriber ``by`` failed on ``record``; ``unseen``: it never pulled it."""


class Failures:
    """The failure paths of one book, and the containers only they walk.

    ``timeline`` holds the book's unresolved records in fan-out order (the
    book appends on broadcast and trims resolved ones off its front);
    ``departed`` the subscribers that left with seqs unconfirmed; ``fenced``
    the durable members with a fence up. The book keeps aliases of these
    three and tests ``fenced`` on every broadcast and advance (an empty set
    costs one truth test).
    """

    __slots__ = ("book", "departed", "fenced", "timeline")

    def __init__(self, book: FailingBook) -> None:
        self.book = book
        self.timeline: deque[EventRecord] = deque()
        self.departed: set[AckSubscriber] = set()
        self.fenced: set[AckSubscriber] = set()

    def fail(self, sub: AckSubscriber, error: BaseException) -> None:
        """The work of :meth:`ResolutionBook.fail` (see its contract)."""
        if sub.error is not None:
            return
        book = self.book
        book.fanout.drop(sub)
        self.fenced.discard(sub)
        who = sub.trigger_id
        for record in sub.inbox:
            book.resolve_failed(record, who, unseen=True)
        current = sub.current
        if current is not None:
            sub.current = None
            sub.window_seqs = 0
            book.resolve_failed(current, who)
        # Records it moved past and still owes, each once (the open window's
        # record, resolved above, has slots here too).
        for owed in dict.fromkeys(sub.ledger):
            if owed is not None and owed is not current:
                book.resolve_failed(owed, who)
        sub.forget_seqs(None)
        self.departed.discard(sub)
        book.router.withdraw(sub)
        sub.set_error(error)

    def expire(self, now: float) -> list[tuple[AckSubscriber, EventRecord]]:
        """The work of :meth:`ResolutionBook.expire` (see its contract)."""
        book = self.book
        expired: list[tuple[AckSubscriber, EventRecord]] = []
        timeline = self.timeline
        while True:
            deadline = book.next_deadline()
            if deadline is None or deadline > now:
                return expired
            record = timeline[0]
            candidates = itertools.chain(list(book.subscribers.values()), list(self.departed))
            for sub in candidates:
                if sub.error is None and sub.owes(record):
                    expired.append((sub, record))
                    error = AckTimeout(
                        f"shared stream {book.name}: trigger {sub.trigger_id!r} did not "
                        f"resolve event #{record.position} within {book.ack_timeout}s "
                        "(its filter was still on the event, or trigger events it "
                        "derived were not confirmed persisted)"
                    )
                    if sub.durable and not sub.departed:
                        self._expire_durable(sub, record, error)
                    else:
                        self.fail(sub, error)
            if record.pending:  # pragma: no cover - would be a bookkeeping bug
                raise AssertionError(f"{record!r} still pending after its subscribers timed out")

    def fail_attempt(self, sub: AckSubscriber, error: BaseException) -> None:
        """The work of :meth:`ResolutionBook.fail_attempt` (see its contract)."""
        if sub.error is not None:
            return
        sub.interrupt = None
        record = sub.current
        if record is None:
            return
        sub.current = None
        if sub.window_seqs:
            sub.forget_seqs(record)
            sub.window_seqs = 0
        self.fence(sub, record)
        self.book.resolve_failed(record, sub.trigger_id,
                                 verdict=failure_verdict(sub.trigger_id, error))

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
            sub.forget_seqs(record)
        else:
            sub.inbox.remove(record)
            self.fence(sub, record)
        self.book.resolve_failed(record, sub.trigger_id, unseen=True)

    def fence(self, sub: AckSubscriber, record: EventRecord) -> None:
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
            book = self.book
            for queued in dropped:
                book.resolve_failed(queued, sub.trigger_id, unseen=True)
            book.fanout.relieve(sub)
        if sub.fences is None:
            sub.fences = {}
        sub.fences[lane] = record
        self.fenced.add(sub)

    def apply_fences(self, record: EventRecord) -> int:
        """Take ``record``, just broadcast, back from members fenced on its lane; how many.

        Each is named in ``record.failed_by`` (the caller counts them as
        unseen failures).
        """
        lane = record.lane
        fenced = 0
        for sub in self.fenced:
            inbox = sub.inbox
            if sub.fences and lane in sub.fences and inbox and inbox[-1] is record:
                inbox.pop()
                fenced += 1
                add_failed_by(record, sub.trigger_id)
        return fenced

    def lift(self, record: EventRecord) -> None:
        """``record`` is being advanced: lift the fences it put up."""
        for sub in list(self.fenced):
            fences = sub.fences
            if fences is not None and fences.get(record.lane) is record:
                del fences[record.lane]
                if not fences:
                    sub.fences = None
                    self.fenced.discard(sub)
