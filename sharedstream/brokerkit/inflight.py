"""The in-flight limit: bounded prefetch between a broker and the engine.

A message is *in flight* from the moment the producer takes it from the
broker (or reserves room for it) until the engine advances it. The engine
does not wait for subscribers before pulling the next message, so this
count is what keeps a producer's prefetch bounded: the poll waits for
:meth:`InFlightLimit.room` before asking the broker for more.

Invariants:

* ``count`` never goes below zero (releasing more than was taken clamps).
* :meth:`room` returns only when ``count + n <= limit``, or after
  :meth:`interrupt`, which wakes every waiter for good so a poll blocked
  on capacity can notice a fatal error and raise it.

Synchronous bookkeeping plus one ``asyncio.Event``; all calls from the
owner's event loop.
"""

from __future__ import annotations

import asyncio

__all__ = ["InFlightLimit"]


class InFlightLimit:
    """Counts messages taken and not yet advanced; makes the poll wait when full."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the in-flight limit must be >= 1, got {limit}")
        self.limit = limit
        self.count = 0
        self._room = asyncio.Event()
        self._room.set()
        self._interrupted = False

    def take(self, n: int = 1) -> None:
        """Count ``n`` more messages (or reserved places) in flight. Never waits."""
        self.count += n

    def release(self, n: int = 1) -> None:
        """``n`` messages were advanced (or a reservation was not used); wake a waiter."""
        self.count = max(0, self.count - n)
        self._room.set()

    def has_room(self, n: int = 1) -> bool:
        """Whether ``n`` more fit under the limit."""
        return self.count + n <= self.limit

    async def room(self, n: int = 1) -> None:
        """Wait until ``n`` more fit under the limit, or until :meth:`interrupt`.

        Does not take them: call :meth:`take` after. Cancellation leaves the
        count unchanged.
        """
        while not self._interrupted and not self.has_room(n):
            self._room.clear()
            await self._room.wait()

    def interrupt(self) -> None:
        """Wake every waiter now and from now on (the poll must check why and end)."""
        self._interrupted = True
        self._room.set()
