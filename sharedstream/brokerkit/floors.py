"""Lane floors: what a broker does with each advanced message when it redelivers one at a time.

Brokers that redeliver a single message on a negative acknowledgement -
Pub/Sub (nack), Service Bus (abandon) - keep the order of an ordered lane
(an ordering key, a session) only if, once a message of the lane failed,
the lane's later messages are handed back too, so that all of them come
again after it, in order. The failed message is the lane's *floor*; the
messages behind it are *bounced*: handed back, but not counted against
them (they only failed to be settled because of the floor).

:class:`LaneFloors` keeps the floors and the two per-message tallies that
the redelivery rule (:mod:`.redelivery`) needs, and places each advanced
message:

* :data:`SETTLE` - clean: settle it (ack, complete); its tallies are forgotten;
* :data:`AGAIN` - it failed: hand it back (nack, abandon), counted when the
  failure was its own (``RedeliveryPolicy.counts``), else bounced; on an
  ordered lane it becomes the floor;
* :data:`BOUNCE` - behind its lane's floor: hand it back, uncounted;
* :data:`POISON` - it failed more than ``max_redeliveries`` times: dead-letter it;
* :data:`REJECTED` - a subscriber refused it: dead-letter it;
* :data:`LEAVE` - fanned out to nobody: leave it to the broker (its lease lapses).

The floor's own message comes back first (the broker redelivers it before
the lane's later ones); seeing it again lifts the floor, and so does its
dead-lettering when it arrives (``forget``). A lane whose floor
never comes back (another consumer took the message) is forgotten once more
than ``capacity`` lanes hold one; so are the oldest tallies. Forgetting only
makes the poison rule later, never early. Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Generic, TypeVar

from sharedstream.brokerkit.redelivery import DeliveryTally, RedeliveryPolicy
from sharedstream.engine.producer import AdvanceOutcome

__all__ = ["AGAIN", "BOUNCE", "LEAVE", "POISON", "REJECTED", "SETTLE", "LaneFloors"]

K = TypeVar("K", bound=Hashable)

SETTLE: Final = "settle"
AGAIN: Final = "again"
BOUNCE: Final = "bounce"
POISON: Final = "poison"
REJECTED: Final = "rejected"
LEAVE: Final = "leave"


class LaneFloors(Generic[K]):
    """The floors of ordered lanes and the failure tallies of messages, keyed by message id."""

    def __init__(self, policy: RedeliveryPolicy, *, capacity: int = 4096) -> None:
        self.policy = policy
        self.capacity = capacity
        self._floors: dict[Hashable, K] = {}
        self.failures: DeliveryTally[K] = DeliveryTally(capacity)
        """Failures counted against each message (its own)."""
        self.bounced: DeliveryTally[K] = DeliveryTally(capacity)
        """Deliveries of each message that were not its own failures (discount them from a
        broker's delivery count)."""

    def floor(self, lane: Hashable) -> K | None:
        """The message holding ``lane``, or ``None``."""
        return self._floors.get(lane)

    def place(self, lane: Hashable, key: K, outcome: AdvanceOutcome, *, ordered: bool) -> str:
        """Where the advanced message ``key`` of ``lane`` goes (see the module docstring).

        ``ordered``: the lane keeps an order (a key, a session), so a failure
        becomes its floor; a lane of one message never needs one.
        """
        floors = self._floors
        floor = floors.get(lane)
        if floor == key:
            del floors[lane]
        elif floor is not None:
            self.bounced.add(key)
            return BOUNCE
        if outcome.failed:
            if self.policy.counts(outcome):
                failures = self.failures.add(key)
            else:  # it only failed because a subscriber died on another message
                self.bounced.add(key)
                failures = self.failures.get(key)
            if self.policy.exhausted(failures):
                return POISON
            if ordered:
                floors[lane] = key
                if len(floors) > self.capacity:
                    del floors[next(iter(floors))]
            return AGAIN
        if outcome.rejected:
            return REJECTED
        if outcome.acked:
            self._forget_tallies(key)  # its floor, if it held one, is lifted above
            return SETTLE
        return LEAVE

    def poisoned_on_arrival(self, key: K, deliveries: int, *, taken: int = 0) -> bool:
        """Whether ``key`` must not be fanned out again: delivered too often without resolving.

        ``deliveries`` is the broker's count, this delivery included; the
        deliveries that were not its own failures are discounted: the ones
        bounced here and, when the producer counts the earlier deliveries of
        ``key`` it took itself (``taken``), every one of those that did not
        end in a counted failure (its lease lapsed, its settlement did not
        take, it was bounced). A delivery this consumer never saw (another
        process's, one before a restart) is never discounted.
        """
        discount = max(self.bounced.get(key), taken - self.failures.get(key))
        return self.policy.poisoned_on_arrival(deliveries - discount)

    def forget(self, lane: Hashable, key: K) -> None:
        """``key`` of ``lane`` is resolved for good (settled, dead-lettered): drop its tallies.

        A floor ``key`` holds on ``lane`` is lifted too: a message
        dead-lettered when it arrived (poison by the store's count) never
        comes back to be placed, and its lane's later messages would
        otherwise bounce behind it for good.
        """
        if self._floors.get(lane) == key:
            del self._floors[lane]
        self._forget_tallies(key)

    def _forget_tallies(self, key: K) -> None:
        self.failures.forget(key)
        self.bounced.forget(key)
