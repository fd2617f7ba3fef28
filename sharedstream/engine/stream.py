"""The iterators a subscriber's ``filter_shared_stream`` consumes, and rejects.

Both modes hand the filter the same shape: an async iterator of raw events
that raises the subscriber's terminal error (overflow, ack timeout, the
poll's failure) once one is set. In ack mode, pulling the next raw event is
what moves the subscriber past the previous one (see
:mod:`sharedstream.engine.resolution`).

Shutdown is the one end that is not raised (Airflow's semantics): once the
group was stopped (:class:`StreamStopped`), a pull waits until the task
consuming the iterator is cancelled, by whoever owns it. Trigger code thus
sees shutdown as ``asyncio.CancelledError``, never as an exception an
``except Exception`` around its loop would catch. The triggerer and the
testing kit's runner cancel the tasks they own at shutdown, so none waits
forever there; code that runs filters in its own tasks must do the same.

:func:`reject_shared_stream_event` finds the subscriber through a context
variable that the ack iterator sets in the task consuming it, so a reject
works from anywhere in the filter's task and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.errors import StreamStopped
from sharedstream.engine.fanout import FanOut, Subscriber
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.resolution import ResolutionBook

__all__ = ["ack_stream", "fast_stream", "reject_shared_stream_event", "rejections_to"]

log = key_value_logger("sharedstream.stream")



class _Rejects(Protocol):
    """Who takes a filter's rejection: the stream's resolution book, or a replay's handler."""

    def reject(self, sub: Any, reason: str | None) -> bool: ...


_window_owner: ContextVar[tuple[_Rejects, Any] | None] = ContextVar(
    "sharedstream_window_owner", default=None
)


class _Handler:
    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[str | None], bool]) -> None:
        self.handler = handler

    def reject(self, sub: Any, reason: str | None) -> bool:
        return self.handler(reason)


@contextmanager
def rejections_to(handler: Callable[[str | None], bool]) -> Iterator[None]:
    """In this block (this task's context) :func:`reject_shared_stream_event` calls ``handler``.

    For a filter run outside any stream (a replay feeds one trigger's filter
    itself): ``handler(reason)`` takes the rejection of the raw event the
    caller is feeding and returns ``True`` (``False``: the same warning as
    outside a binding window).
    """
    token = _window_owner.set((_Handler(handler), None))
    try:
        yield
    finally:
        _window_owner.reset(token)


def reject_shared_stream_event(reason: str | None = None) -> None:
    """Reject the raw event the calling filter is processing (ack mode).

    The event resolves at once as *rejected* for this subscriber - nothing
    waits on persistence - and the producer sees it in
    ``AdvanceOutcome.rejected``, typically dead-lettering it rather than
    redelivering it. Trigger events yielded for it before the reject no
    longer gate its advance. ``reason`` (one line, optional) travels to the
    producer in ``AdvanceOutcome.verdicts``, so a dead-letter record can
    say why.

    Outside an ack-mode binding window (the fast path, a standalone
    ``run()``, another task, or after the event was already resolved) it
    logs one warning and does nothing.
    """
    owner = _window_owner.get()
    if owner is None or not owner[0].reject(owner[1], reason):
        log.warning(
            "reject_shared_stream_event() called outside an ack-mode binding window; "
            "ignored (it only affects the raw event an ack-mode filter is processing)"
        )


async def _park(sub: Subscriber, fanout: FanOut) -> None:
    """Wait until the subscriber's inbox gets an item or its error is set."""
    waiter = asyncio.get_running_loop().create_future()
    sub.waiter = waiter
    fanout.parked[sub] = None
    try:
        await waiter
    finally:
        sub.waiter = None


async def _wait_for_owner(error: BaseException) -> None:
    """The group was stopped: wait until the consuming task is cancelled; else raise ``error``.

    Waits only for :class:`StreamStopped` (shutdown reaches trigger code as
    cancellation, as in Airflow); any other terminal error returns at once
    for the caller to raise.
    """
    if isinstance(error, StreamStopped):
        await asyncio.get_running_loop().create_future()  # completed by nobody: cancelled


async def fast_stream(sub: Subscriber, fanout: FanOut) -> AsyncGenerator[Any, None]:
    """Raw events of a fast-path subscriber, in broadcast order.

    Raises the subscriber's terminal error once set, except
    :class:`StreamStopped`: after a stop it waits to be cancelled (see the
    module docstring). Ends only by raising or by the consuming task being
    cancelled.
    """
    inbox = sub.inbox
    popleft = inbox.popleft
    while True:
        if inbox:
            item = popleft()
            if fanout.blocked_on is sub:
                fanout.relieve(sub)
            yield item
        elif sub.error is not None:
            await _wait_for_owner(sub.error)
            raise sub.error
        else:
            await _park(sub, fanout)


async def ack_stream(book: ResolutionBook, sub: AckSubscriber) -> AsyncGenerator[Any, None]:
    """Raw events of an ack-mode subscriber; each pull resolves the previous event.

    While a raw event is out with the filter, its binding window is open:
    trigger events the runner binds now belong to it, and
    :func:`reject_shared_stream_event` called from this task rejects it.
    The transitions themselves are the book's (:meth:`ResolutionBook.pulls`);
    this iterator only waits for the fan-out and sets the window's owner.

    A durable subscriber may consume through several of these in turn (one
    per attempt of its filter); an attempt interrupted by the ack watchdog
    raises the interrupt at its next pull. Like :func:`fast_stream`, it
    waits to be cancelled after its group was stopped.
    """
    owner = (book, sub)
    fanout = book.fanout
    try:
        for record in book.pulls(sub):
            if record is not None:
                if fanout.blocked_on is sub:
                    fanout.relieve(sub)
                if _window_owner.get() is not owner:
                    _window_owner.set(owner)
                tracer = book.tracer
                if tracer is None:
                    yield record.raw
                else:  # the window's span is the filter's current span until its next pull
                    tracer.pulled(sub.trigger_id, record.broker_payload)
                    yield record.raw
                    tracer.moved_on(sub.trigger_id)
            elif sub.error is not None:
                await _wait_for_owner(sub.error)
                raise sub.error
            else:
                await _park(sub, fanout)
    finally:
        if _window_owner.get() is owner:
            _window_owner.set(None)
        if book.tracer is not None:
            book.tracer.moved_on(sub.trigger_id)
