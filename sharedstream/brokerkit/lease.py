"""Lease renewal: keep outstanding messages invisible to other consumers until settled.

Brokers that lend a message for a while - SQS (visibility timeout), Google
Pub/Sub (ack deadline), Azure Service Bus (message lock) - give it to
another consumer once the lease expires. A message can stay outstanding
for up to the engine's ack timeout, so the producer renews the lease of
every message it holds until it is settled (advanced).

:class:`LeaseKeeper` does that for any broker, given one function that
renews a batch of leases (``ChangeMessageVisibilityBatch``,
``ModifyAckDeadline``, ``RenewMessageLock``) and returns which it renewed.

Terms: a *lease* is an id (receipt handle, ack id, lock token) with the
time it expires, on the keeper's clock. It is *due* once it expires within
``renew_within`` seconds; *lost* once it expired unrenewed.

Invariants:

* A lease is renewed only while held: :meth:`LeaseKeeper.settle` stops its
  renewal at once (synchronously), and a renewal in flight for a settled id
  does not bring it back.
* A renewed lease expires ``lease`` seconds after its renewal round
  *started* (conservative: never later than the broker thinks).
* A renewal the broker refused, or a call that raised, leaves the lease held
  and due: it is tried again next round until it expires; then it is
  reported once to ``on_lost`` and forgotten (the broker redelivers it).
* At most ``batch_size`` ids per renew call and ``concurrency`` calls in
  flight; one round at a time, under ``guard`` when one is given (a lock
  the owner also holds while it changes leases itself - a nack, a
  re-show - so a renewal never undoes it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from typing import Generic, TypeVar

from sharedstream.brokerkit.batches import in_batches
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["LeaseKeeper", "Renew"]

log = key_value_logger(__name__)

K = TypeVar("K", bound=Hashable)

Renew = Callable[[Sequence[K]], Awaitable[Collection[K]]]
"""Extend the leases of a batch of ids by the lease length; return the ids renewed.

Raising counts as renewing none of them (logged); it never stops the keeper.
"""


class LeaseKeeper(Generic[K]):
    """Renews held leases before they expire, in batches, until they are settled.

    The owner calls :meth:`hold` for each message it receives and
    :meth:`settle` when it advances (or releases) it, and runs :meth:`run`
    in a task it owns (cancel it to stop). ``clock`` and ``sleep`` are
    injected for tests; by default the running loop's clock and
    ``asyncio.sleep``. All calls from the owner's event loop.
    """

    def __init__(
        self,
        renew: Renew[K],
        *,
        lease: float,
        batch_size: int,
        concurrency: int = 1,
        renew_within: float | None = None,
        tick: float | None = None,
        on_lost: Callable[[list[K]], None] | None = None,
        guard: asyncio.Lock | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._renew = renew
        self.lease = lease
        self.batch_size, self.concurrency = batch_size, concurrency
        self.renew_within = lease / 2 if renew_within is None else renew_within
        """Renew a lease once it expires within this many seconds."""
        self.tick = max(0.2, lease / 4) if tick is None else tick
        """Seconds between two rounds."""
        self._on_lost = on_lost
        self._guard = guard
        self._clock = clock
        self._sleep = sleep
        self._expiry: dict[K, float] = {}

    def now(self) -> float:
        """The keeper's clock (the running loop's, unless one was injected)."""
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def hold(self, key: K, expires_at: float) -> None:
        """Start renewing ``key``, whose lease expires at ``expires_at`` (keeper's clock)."""
        self._expiry[key] = expires_at

    def shorten(self, lease: float) -> bool:
        """Plan on a shorter ``lease`` from now on (the broker showed one); whether it was shorter.

        ``renew_within`` and ``tick`` keep their proportions to it (half and
        a quarter, the tick at least 0.2 s and never longer than before).
        A longer ``lease`` changes nothing.
        """
        if lease >= self.lease:
            return False
        self.lease = lease
        self.renew_within = lease / 2
        self.tick = min(self.tick, max(0.2, lease / 4))
        return True

    def settle(self, key: K) -> None:
        """Stop renewing ``key`` (advanced or released). Idempotent; never waits."""
        self._expiry.pop(key, None)

    def held(self) -> dict[K, float]:
        """The held ids and when each lease expires (a copy)."""
        return dict(self._expiry)

    async def renew_due(self) -> list[K]:
        """One round: report lost leases, renew the due ones; return the ids renewed."""
        started = self.now()
        lost = [key for key, expires in self._expiry.items() if expires <= started]
        for key in lost:
            del self._expiry[key]
        if lost:
            log.info("leases expired before they could be renewed; the broker redelivers "
                     "them", count=len(lost))
            if self._on_lost is not None:
                self._on_lost(lost)
        threshold = started + self.renew_within
        due = [key for key, expires in self._expiry.items() if expires < threshold]
        if not due:
            return []
        async with self._guard or contextlib.nullcontext():
            rounds = await in_batches(due, self._renew_batch, size=self.batch_size,
                                      concurrency=self.concurrency)
        renewed = [key for done in rounds for key in done]
        for key in renewed:
            if key in self._expiry:  # not settled meanwhile
                self._expiry[key] = started + self.lease
        log.debug("renewed due leases", count=len(renewed), due=len(due))
        return renewed

    async def _renew_batch(self, batch: Sequence[K]) -> Collection[K]:
        try:
            return await self._renew(batch)
        except Exception as exc:  # noqa: BLE001 - a failed renewal is retried next round;
            # a lease that expires meanwhile is redelivered by the broker (at-least-once).
            log.warning("renewing leases failed; trying again next round",
                        count=len(batch), error=exc)
            return ()

    async def run(self) -> None:
        """Renew due leases every ``tick`` seconds, forever (until cancelled)."""
        while True:
            await self._sleep(self.tick)
            await self.renew_due()
