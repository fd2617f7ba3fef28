"""Durable membership: a watcher that stays in its stream while it is away.

A plain subscription (``SharedStreamManager.subscribe``) follows Airflow:
a subscriber that fails or leaves is out of the snapshot at once, so raw
events fanned out while it restarts are resolved without it. A runtime
that restarts a failed watcher cannot close that gap from outside: between
the old subscription failing and the new one existing, the stream moves on.

A :class:`Membership` closes it inside the engine. Invariants:

1. While the member is on the manager's roster for its key, it is in the
   snapshot of every raw event any group of that key fans out - including
   a group created after the previous one ended: a new group starts with
   every member of the roster already subscribed.
2. A failed attempt (:meth:`Membership.fail`) fails only the raw event its
   filter was on; events it moved past resolve as their derived events are
   confirmed, events queued for it wait for its next attempt
   (:meth:`Membership.stream`). Nothing is resolved as done for it while it
   is away; the ack timeout still bounds every event, and an event that
   times out fails (it is redelivered, and the redelivery reaches it).
3. A member is never overflowed: its full inbox pauses the poll
   (back-pressure; see :mod:`sharedstream.engine.group`).
4. Only :meth:`Membership.leave` takes it off the roster, with the plain
   ``unsubscribe`` semantics (what it had not pulled fails).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable
from typing import TYPE_CHECKING, Any

from sharedstream.engine.errors import StreamStopped
from sharedstream.engine.fanout import Accept, Subscriber
from sharedstream.engine.resolution import AckSubscriber
from sharedstream.engine.trigger import BaseEventTrigger

if TYPE_CHECKING:
    from sharedstream.engine.group import StreamGroup
    from sharedstream.engine.manager import SharedStreamManager

__all__ = ["Membership"]


class Membership:
    """One trigger's durable place in the stream of ``key`` (see the module docstring).

    Made by :meth:`SharedStreamManager.join`; single-event-loop, like the
    manager. ``on_interrupt`` (settable) is called synchronously when the
    ack watchdog gives up on the event the member's filter is on: the
    runtime should cancel that attempt (the error is also raised at the
    attempt's next pull).
    """

    def __init__(
        self,
        manager: SharedStreamManager,
        *,
        trigger_id: Hashable,
        trigger: BaseEventTrigger,
        key: Hashable,
        accept: Accept | None,
    ) -> None:
        self.trigger_id = trigger_id
        self.trigger = trigger
        self.key = key
        self.accept = accept
        self._manager = manager
        self._group: StreamGroup | None = None
        self._sub: Subscriber | None = None
        self._on_interrupt: Callable[[BaseException], None] | None = None
        self.left = False

    # -- attempts -------------------------------------------------------------

    def stream(self) -> AsyncIterator[Any]:
        """The raw-event iterator of a new attempt; feed it to ``filter_shared_stream``.

        Synchronous. Picks up where the previous attempt stopped: events
        queued for the member meanwhile come first. If the key's group ended
        since, a new one is started (with every member of the roster in it).
        Raises :class:`StreamStopped` after :meth:`leave` or the manager's
        ``stop_all``.
        """
        if self.left:
            raise StreamStopped(f"trigger {self.trigger_id!r} left shared stream {self.key!r}")
        group = self._manager.live_group(self.key, self.trigger)
        # Every group of the key attaches the whole roster when it is made (or at join).
        assert self._group is group  # noqa: S101
        assert self._sub is not None  # noqa: S101
        return group.attempt(self._sub)

    def fail(self, error: BaseException) -> None:
        """The current attempt failed with ``error``: fail the event its filter was on.

        Only that event fails (with ``error`` named in its verdict); the
        member stays in the stream. Idempotent; a no-op after the group ended.
        """
        sub = self._sub
        if isinstance(sub, AckSubscriber) and self._group is not None:
            book = self._group.book
            if book is not None:
                book.fail_attempt(sub, error)

    def reject(self, reason: str) -> bool:
        """Reject the event the filter is on (ack mode), with ``reason``; ``False`` if none."""
        sub = self._sub
        if not isinstance(sub, AckSubscriber) or self._group is None:
            return False
        book = self._group.book
        return book is not None and book.reject(sub, reason)

    def bind(self) -> int | None:
        """``bind_pending_event`` for this member's current attempt (see the manager)."""
        sub = self._sub
        if not isinstance(sub, AckSubscriber) or self._group is None or sub.error is not None:
            return None
        book = self._group.book
        return None if book is None else book.bind(sub)

    def raw_event_key(self) -> str | None:
        """``raw_event_key`` for this member's current attempt (see the manager)."""
        if self._group is None or self._sub is None or self._sub.error is not None:
            return None
        return self._group.raw_event_key(self.trigger_id)

    async def leave(self) -> None:
        """Leave the stream for good (plain ``unsubscribe`` semantics). Idempotent."""
        if self.left:
            return
        self.left = True
        await self._manager.release(self)

    # -- state ----------------------------------------------------------------

    @property
    def on_interrupt(self) -> Callable[[BaseException], None] | None:
        """Called when the ack watchdog interrupts the current attempt."""
        return self._on_interrupt

    @on_interrupt.setter
    def on_interrupt(self, callback: Callable[[BaseException], None] | None) -> None:
        self._on_interrupt = callback
        if isinstance(self._sub, AckSubscriber):
            self._sub.on_interrupt = callback

    @property
    def queued(self) -> int:
        """Raw events fanned out to the member and not pulled yet (its lag)."""
        sub = self._sub
        return 0 if sub is None or sub.error is not None else len(sub.inbox)

    def attach(self, group: StreamGroup) -> None:
        """Subscribe to ``group`` (the manager calls this when it creates a group)."""
        self._group = group
        self._sub = sub = group.add_subscriber(self.trigger_id, self.accept, durable=True)
        if isinstance(sub, AckSubscriber):
            sub.on_interrupt = self._on_interrupt

    def __repr__(self) -> str:
        return f"Membership(trigger_id={self.trigger_id!r}, key={self.key!r})"
