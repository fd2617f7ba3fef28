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

A runner restarts a failed member with :meth:`Membership.run_attempt`, one
call per attempt: it holds the restart backoff, hands the filter a stream
that starts where the previous attempt stopped, and fails exactly the raw
event a failed, hung or ended attempt was on. Runners loop on it; they do
not compose the steps themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, Protocol

from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.errors import FilterEnded, StreamStopped
from sharedstream.engine.fanout import Accept, Subscriber
from sharedstream.engine.group import StreamGroup
from sharedstream.engine.names import stream_name
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = ["Membership", "Roster"]


class Roster(Protocol):
    """Who keeps the rosters a :class:`Membership` is on: what a member asks of it.

    :class:`~sharedstream.engine.manager.SharedStreamManager` is the one
    implementation (its methods state the contracts); a member is made by
    it, so this module never imports it. Called on the manager's event loop.
    """

    @property
    def ack_timeout(self) -> float:
        """Seconds every subscriber has to resolve an event (caps a restart's delay)."""

    def live_group(self, key: Hashable, trigger: BaseEventTrigger) -> StreamGroup:
        """The running group of ``key``, started with the whole roster if none runs."""

    async def release(self, member: Membership) -> None:
        """Take ``member`` off its roster and out of its group."""


class Membership:
    """One trigger's durable place in the stream of ``key`` (see the module docstring).

    Made by :meth:`SharedStreamManager.join`; single-event-loop, like the
    manager. Run its filter with :meth:`run_attempt`, once per attempt.
    """

    def __init__(
        self,
        manager: Roster,
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
        self._attempting = False
        self.left = False
        self.failed_on: str | None = None
        """The name (``raw_event_name``) of the raw event the last failed attempt was on;
        ``None`` when it failed on none (or the producer names none). The runner's
        backoff is per raw event: a new one starts from the initial delay."""

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
            raise StreamStopped(
                f"trigger {self.trigger_id!r} left shared stream {stream_name(self.key)}")
        group = self._manager.live_group(self.key, self.trigger)
        # Every group of the key attaches the whole roster when it is made (or at join).
        assert self._group is group  # noqa: S101
        assert self._sub is not None  # noqa: S101
        return group.attempt(self._sub)

    async def run_attempt(
        self,
        consume: Callable[[AsyncIterator[Any]], Awaitable[None]],
        *,
        delay: float = 0.0,
    ) -> None:
        """Run one attempt of the member's filter: its first start, or its gap-free restart.

        The runner calls this once per attempt, in a loop, from one task at a
        time (a second concurrent call raises ``RuntimeError``). In order:

        1. It waits ``delay`` seconds (the runner's restart backoff), capped
           at half the ack timeout. The member stays in the snapshot while
           it waits: raw events fanned out meanwhile queue for it (a full
           queue pauses the poll) and none resolves without it.
        2. It calls ``consume(stream)`` with a new raw-event iterator
           (:meth:`stream`) that starts with the first raw event no earlier
           attempt pulled. ``consume`` runs the filter over it and binds
           every trigger event (:meth:`bind`) before its next ``await``.
        3. ``consume`` raises an exception: only the raw event the filter
           was on fails, with the exception named in its verdict
           (:meth:`fail`); the broker redelivers it and the redelivery
           reaches the member. The exception propagates unchanged.
        4. The ack timeout passes on the raw event the filter is on (it
           hangs): that event fails, ``consume`` is cancelled at once and
           the watchdog's :class:`AckTimeout` is raised.
        5. ``consume`` returns (the filter ended, which a watcher's filter
           must not): the raw event it was on fails and
           :class:`FilterEnded` is raised.

        Events the filter moved past resolve as their trigger events are
        confirmed stored, whatever happens to the attempt. Cancelling the
        call cancels the attempt and fails nothing; the member stays until
        :meth:`leave`. If the key's group ended (its poll failed, say), the
        next attempt starts a new one with the whole roster in it. Raises
        :class:`StreamStopped` without waiting after :meth:`leave` or the
        manager's ``stop_all``.
        """
        if self._attempting:
            raise RuntimeError(f"trigger {self.trigger_id!r} is already running an attempt")
        self._attempting = True
        try:
            if delay > 0:
                await asyncio.sleep(min(delay, self._manager.ack_timeout / 2))
            await self._attempt(consume, self.stream())
        finally:
            self._attempting = False

    async def _attempt(
        self, consume: Callable[[AsyncIterator[Any]], Awaitable[None]], stream: AsyncIterator[Any]
    ) -> None:
        """Steps 2 to 5 of :meth:`run_attempt`."""
        scope = asyncio.timeout(None)
        interrupts: list[BaseException] = []

        def interrupt(error: BaseException) -> None:
            # The filter hangs outside our iterator and would never pull again to
            # see the error: cancel the attempt now (the scope turns it into a
            # TimeoutError below, telling it from a cancellation from outside).
            interrupts.append(error)
            if not scope.expired():
                scope.reschedule(-1)

        try:
            async with scope:
                self._set_interrupt_handler(interrupt)
                try:
                    await consume(stream)
                finally:
                    self._set_interrupt_handler(None)
        except TimeoutError as exc:
            if not (scope.expired() and interrupts):
                self.fail(exc)  # the filter's own timeout: an ordinary failure
                raise
            self.fail(interrupts[-1])  # already failed by the watchdog; clears the interrupt
            raise interrupts[-1] from exc
        except Exception as exc:
            # Any failure of the filter's code or of the stream: the raw event the
            # filter was on is redelivered (at-least-once); the runner restarts it.
            self.fail(exc)
            raise
        ended = FilterEnded(
            f"the filter of trigger {self.trigger_id!r} on shared stream "
            f"{stream_name(self.key)} returned"
        )
        self.fail(ended)
        raise ended

    def fail(self, error: BaseException) -> None:
        """The current attempt failed with ``error``: fail the event its filter was on.

        Only that event fails (with ``error`` named in its verdict); the
        member stays in the stream. Idempotent; a no-op after the group ended.
        """
        group = self._group
        self.failed_on = None if group is None else group.current_raw_event_name(self.trigger_id)
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

    def raw_event_identity(self) -> tuple[str, str | None] | None:
        """``(raw_event_key, fingerprint)`` for this member's current attempt (see the group's)."""
        if self._group is None or self._sub is None or self._sub.error is not None:
            return None
        return self._group.raw_event_identity(self.trigger_id)

    def traceparent(self) -> str | None:
        """The ``traceparent`` of the raw event this member's filter is on (tracing on only)."""
        if self._group is None or self._sub is None or self._sub.error is not None:
            return None
        return self._group.traceparent(self.trigger_id)

    async def leave(self) -> None:
        """Leave the stream for good (plain ``unsubscribe`` semantics). Idempotent."""
        if self.left:
            return
        self.left = True
        await self._manager.release(self)

    def _set_interrupt_handler(self, handler: Callable[[BaseException], None] | None) -> None:
        sub, group = self._sub, self._group
        if isinstance(sub, AckSubscriber) and group is not None and group.book is not None:
            group.book.set_interrupt_handler(sub, handler)

    # -- state ----------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Raw events fanned out to the member and not pulled yet (its lag)."""
        sub = self._sub
        return 0 if sub is None or sub.error is not None else len(sub.inbox)

    def attach(self, group: StreamGroup) -> None:
        """Subscribe to ``group`` (the manager calls this when it creates a group)."""
        self._group = group
        self._sub = group.add_subscriber(self.trigger_id, self.accept, durable=True)

    def __repr__(self) -> str:
        return f"Membership(trigger_id={self.trigger_id!r}, key={self.key!r})"
