"""Redelivery accounting: which failures count toward ``max_redeliveries``.

A message that keeps failing (a *poison* message) is dead-lettered once it
failed more than ``max_redeliveries`` times, so it cannot hold its lane
forever. Only a failure that is the message's own doing counts: when every
failed subscriber failed while the message was still queued for it
(``outcome.unseen == outcome.failed``: it died on an *earlier* message),
the message is redelivered but the delivery is not held against it;
otherwise one message that keeps killing a trigger would drag every message
queued behind it to the dead letters.

A broker's own delivery count (Pub/Sub's ``delivery_attempt``, Service
Bus's delivery count, SQS's receive count) also counts the deliveries that
ended because the process holding the message died, and those leave no
trace in a new process's memory. So a message the broker says came too
often is only a *suspect*: :class:`PoisonCheck` asks the runtime's failure
ledger (``SharedStreamProducer.failure_ledger``: the store counts each raw
event's own failures, durably) whether it failed more than
``max_redeliveries`` times itself. A crash loop therefore never
dead-letters a healthy message: it is fanned out again, and a message
whose events were all stored is settled as a duplicate. A message
delivered more than :attr:`RedeliveryPolicy.ceiling` times is poison
whatever the ledger says: one that kills the process itself never gets to
record a failure.

:class:`RedeliveryPolicy` is the rule, :class:`DeliveryTally` a bounded
per-message count a producer keeps (failures, or deliveries to discount
from a broker's receive count). Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.engine.producer import AdvanceOutcome, SharedStreamProducer

__all__ = ["CEILING_FACTOR", "DeliveryTally", "PoisonCheck", "RedeliveryPolicy"]

CEILING_FACTOR = 10
"""A message delivered more than this many times ``max_redeliveries + 1`` is poison, whatever
the failure ledger says (:attr:`RedeliveryPolicy.ceiling`)."""

K = TypeVar("K", bound=Hashable)
P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class RedeliveryPolicy:
    """The poison-message rule for one producer."""

    max_redeliveries: int
    """Failed deliveries a message may have before it is dead-lettered (>= 0)."""

    @staticmethod
    def counts(outcome: AdvanceOutcome) -> bool:
        """Whether this outcome's failure counts against the message (``failed > unseen``)."""
        return outcome.failed_itself

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

    @property
    def ceiling(self) -> int:
        """Broker deliveries past which a message is poison even with no failure counted.

        ``CEILING_FACTOR * (max_redeliveries + 1)``: a message that kills
        the process (or hangs it until it is killed) never records a
        failure, and must not come back forever. Generous, because a healthy
        message also gathers deliveries without a failure: every kill of a
        crash loop while it waits, received, behind others (4 was too few:
        a storm of 10 kills with 50 messages in flight and
        ``max_redeliveries`` 1 dead-lettered one healthy message).
        """
        return CEILING_FACTOR * (self.max_redeliveries + 1)


class PoisonCheck:
    """Whether the messages a broker delivered too often are poison: the failure ledger decides.

    Owned by one producer (``owner``), whose ``failure_ledger`` it reads at
    each call (the engine sets it before ``open_stream``), and whose
    ``stream_name`` names the stream in log lines. Called from the owner's
    event loop.
    """

    def __init__(self, policy: RedeliveryPolicy, owner: SharedStreamProducer, *,
                 logger: KeyValueLogger) -> None:
        self.policy, self.owner, self.log = policy, owner, logger
        self.cleared = 0
        """Suspects found not poison so far (their deliveries were not their own failures)."""

    async def confirmed(self, suspects: Mapping[int, tuple[str | None, int]]) -> set[int]:
        """Which of ``suspects`` are poison, as a set of their keys.

        ``suspects`` maps a caller's key (a position in what it received) to
        the message's raw event name and the broker's delivery count, this
        delivery included, for messages the broker's count already makes
        poison (:meth:`RedeliveryPolicy.poisoned_on_arrival`). One is
        poison when it failed more than ``max_redeliveries`` times itself
        by the ledger's count, or when its delivery count is past the
        :attr:`~RedeliveryPolicy.ceiling`. With no ledger (an engine run
        without a store) or no name, the broker's count decides, as it
        always did. A ledger that cannot answer is logged and only the
        ceiling decides: fanning a message out again is safe (its stored
        events are not stored twice), dead-lettering a healthy one is not.
        """
        if not suspects:
            return set()
        policy = self.policy
        ledger = self.owner.failure_ledger
        poison = {key for key, (name, deliveries) in suspects.items()
                  if ledger is None or name is None or deliveries > policy.ceiling}
        asked = {key: name for key, (name, _) in suspects.items()
                 if key not in poison and name is not None}
        if not asked or ledger is None:
            return poison
        try:
            counted = await ledger.counts(sorted(set(asked.values())))
        except Exception as exc:  # noqa: BLE001 - any store failure: fan them out again
            self.log.warning("cannot read raw events' failures from the store; fanning out "
                             "again the messages the broker delivered too often",
                             stream=self.owner.stream_name, messages=len(asked),
                             error=f"{type(exc).__name__}: {exc}")
            return poison
        poison.update(key for key, name in asked.items()
                      if policy.exhausted(counted.get(name, 0)))
        cleared = len(asked) - len(poison & asked.keys())
        if cleared:
            self.cleared += cleared
            self.log.info("fanning out again messages delivered more than max_redeliveries + 1 "
                          "times: the store counts too few failures of their own (crashes "
                          "redelivered them)", stream=self.owner.stream_name, messages=cleared,
                          max_redeliveries=policy.max_redeliveries)
        return poison

    async def split(self, arrived: Sequence[P], suspects: Mapping[int, tuple[str | None, int]],
                    ) -> tuple[list[P], list[P]]:
        """Split what one receive brought into ``(fan_out, poison)``, both in arrival order.

        Called by a producer as messages arrive, before any is handed to
        the poll. ``arrived`` is everything received; ``suspects`` maps a
        position in ``arrived`` to that message's raw event name and
        delivery count, as :meth:`confirmed` takes them. Every item of
        ``arrived`` lands in exactly one list: ``poison`` holds those
        :meth:`confirmed` finds poison (never to be fanned out again),
        ``fan_out`` the rest. A key that is no position of ``arrived`` is
        ignored. Nothing else is done to the items: holding leases, counting
        them in flight and dead-lettering the poison stay the caller's. Like
        :meth:`confirmed`, it raises nothing but a cancellation.
        """
        confirmed = await self.confirmed(suspects)
        fan_out: list[P] = []
        poison: list[P] = []
        for index, item in enumerate(arrived):
            (poison if index in confirmed else fan_out).append(item)
        return fan_out, poison


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
