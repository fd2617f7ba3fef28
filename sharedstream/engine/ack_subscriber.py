"""The per-subscriber resolution state of ack mode: binding window and seq ledger.

An :class:`AckSubscriber` is one subscriber of one group's
:class:`~sharedstream.engine.resolution.ResolutionBook`: its inbox of records
not pulled yet, the record whose binding window is open, the ledger of the
seqs it bound and that were not confirmed yet, and - for a durable member -
its pending interrupt and its lane fences (see :mod:`sharedstream.engine.failures`).

Invariants (part of those of :mod:`sharedstream.engine.resolution`):

* ``ledger_base + len(ledger) == next_seq``: leading confirmed slots are
  trimmed at once (:meth:`AckSubscriber.forget_seqs` and the book's
  ``confirm`` keep it so).
* A subscriber that failed or departed owes nothing once its ledger is
  empty, and its seqs are forgotten (invariant 4).

Ownership: one of the resolution modules listed in
:mod:`sharedstream.engine.resolution`, the only modules that change
resolution state. Everything here is called by them, on
the event loop. It knows its book only as an :class:`OwningBook` (what the
seq router asks of it), so it imports no other resolution module: they
import it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Protocol

from sharedstream.engine.fanout import Subscriber
from sharedstream.engine.records import EventRecord

__all__ = ["AckSubscriber", "OwningBook", "still_owed"]


class OwningBook(Protocol):
    """The book an :class:`AckSubscriber` belongs to, as the seq router reaches it.

    :class:`~sharedstream.engine.resolution.ResolutionBook` is the one
    implementation (see its methods for the contracts). Both are called on
    the event loop, by :class:`~sharedstream.engine.seqs.SeqRouter` only,
    with a subscriber of this very book.
    """

    def confirm(self, sub: AckSubscriber, seq: int) -> None:
        """The trigger event ``sub`` bound under ``seq`` is stored; unknown seqs are ignored."""

    def refuse(self, sub: AckSubscriber, seq: int, reason: str) -> None:
        """The store refused the trigger event bound under ``seq`` for good."""


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
        "bind_index", "book", "bound_record", "current", "departed", "failed_attempts", "fences",
        "interrupt", "joined_at", "last_reject", "ledger", "ledger_base", "matched", "next_seq",
        "on_interrupt", "rejected", "window_seqs",
    )

    def __init__(
        self, trigger_id: Hashable, book: OwningBook, *, durable: bool = False
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
        # record is advanced; the lane's later records fail for it (see Failures.fence).
        self.fences: dict[Hashable, EventRecord] | None = None
        # Why it fired or not, for status views (read on the loop, never reset): the book's
        # broadcasts when it joined, trigger events it emitted (binds), raw events it
        # rejected (and the last reason), and attempts of its filter that failed.
        self.joined_at = 0
        self.matched = 0
        self.rejected = 0
        self.last_reject: str | None = None
        self.failed_attempts = 0

    def owes(self, record: EventRecord) -> bool:
        """Whether ``record`` is still pending for this subscriber."""
        if record is self.current or record in self.ledger:
            return True
        inbox = self.inbox
        if not inbox or inbox[0].position > record.position:
            return False
        # A prefiltered subscriber's inbox has gaps: look the record up (rare path).
        return self.accept is None or record in inbox

    def forget_seqs(self, record: EventRecord | None) -> None:
        """Drop unconfirmed seqs (only those bound to ``record`` unless ``None``).

        Their confirmations will then be ignored. Keeps the ledger trimmed.
        """
        ledger = self.ledger
        if record is None:
            ledger.clear()
            self.ledger_base = self.next_seq
            return
        for index, bound in enumerate(ledger):
            if bound is record:
                ledger[index] = None
        while ledger and ledger[0] is None:
            ledger.popleft()
            self.ledger_base += 1


def still_owed(ledger: deque[EventRecord | None], index: int, record: EventRecord) -> bool:
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
