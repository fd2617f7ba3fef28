"""Which standalone triggers this triggerer runs: exactly those the store assigned it.

Standalone (non-shared-stream) triggers run on exactly one triggerer. The
store assigns them (:meth:`~sharedstream.store.MetadataStore.claim_triggers`:
an owner column, taken over by another triggerer once the owner's heartbeat
is older than ``triggerer_health_check_threshold``). The heartbeat is the
lease: a claim round is a heartbeat followed by a claim, and
:class:`Assignment` turns each round's answer into running supervisors.

Invariants:

1. A supervisor runs for trigger ``X`` only while the newest claim round
   said this triggerer owns ``X``: :meth:`Assignment.apply` starts the newly
   owned and cancels the no longer owned.
2. Self-fencing: the lease of a round that *began* at ``t`` (local
   monotonic clock) ends at ``t + lease``. Once the newest successful round's
   lease ended (the database did not answer, or answered too late),
   :meth:`Assignment.expire` cancels every supervisor. A heartbeat is
   stamped no earlier than its round began, and another triggerer takes over
   only once that stamp is ``threshold`` old, so with ``lease <= threshold``
   the old owner has stopped before the new one starts (clocks drifting
   apart by less than the heartbeat interval in ``threshold`` seconds).
3. After :meth:`Assignment.close` nothing is started again.

A pure bookkeeping object on the event loop: no I/O, no sleeping; the
triggerer's heartbeat loop calls it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.store import Claim

__all__ = ["Assignment"]

log = key_value_logger("sharedstream.runtime")


class Assignment:
    """The supervisors of the standalone triggers this triggerer owns.

    ``start(trigger_id)`` creates the supervisor task of a trigger (the
    triggerer's task group owns it); ``lease`` is how long a claim round
    stays valid from when it began, or ``None`` for a store that serves one
    triggerer (nobody else could take over, so nothing is ever fenced).
    """

    def __init__(self, start: Callable[[int], asyncio.Task[None]], lease: float | None) -> None:
        self._start = start
        self._lease = lease
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._valid_until: float | None = None
        self._last: Claim | None = None
        self._closed = False

    @property
    def running(self) -> list[int]:
        """Ids of the standalone triggers whose supervisors are running, sorted."""
        return sorted(tid for tid, task in self._tasks.items() if not task.done())

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The supervisor tasks started and not yet forgotten (for shutdown)."""
        return list(self._tasks.values())

    @property
    def idle(self) -> bool:
        """Whether there is nothing to run, here or elsewhere, as of the newest round.

        True once a round found no active standalone trigger at all (all
        finished or failed) and no supervisor is running.
        """
        last = self._last
        return (last is not None and not last.owned and not last.elsewhere
                and not self.running)

    def apply(self, claim: Claim, began: float) -> None:
        """A claim round that began at ``began`` (loop time) answered ``claim``.

        Starts a supervisor for every owned trigger without a running one
        (one that finished is not restarted while it stays owned: the store
        no longer lists it once its state is recorded), cancels those of
        triggers no longer owned. Never raises.
        """
        self._last = claim
        if self._lease is not None:
            self._valid_until = began + self._lease
        owned = set(claim.owned)
        for trigger_id in sorted(set(self._tasks) - owned):
            task = self._tasks.pop(trigger_id)
            if not task.done():
                log.warning("trigger now run by another triggerer; stopping it here",
                            trigger=trigger_id)
                task.cancel()
        if self._closed:
            return
        for trigger_id in sorted(owned - set(self._tasks)):
            log.info("running a standalone trigger assigned to this triggerer",
                     trigger=trigger_id)
            self._tasks[trigger_id] = self._start(trigger_id)

    def expire(self, now: float) -> float | None:
        """Fence: cancel every supervisor if the lease ended by ``now`` (loop time).

        Returns the seconds left on the lease (``None``: no lease, or nothing
        held). Called whenever a claim round fails or is late.
        """
        if self._valid_until is None or not self._tasks:
            return None
        left = self._valid_until - now
        if left <= 0:
            log.error("no heartbeat reached the store within the lease; stopping the "
                      "standalone triggers here (another triggerer takes them over)",
                      count=len(self._tasks))
            self.cancel_all()
            self._valid_until = None
            return None
        return left

    def cancel_all(self) -> None:
        """Cancel every supervisor and forget them (the next round may start them again)."""
        tasks, self._tasks = self._tasks, {}
        for task in tasks.values():
            task.cancel()

    def close(self) -> None:
        """Stop starting supervisors (shutdown); running ones are left to the caller."""
        self._closed = True
