"""Service Bus: the locks of the messages a producer holds, renewed until they are settled.

Private to :mod:`sharedstream.producers.servicebus`. Nothing here imports
azure-servicebus: the renewal requests are
:class:`~sharedstream.producers._servicebus_locks.BatchedLockRenewal`'s,
made by the producer once it has the SDK (:meth:`MessageLocks.connect`).

Terms: a message is *held* from :meth:`MessageLocks.hold` (it arrived)
until :meth:`MessageLocks.settled` (it is being settled) or until its lock
is lost; its lock token names it.

Invariants:

1. A held message's lock is renewed (the kit's lease keeper plans the
   rounds, :attr:`MessageLocks.keeper`) until it is settled, its lock is
   lost, or ``max_lock_renewal`` seconds have passed since it arrived;
   never after: a lock no longer held is dropped from a renewal, never
   sent.
2. Renewals are planned on the lock the messages came with when it is
   shorter than ``lock_duration`` (the entity's lock is shorter than
   configured): one WARNING says so, once per producer.
3. Nothing here raises for a lock that could not be renewed: a lost one
   is no longer renewed (its message comes again, and its events are
   skipped as duplicates), an unanswered one is tried next round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from sharedstream.brokerkit.lease import LeaseKeeper
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._servicebus_locks import RENEW_BATCH, BatchedLockRenewal
from sharedstream.producers._servicebus_settle import report_failures
from sharedstream.producers._servicebus_types import ServiceBusPayload, ServiceBusSettings

__all__ = ["MessageLocks"]

_RENEW_CONCURRENCY = 4
"""Renew-lock requests in flight at once (each up to ``RENEW_BATCH`` locks of one receiver)."""
_MARGIN_ROUND_TRIPS = 4
"""A lock is renewed once no more than this many observed renewal round trips are left of it
(or half of it, whichever is sooner): a request that takes long is started early enough."""


class MessageLocks:
    """The locks one producer holds, and their renewal (see the module docstring).

    ``logger`` is the producer's, ``entity`` names the entity in its lines.
    Called from the producer's event loop; :attr:`keeper`'s ``run`` is one
    worker of the poll.
    """

    def __init__(self, settings: ServiceBusSettings, *, entity: str,
                 logger: KeyValueLogger) -> None:
        self.settings, self.entity, self._log = settings, entity, logger
        # A round every second at most: a shorter lock seen on messages (see _shorter_lock)
        # takes effect within a second, not after a quarter of the configured one.
        self.keeper: LeaseKeeper[str] = LeaseKeeper(
            self._renew, lease=settings.lock_duration, batch_size=RENEW_BATCH,
            concurrency=_RENEW_CONCURRENCY, margin_round_trips=_MARGIN_ROUND_TRIPS,
            tick=min(1.0, settings.lock_duration / 4), on_lost=self.forget)
        """Plans the renewal rounds (``run``), and knows the lock planned on (``lease``)."""
        self.held: dict[str, ServiceBusPayload] = {}
        """Lock token -> payload, while its lock is renewed."""
        self._arrived: dict[str, float] = {}  # lock token -> when it arrived (max renewal)
        self._renewal: BatchedLockRenewal | None = None  # made with the client (needs the SDK)
        self._warned = False

    def connect(self, renewal: BatchedLockRenewal) -> None:
        """Renew with ``renewal`` from now on (made with the producer's client)."""
        self._renewal = renewal

    def hold(self, payload: ServiceBusPayload, now: float) -> None:
        """Renew ``payload``'s lock from now on, planned on the lock it came with."""
        token, until = payload.key, payload.received.locked_until_utc
        left = self.settings.lock_duration
        if until is not None:
            seen = (until - datetime.now(UTC)).total_seconds()
            if seen < self.keeper.lease - 1:  # the entity's lock is shorter than configured
                self._shorter_lock(seen)
            left = min(left, max(seen, 0.0))
        self.keeper.hold(token, now + left)
        self.held[token] = payload
        self._arrived[token] = now

    def settled(self, payload: ServiceBusPayload) -> None:
        """Stop renewing ``payload`` (it is being settled). Idempotent."""
        token = payload.key
        self.keeper.settle(token)
        self.forget([token])

    def forget(self, tokens: list[str]) -> None:
        """Drop ``tokens`` (the keeper no longer renews them: lost, or settled)."""
        for token in tokens:
            self.held.pop(token, None)
            self._arrived.pop(token, None)

    def _shorter_lock(self, seen: float) -> None:
        """Plan renewals on a lock shorter than ``lock_duration``: the one the messages show."""
        lease = max(1.0, seen)
        if self.keeper.shorten(lease) and not self._warned:
            self._warned = True
            self._log.warning("message locks are shorter than lock_duration; renewing on theirs",
                              entity=self.entity, lock_s=round(lease),
                              lock_duration_s=self.settings.lock_duration)

    async def _renew(self, tokens: Sequence[str]) -> list[str]:
        """The lease keeper's renewal: each lock up to ``max_lock_renewal`` after arrival.

        Batched (:class:`BatchedLockRenewal`), outside the link's turns: a
        renewal never waits for a receive or a run of completions. A lock
        Service Bus says is lost is no longer renewed (its message comes
        again); one whose request was not answered is tried next round.
        """
        now, limit = self.keeper.now(), self.settings.max_lock_renewal
        due = [t for t in tokens if t in self.held and now - self._arrived.get(t, now) < limit]
        if len(due) < len(tokens):
            self._log.warning("locks reached max_lock_renewal or were settled; Service Bus "
                              "delivers them again", entity=self.entity,
                              count=len(tokens) - len(due), limit_s=limit)
        if not due or self._renewal is None:
            return []
        renewal = await self._renewal.renew([self.held[t] for t in due],
                                            wanted=lambda p: p.key in self.held)
        for payload, _ in renewal.lost:
            self.keeper.settle(payload.key)
            self.forget([payload.key])
        report_failures(self._log, logging.WARNING, "message locks were lost before they were "
                        "renewed; Service Bus delivers those messages again", self.entity,
                        renewal.lost)
        report_failures(self._log, logging.INFO, "renewing message locks did not take; tried "
                        "again next round until the lock expires", self.entity, renewal.failed)
        return [p.key for p in renewal.renewed]
