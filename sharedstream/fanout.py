"""Fan-out: bounded per-subscriber inboxes fed by one broadcast loop.

Invariants:

* Every item broadcast while a subscriber is *live* lands in its inbox in
  broadcast order, or - if the inbox already holds ``capacity`` items - the
  subscriber is reported as overflowed and receives nothing more.
* A terminal error is held in its own slot, never in the inbox, so it
  reaches the subscriber even when the inbox is full; the inbox is emptied
  when the error is set, so nothing stale is delivered after it.
* A subscriber that is parked (waiting on an empty inbox) is woken exactly
  when an item or an error arrives.
* A subscriber with an ``accept`` test (its trigger's
  ``shared_stream_prefilter``) receives only the items whose raw event the
  test accepts; an item it declines is counted in ``FanOut.skipped`` and
  never reaches its inbox. A test that raises is switched off for that
  subscriber: its filter sees that raw event and every later one.

This module holds no resolution bookkeeping and never awaits; the async
iterators in :mod:`sharedstream.stream` read from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Accept", "FanOut", "Subscriber"]

log = logging.getLogger("sharedstream.fanout")

Accept = Callable[[Any], bool]
"""A subscriber's prefilter: ``accept(raw_event)`` is false for raw events it would ignore."""


class Subscriber:
    """One trigger's inbox in a group, plus the fields the async iterator parks on.

    ``waiter`` is the future the iterator awaits while the inbox is empty;
    ``error`` is the terminal exception the iterator raises once set;
    ``accept`` is the optional prefilter of the raw events it receives.
    """

    __slots__ = ("accept", "error", "inbox", "trigger_id", "waiter")

    def __init__(self, trigger_id: Hashable, accept: Accept | None = None) -> None:
        self.trigger_id = trigger_id
        self.accept = accept
        self.inbox: deque[Any] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None

    def wake(self) -> None:
        """Release the parked iterator, if any. Safe to call at any time."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def set_error(self, error: BaseException) -> None:
        """Make ``error`` the next thing the iterator raises; drop undelivered items.

        The first error wins: a subscriber fails for one reason.
        """
        if self.error is None:
            self.error = error
        self.inbox.clear()
        self.wake()


class FanOut:
    """The live subscribers of one group and the broadcast loop over them.

    ``capacity`` bounds every inbox. ``crowded`` is set by :meth:`broadcast`
    when some inbox is at least half full: the poll then yields to the event
    loop so subscribers can drain before anyone overflows. Subscribers that
    wait on an empty inbox register in ``parked`` and are woken once per
    broadcast, so the per-subscriber loop only touches inboxes. While some
    live subscriber has an ``accept`` test, broadcasts take a second loop
    that asks it and wakes only the subscribers that received the item;
    ``skipped`` then says how many declined the last one.
    """

    __slots__ = (
        "_filtered", "_high_water", "_inboxes", "capacity", "crowded", "live", "parked", "skipped",
    )

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"subscriber queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._high_water = max(1, capacity // 2)
        self.live: list[Subscriber] = []
        self._inboxes: list[deque[Any]] = []
        self.parked: list[Subscriber] = []
        self.crowded = False
        self.skipped = 0
        self._filtered = 0  # live subscribers with an accept test

    def broadcast(self, item: Any, raw: Any) -> list[Subscriber] | None:
        """Append ``item`` (carrying ``raw``) to every live inbox that accepts ``raw``.

        Returns the subscribers that overflowed: they did not receive
        ``item`` and are no longer live; the caller decides how they fail.
        Returns ``None`` (not an empty list) in the common case, to keep this
        loop allocation-free. Afterwards ``skipped`` counts the live
        subscribers whose ``accept`` declined ``raw``.
        """
        if self._filtered:
            return self._broadcast_filtered(item, raw)
        high_water = self._high_water
        crowded = False
        full: list[deque[Any]] | None = None
        for inbox in self._inboxes:
            if len(inbox) >= high_water:
                if len(inbox) >= self.capacity:
                    if full is None:
                        full = []
                    full.append(inbox)
                    continue
                crowded = True
            inbox.append(item)
        self.crowded = crowded
        self.skipped = 0
        if self.parked:
            parked, self.parked = self.parked, []
            for sub in parked:
                sub.wake()
        if full is None:
            return None
        overflowed = [sub for sub in self.live if any(sub.inbox is inbox for inbox in full)]
        for sub in overflowed:
            self.drop(sub)
        return overflowed

    def _broadcast_filtered(self, item: Any, raw: Any) -> list[Subscriber] | None:
        """:meth:`broadcast` when some subscriber has an ``accept`` test."""
        high_water = self._high_water
        capacity = self.capacity
        crowded = False
        skipped = 0
        overflowed: list[Subscriber] | None = None
        for sub in self.live:
            accept = sub.accept
            if accept is not None:
                try:
                    wanted = accept(raw)
                except Exception:
                    # Switched off for good (one warning, not one per raw event): its
                    # filter sees every raw event from now on, this one included.
                    log.warning(
                        "the shared-stream prefilter of trigger %r raised; it is switched "
                        "off and the filter gets every raw event",
                        sub.trigger_id,
                        exc_info=True,
                    )
                    sub.accept = None
                    self._filtered -= 1
                    wanted = True
                if not wanted:
                    skipped += 1
                    continue
            inbox = sub.inbox
            if len(inbox) >= high_water:
                if len(inbox) >= capacity:
                    if overflowed is None:
                        overflowed = []
                    overflowed.append(sub)
                    continue
                crowded = True
            inbox.append(item)
            if sub.waiter is not None:
                sub.wake()
        self.crowded = crowded
        self.skipped = skipped
        if self.parked:  # those woken above (or failed) need no wake-up any more
            self.parked = [sub for sub in self.parked if sub.waiter is not None]
        if overflowed is not None:
            for sub in overflowed:
                self.drop(sub)
        return overflowed

    def add(self, sub: Subscriber) -> None:
        """Make ``sub`` live: it is in the snapshot of every later broadcast."""
        self.live.append(sub)
        self._inboxes.append(sub.inbox)
        if sub.accept is not None:
            self._filtered += 1

    def drop(self, sub: Subscriber) -> None:
        """Stop broadcasting to ``sub``. Idempotent."""
        # By identity: two inboxes holding equal items compare equal.
        for index, candidate in enumerate(self.live):
            if candidate is sub:
                del self.live[index]
                del self._inboxes[index]
                if sub.accept is not None:
                    self._filtered -= 1
                return

    def fail_all(self, error: BaseException) -> None:
        """Deliver ``error`` to every live subscriber and stop broadcasting to them."""
        subs, self.live, self._inboxes = self.live, [], []
        self._filtered = 0
        for sub in subs:
            sub.set_error(error)
