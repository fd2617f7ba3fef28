"""Coalesced offset commits: every lane's latest target in one broker call, one call at a time.

Broker-neutral: any broker whose acknowledgement is a cumulative offset per lane
(Kafka partitions, Kinesis shards, Event Hubs partitions) can use it.

:class:`CoalescedCommitter` separates *deciding* what may be committed from
*telling the broker*. The producer's ``advance`` records a lane's new target
with :meth:`CoalescedCommitter.want` (synchronous: it never waits for the
broker) and returns; one task owned by the committer sends the latest target
of every lane that moved in a single ``commit`` call, and loops while new
targets arrive. The engine's one-``advance``-at-a-time pump therefore no
longer waits a broker round trip per partition batch.

Why this is safe: a target is recorded only for records that are fully
resolved and whose events are durably stored (that is when the engine calls
``advance``). A crash before the commit reaches the broker only causes
redelivery, and the runtime stores each event once per raw event name.

Invariants:

* At most one ``commit`` call is in flight at any moment: the loop, a
  revocation and the final flush all commit under one lock.
* A lane's committed offset only moves forward; a target at or below the
  lane's current target is ignored.
* Every lane belongs to one assignment (its *epoch*). :meth:`revoke` forgets
  the revoked lanes first, synchronously, then waits out a commit in flight
  and commits what the revoked lanes still owe. After it returns, no commit
  carrying a target of the revoked epochs is in flight or can start.
* ``commit`` retries transient errors itself (bounded) and returns ``False``
  when a rebalance refused the commit: the targets stay pending (the
  revocation that follows commits them, or the next commit carries them).
  Anything it raises is *fatal*: the loop stops, :attr:`error` holds the
  exception and ``on_fatal`` is called; the owner must then end its poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["CoalescedCommitter", "Commit"]

log = key_value_logger(__name__)

K = TypeVar("K", bound=Hashable)

Commit = Callable[[dict[K, int]], Awaitable[bool]]
"""Commit ``{lane: offset}`` in one broker call; ``False`` if a rebalance refused it.

Retries transient errors itself (bounded) and raises a
:class:`~sharedstream.engine.errors.SharedStreamError` when it gives up.
"""


@dataclass(slots=True)
class _Slot:
    """One lane's commit state for one assignment."""

    epoch: int
    target: int = 0  # the offset to commit next (0: nothing resolved yet)
    committed: int = 0  # the highest offset the broker acknowledged


class CoalescedCommitter(Generic[K]):
    """Commits the latest target of every lane, coalesced, with one commit in flight.

    Owned by one producer: :meth:`start` (once, inside the event loop) starts
    the commit task, :meth:`close` (once) stops it after a final flush. All
    methods are called from the owner's event loop.
    """

    def __init__(
        self,
        commit: Commit[K],
        *,
        name: str,
        on_fatal: Callable[[BaseException], None],
        close_timeout: float,
    ) -> None:
        self._commit = commit
        self._name = name
        self._on_fatal = on_fatal
        self._close_timeout = close_timeout
        self._slots: dict[K, _Slot] = {}
        self._wanted = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        """The fatal commit error, once one happened; nothing is committed after it."""
        self.commits = 0
        """Commit calls made so far (each carrying one or more lanes)."""

    # -- the owner's synchronous calls -------------------------------------------------

    def open(self, key: K, epoch: int) -> None:
        """Start tracking ``key`` for assignment ``epoch`` (replacing an earlier epoch's lane)."""
        self._slots[key] = _Slot(epoch)

    def want(self, key: K, epoch: int, offset: int) -> None:
        """Record that ``key`` may be committed up to ``offset``; wakes the commit task.

        Never waits. Ignored when ``key`` is not tracked under ``epoch`` (revoked,
        or reassigned since) or when ``offset`` is not beyond the current target.
        """
        slot = self._slots.get(key)
        if slot is None or slot.epoch != epoch or offset <= slot.target:
            return
        slot.target = offset
        self._wanted.set()

    def pending(self) -> dict[K, int]:
        """The targets not yet acknowledged by the broker, per lane."""
        return {key: slot.target for key, slot in self._slots.items()
                if slot.target > slot.committed}

    # -- the commit task ---------------------------------------------------------------

    def start(self) -> None:
        """Start the commit task. Called once, from inside the event loop."""
        if self._task is not None:
            raise RuntimeError(f"{self._name} already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                async with self._lock:
                    await self._commit_slots(self._slots)
            except Exception as exc:
                # Committing is broken (retries exhausted, or a bug): stop here and let the
                # owner end the poll. Nothing is committed past what the broker acknowledged,
                # so the next consumer redelivers the rest (at-least-once, never a skip).
                log.exception("committing offsets failed; the poll must end", committer=self._name)
                self.error = exc
                self._on_fatal(exc)
                return

    async def _commit_slots(self, slots: Mapping[K, _Slot]) -> None:
        """Send the pending targets of ``slots`` in one call. The caller holds the lock."""
        batch = [(key, slot, slot.target) for key, slot in slots.items()
                 if slot.target > slot.committed]
        if not batch:
            return
        self.commits += 1
        if await self._commit({key: target for key, _, target in batch}):
            for _, slot, target in batch:
                slot.committed = max(slot.committed, target)

    # -- awaited by the owner ----------------------------------------------------------

    async def flush(self) -> None:
        """Commit every pending target now, after a commit in flight; raise what it raises."""
        async with self._lock:
            await self._commit_slots(self._slots)

    async def revoke(self, keys: Iterable[K]) -> None:
        """Forget ``keys`` and commit what they still owe, before returning.

        Called from the rebalance listener before the partitions go to their
        new owner. Waits out a commit in flight (it may carry these lanes)
        and then commits the revoked lanes' pending targets, bounded by the
        close timeout. A failure is logged, not raised: the new owner
        redelivers from the last commit.
        """
        revoked = {key: slot for key in keys if (slot := self._slots.pop(key, None)) is not None}
        if not revoked:
            return
        try:
            async with asyncio.timeout(self._close_timeout), self._lock:
                await self._commit_slots(revoked)
        except (SharedStreamError, TimeoutError) as exc:
            log.warning("committing revoked lanes failed; the new owner redelivers from the "
                        "last commit", committer=self._name, lanes=sorted(revoked, key=repr),
                        error=exc)

    async def close(self) -> None:
        """Stop the commit task and commit the final targets, best-effort. Idempotent.

        Waits out a commit in flight, bounded by the close timeout; a failure
        is logged, not raised (what was not committed is redelivered).
        """
        task, self._task = self._task, None
        try:
            async with asyncio.timeout(self._close_timeout), self._lock:
                if task is not None:
                    await _cancel_and_wait(task)
                await self._commit_slots(self._slots)
        except (SharedStreamError, TimeoutError) as exc:
            log.warning("final commit failed; uncommitted records are redelivered",
                        committer=self._name, error=exc)
        finally:
            if task is not None and not task.done():
                await _cancel_and_wait(task)


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])
