"""The seq router: every ack-mode subscriber's slot, and where a seq belongs.

A *seq* names one trigger event bound to a record (see
:mod:`sharedstream.engine.resolution`). Seqs carry their subscriber: each
subscriber is enrolled in the manager's :class:`SeqRouter` under a slot, and
its seqs are ``slot << SLOT_SHIFT`` plus a counter. Routing a confirmation is
one lookup by slot, and the only per-seq state is the subscriber's own ledger
entry (:class:`~sharedstream.engine.ack_subscriber.AckSubscriber`).

Invariant: a slot routes to at most one subscriber, and a subscriber is
enrolled while a confirmation can still matter to it; once withdrawn, its
seqs route nowhere and are ignored (invariant 4 of the book).

Ownership: one of the resolution modules listed in
:mod:`sharedstream.engine.resolution`, the only modules that change
resolution state. The manager confirms and refuses seqs
through :meth:`SeqRouter.confirm` and :meth:`SeqRouter.refuse`; the book
enrolls and withdraws its subscribers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from sharedstream.engine.ack_subscriber import AckSubscriber

__all__ = ["SLOT_SHIFT", "SeqRouter"]

SLOT_SHIFT = 48
"""Bits of a seq that count a subscriber's own binds (2**48: centuries at any rate)."""


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
        """The store refused the event behind ``seq`` for good: its book's ``refuse``."""
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
