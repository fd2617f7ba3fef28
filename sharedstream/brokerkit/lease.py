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
the *renewal margin*; *lost* once it expired unrenewed. The margin is
``renew_within`` (half the lease unless given), or, when the owner asks
for it (``margin_round_trips``), that many observed *round trips* if
longer: a round trip is how long one renew call took, the slowest of the
last :data:`ROUND_TRIPS_KEPT`; a slow network (or a broker slow to answer)
makes renewals start earlier, never later, and never more than a lease
ahead (then every lease is due every round).

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
* A round renews its due leases soonest-expiring first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from typing import Generic, TypeVar

from sharedstream.brokerkit.batches import in_batches
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["LeaseKeeper", "Renew"]

log = key_value_logger(__name__)

K = TypeVar("K", bound=Hashable)

ROUND_TRIPS_KEPT = 8
"""Renew calls whose durations make the observed round trip (the slowest of them)."""

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

    ``margin_round_trips`` (0: off) plans renewals against the observed
    round trip too (see the module docstring): a lease is due once it
    expires within ``max(renew_within, margin_round_trips * round_trip)``.
    """

    def __init__(
        self,
        renew: Renew[K],
        *,
        lease: float,
        batch_size: int,
        concurrency: int = 1,
        renew_within: float | None = None,
        margin_round_trips: float = 0.0,
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
        """Renew a lease once it expires within this many seconds (at least; see margin)."""
        self.margin_round_trips = margin_round_trips
        self._round_trips: deque[float] = deque(maxlen=ROUND_TRIPS_KEPT)
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

    @property
    def round_trip(self) -> float:
        """The observed round trip: the slowest of the last renew calls (0 before any)."""
        return max(self._round_trips, default=0.0)

    @property
    def margin(self) -> float:
        """Seconds before its expiry at which a lease is due (see the module docstring)."""
        return min(self.lease, max(self.renew_within,
                                   self.margin_round_trips * self.round_trip))

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
        threshold = started + self.margin
        due = sorted((key for key, expires in self._expiry.items() if expires < threshold),
                     key=self._expiry.__getitem__)
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
        started = self.now()
        try:
            return await self._renew(batch)
        except Exception as exc:  # noqa: BLE001 - a failed renewal is retried next round;
            # a lease that expires meanwhile is redelivered by the broker (at-least-once).
            log.warning("renewing leases failed; trying again next round",
                        count=len(batch), error=exc)
            return ()
        finally:  # a call that failed slowly says as much about the network as one that did not
            self._round_trips.append(self.now() - started)

    async def run(self) -> None:
        """Renew due leases every ``tick`` seconds, forever (until cancelled)."""
        while True:
            await self._sleep(self.tick)
            await self.renew_due()
