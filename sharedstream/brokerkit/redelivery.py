"""Redelivery accounting: which failures count toward ``max_redeliveries``.

A message that keeps failing (a *poison* message) is dead-lettered once it
failed more than ``max_redeliveries`` times, so it cannot hold its lane
forever. Only a failure that is the message's own doing counts: when every
failed subscriber failed while the message was still queued for it
(``outcome.unseen == outcome.failed``: it died on an *earlier* message),
the message is redelivered but the delivery is not held against it;
otherwise one message that keeps killing a trigger would drag every message
queued behind it to the dead letters.

:class:`RedeliveryPolicy` is the rule, :class:`DeliveryTally` a bounded
per-message count a producer keeps (failures, or deliveries to discount
from a broker's receive count). Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sharedstream.engine.producer import AdvanceOutcome

__all__ = ["DeliveryTally", "RedeliveryPolicy"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class RedeliveryPolicy:
    """The poison-message rule for one producer."""

    max_redeliveries: int
    """Failed deliveries a message may have before it is dead-lettered (>= 0)."""

    @staticmethod
    def counts(outcome: AdvanceOutcome) -> bool:
        """Whether this outcome's failure counts against the message (``failed > unseen``)."""
        return outcome.failed > outcome.unseen

    def exhausted(self, failures: int) -> bool:
        """Whether ``failures`` counted failures make the message poison."""
        return failures > self.max_redeliveries

    def poisoned_on_arrival(self, deliveries: int) -> bool:
        """Whether a message delivered ``deliveries`` times must not be fanned out again.

        ``deliveries`` counts this one and only the earlier ones that may
        have been the message's own failures: a caller discounts those it
        knows were not (bounced behind another message, a lease that lapsed
        while nobody failed on it: see ``LaneFloors.poisoned_on_arrival``).
        What is left is what nobody can vouch for: a crash while it was
        held, another consumer's failure.
        """
        return deliveries > self.max_redeliveries + 1


class DeliveryTally(Generic[K]):
    """A count per message id, bounded: past ``capacity`` ids the oldest is forgotten.

    Bounded because a message another consumer took, or one whose lane was
    revoked, never resolves here and would otherwise be kept forever.
    Forgetting a count only makes the poison rule later, never wrong in the
    unsafe direction (nothing is dead-lettered early).
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._counts: dict[K, int] = {}

    def add(self, key: K, n: int = 1) -> int:
        """Add ``n`` to ``key``'s count and return the new count."""
        count = self._counts[key] = self._counts.get(key, 0) + n
        if self.capacity is not None:
            while len(self._counts) > self.capacity:
                del self._counts[next(iter(self._counts))]
        return count

    def get(self, key: K) -> int:
        """``key``'s count (0 when unknown or forgotten)."""
        return self._counts.get(key, 0)

    def forget(self, key: K) -> None:
        """Drop ``key``'s count (it resolved for good)."""
        self._counts.pop(key, None)

    def __len__(self) -> int:
        return len(self._counts)
