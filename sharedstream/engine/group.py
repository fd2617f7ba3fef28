"""One shared-stream group: a poll, its subscribers, and (ack mode) pump and watchdog.

Lifecycle invariant - a group is reachable from the manager only while its
poll is alive and accepting subscribers:

* When the poll ends by itself (it raised, or it returned, which is
  :class:`PollTerminated`), the group is evicted from the manager and every
  subscriber receives the cause in one synchronous step, before anything
  else can run; a subscriber arriving afterwards creates a fresh group.
* When ``advance`` raises, the pump does the same and cancels the poll.
* When the manager stops a group it evicts it first, then awaits
  :meth:`StreamGroup.stop`.

Whatever ends the poll, the exit path advances what is already resolved
(bounded by ``DRAIN_TIMEOUT``; not after an ``advance`` failure), then calls
``producer.aclose()`` exactly once. Unresolved events are abandoned to
broker redelivery.

Back-pressure: the poll takes nothing more from its source while the
manager's :class:`IntakeValve` is closed (the runtime's store is behind) or
while a durable member's inbox is full (that member is slow or away); it
resumes when the valve opens and the member has worked through half its
queue. So durable members never overflow, and memory stays bounded by
``max_subscriber_queue`` per member.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import AsyncExitStack
from typing import Any, cast

from opentelemetry.trace import TracerProvider

from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.errors import (
    BacklogUnavailable,
    DuplicateSubscription,
    PollTerminated,
    ProducerContractError,
    SharedStreamError,
    StreamStopped,
)
from sharedstream.engine.fanout import Accept, FanOut, Subscriber
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.names import stream_name
from sharedstream.engine.producer import (
    BrokerBacklog,
    DeadLetterFallback,
    FailureLedger,
    SharedStreamProducer,
)
from sharedstream.engine.pump import AdvancePump, StreamTotals
from sharedstream.engine.records import UNNAMED, EventRecord
from sharedstream.engine.resolution import ResolutionBook, overflow_error
from sharedstream.engine.seqs import SeqRouter
from sharedstream.engine.stream import ack_stream, fast_stream
from sharedstream.engine.telemetry import instruments, unwatch_book, watch_book
from sharedstream.engine.timeouts import run_ack_watchdog
from sharedstream.engine.tracing import StreamTracer
from sharedstream.engine.trigger import BaseEventTrigger, uses_ack_mode

__all__ = ["IntakeValve", "StreamGroup"]

log = key_value_logger("sharedstream.stream")

DRAIN_TIMEOUT = 30.0
"""Seconds a stopping group waits for resolved events to be advanced before giving up."""

YIELD_EVERY = 256
"""The poll yields to the event loop at least once per this many raw events."""

ROOM_RECHECK = 1.0
"""Seconds between re-checks while the poll waits on a full durable inbox."""

BEHIND_LOG_INTERVAL = 60.0
"""Seconds between two "paused for trigger X" lines about the same trigger."""


class IntakeValve:
    """A switch, shared by a manager's groups, that stops every poll from fanning out.

    The runtime closes it while the store is behind (its write queue is
    long, or it is failing) and opens it once it has caught up. Closing is
    by reason, so two causes do not release each other.
    """

    def __init__(self) -> None:
        self._reasons: set[str] = set()
        self._opened = asyncio.Event()
        self._opened.set()
        self.is_open = True

    def close(self, reason: str) -> None:
        """Hold intake for ``reason`` (idempotent)."""
        self._reasons.add(reason)
        self.is_open = False
        self._opened.clear()

    def open(self, reason: str) -> None:
        """Drop ``reason``; intake resumes when no reason is left (idempotent)."""
        self._reasons.discard(reason)
        if not self._reasons:
            self.is_open = True
            self._opened.set()

    @property
    def reasons(self) -> frozenset[str]:
        """Why intake is held now (empty when open)."""
        return frozenset(self._reasons)

    async def wait_open(self) -> None:
        """Return once intake is open."""
        await self._opened.wait()


class StreamGroup:
    """The subscribers of one shared-stream key and the single poll feeding them.

    Built and owned by :class:`~sharedstream.engine.manager.SharedStreamManager`;
    the poll starts with :meth:`start`. ``on_terminate`` is called
    synchronously when the group ends by itself, so the manager can evict it.
    """

    def __init__(
        self,
        *,
        key: Hashable,
        trigger_class: type[BaseEventTrigger],
        kwargs: dict[str, Any],
        max_subscriber_queue: int,
        ack_timeout: float,
        cohort_grace_period: float,
        clock: Callable[[], float],
        router: SeqRouter,
        on_terminate: Callable[[StreamGroup], None],
        valve: IntakeValve | None = None,
        dead_letter_fallback: DeadLetterFallback | None = None,
        failure_ledger: FailureLedger | None = None,
        totals: StreamTotals | None = None,
        tracer_provider: TracerProvider | None = None,
        name: str | None = None,
    ) -> None:
        self.key = key
        self.name = name if name is not None else stream_name(key)
        """The stream's name (:mod:`sharedstream.engine.names`): in its log lines, errors,
        metrics, task names, and given to its producer as ``stream_name``."""
        self._tracer_provider = tracer_provider
        self.trigger_class = trigger_class
        self.kwargs = kwargs
        self.ack_mode = uses_ack_mode(trigger_class)
        self._grace = cohort_grace_period
        self._clock = clock
        self._on_terminate = on_terminate
        self._valve = valve if valve is not None else IntakeValve()
        self._dead_letter_fallback = dead_letter_fallback
        self._failure_ledger = failure_ledger
        self._totals = totals
        self._behind_logged: dict[Hashable, float] = {}
        self.paused: dict[str, float] = {"intake": 0.0, "watcher_behind": 0.0}
        """Seconds the poll spent held, by why: intake closed, a durable watcher's inbox full.

        Added to only when the poll actually waits (a clock read on each
        side of the wait), never per raw event; read by status views.
        """
        self.fanout = FanOut(max_subscriber_queue)
        self.book: ResolutionBook | None = None
        if self.ack_mode:
            self.book = ResolutionBook(
                key=key,
                name=self.name,
                fanout=self.fanout,
                ack_timeout=ack_timeout,
                router=router,
                clock=clock,
            )
            watch_book(self.book)
        self.bind: Callable[[Hashable], int | None] = (
            self.book.bind_for if self.book is not None else _no_bind
        )
        """``bind(trigger_id)``: bind the trigger event that subscriber just emitted.

        Returns the seq to confirm, or ``None`` when nothing waits on it (fast
        path, unknown subscriber, no open window). The book's
        :meth:`~ResolutionBook.bind_for` itself in ack mode: no extra call on
        the hot path.
        """
        self._fast_subscribers: dict[Hashable, Subscriber] = {}
        self._task: asyncio.Task[None] | None = None
        self._terminated = False
        self._producer: SharedStreamProducer | None = None
        self._producer_open = False  # between the producer's creation and its aclose
        self._fingerprints = False  # the producer overrides raw_event_fingerprint

    # -- membership (called by the manager, synchronously) -----------------------

    def start(self) -> None:
        """Start the poll task. Called exactly once, from inside the event loop."""
        if self._task is not None:
            raise RuntimeError(f"shared stream group {self.name} already started")
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"sharedstream-poll[{self.name}]"
        )

    def subscribe(self, trigger_id: Hashable, accept: Accept | None = None) -> AsyncIterator[Any]:
        """Add a subscriber; it is in the snapshot of every event broadcast from now on.

        ``accept`` is its prefilter (see :class:`~sharedstream.engine.fanout.FanOut`).
        """
        return self.attempt(self.add_subscriber(trigger_id, accept))

    def add_subscriber(
        self, trigger_id: Hashable, accept: Accept | None = None, *, durable: bool = False
    ) -> Subscriber:
        """Add a subscriber without an iterator yet (see :meth:`attempt`)."""
        if trigger_id in self._fast_subscribers or (
            self.book is not None and trigger_id in self.book.subscribers
        ):
            raise DuplicateSubscription(
                f"trigger {trigger_id!r} is already subscribed to shared stream {self.name}; "
                "unsubscribe it first"
            )
        if self.book is not None:
            return self.book.add_subscriber(trigger_id, accept, durable=durable)
        sub = Subscriber(trigger_id, accept, durable=durable)
        self._fast_subscribers[trigger_id] = sub
        self.fanout.add(sub)
        return sub

    def attempt(self, sub: Subscriber) -> AsyncIterator[Any]:
        """A new iterator over ``sub``'s inbox (a durable member gets one per attempt)."""
        if self.book is not None:
            return ack_stream(self.book, cast("AckSubscriber", sub))
        return fast_stream(sub, self.fanout)

    def unsubscribe(self, trigger_id: Hashable) -> None:
        """Remove a subscriber; see :meth:`ResolutionBook.remove_subscriber` for ack mode."""
        if self.book is not None:
            self.book.remove_subscriber(trigger_id)
            return
        sub = self._fast_subscribers.pop(trigger_id, None)
        if sub is not None:
            self.fanout.drop(sub)

    def has_subscriber(self, trigger_id: Hashable) -> bool:
        """Whether ``trigger_id`` is subscribed (plain or durable)."""
        if self.book is not None:
            return trigger_id in self.book.subscribers
        return trigger_id in self._fast_subscribers

    def queued(self) -> dict[Hashable, int]:
        """Raw events queued and not pulled yet, per subscriber."""
        subs = self.book.subscribers if self.book is not None else self._fast_subscribers
        return {trigger_id: len(sub.inbox) for trigger_id, sub in subs.items()}

    def connected(self) -> bool | None:
        """The producer's ``connected`` (``None``: the fast path, or no producer yet)."""
        return None if self._producer is None else self._producer.connected

    async def broker_backlog(self) -> BrokerBacklog:
        """The producer's :meth:`~SharedStreamProducer.broker_backlog` while its poll runs.

        Raises :class:`BacklogUnavailable` on the fast path (no producer to
        ask) and :class:`SharedStreamError` while no producer is open (not
        built yet, or closed); otherwise whatever the producer raises. The
        caller bounds it with a timeout.
        """
        if not self.ack_mode:
            raise BacklogUnavailable("a fast-path stream has no producer to ask")
        producer = self._producer
        if producer is None or not self._producer_open:
            raise SharedStreamError("the stream's producer is not open")
        return await producer.broker_backlog()

    def is_empty(self) -> bool:
        """Whether no subscriber is registered any more."""
        if self.book is not None:
            return not self.book.subscribers
        return not self._fast_subscribers

    def fail_subscriber(self, trigger_id: Hashable, error: BaseException) -> None:
        """Force-fail one subscriber (its filter raised); see the manager's method."""
        if self.book is None:
            return
        sub = self.book.subscribers.get(trigger_id)
        if sub is not None:
            self.book.fail(sub, error)

    def traceparent(self, trigger_id: Hashable) -> str | None:
        """The W3C ``traceparent`` of the window ``trigger_id`` is in (``None``: not traced)."""
        tracer = self.book.tracer if self.book is not None else None
        return None if tracer is None else tracer.traceparent(trigger_id)

    def current_raw_event_name(self, trigger_id: Hashable) -> str | None:
        """The producer's name of the raw event ``trigger_id``'s filter is on (bound or not)."""
        if self.book is None or self._producer is None:
            return None
        sub = self.book.subscribers.get(trigger_id)
        if sub is None or sub.current is None:
            return None
        name = self._name(sub.current)
        return name if isinstance(name, str) else None

    def raw_event_key(self, trigger_id: Hashable) -> str | None:
        """``"<producer's name of the raw event>#<index>"`` for the event bound last."""
        identity = self.raw_event_identity(trigger_id)
        return None if identity is None else identity[0]

    def raw_event_identity(self, trigger_id: Hashable) -> tuple[str, str | None] | None:
        """``(raw_event_key, the producer's fingerprint of its raw event)`` for the last bound.

        ``None`` where :meth:`raw_event_key` is ``None``. O(1); the producer
        is asked once per raw event, however many subscribers bind it.
        """
        if self.book is None or self._producer is None:
            return None
        sub = self.book.subscribers.get(trigger_id)
        if sub is None or sub.current is None or sub.bound_record is not sub.current:
            return None
        record = sub.current
        name = record.raw_name
        if name is UNNAMED:
            name = self._name(record)
        return None if name is None else (f"{name}#{sub.bind_index}", record.raw_fingerprint)

    def _name(self, record: EventRecord) -> str | object | None:
        """``record``'s raw name; asks the producer for it and its fingerprint the first time."""
        name = record.raw_name
        if name is UNNAMED:
            producer = cast("SharedStreamProducer", self._producer)
            payload = record.broker_payload
            name = record.raw_name = producer.raw_event_name(payload)
            if name is not None and self._fingerprints:
                record.raw_fingerprint = producer.raw_event_fingerprint(payload)
        return name

    # -- ending ----------------------------------------------------------------

    async def stop(self) -> None:
        """Cancel the poll and wait until it advanced what was resolved and closed the producer.

        The caller must have evicted the group already. Subscribers still
        attached are marked :class:`StreamStopped`, which their iterators do
        not raise: they wait for their owner to cancel them (see
        :mod:`sharedstream.engine.stream`). Idempotent.
        """
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        self._terminate(StreamStopped(f"shared stream {self.name} was stopped"))

    def _terminate(self, error: BaseException) -> None:
        """Evict the group and hand ``error`` to every subscriber. Synchronous; idempotent."""
        if self._terminated:
            return
        self._terminated = True
        self._on_terminate(self)
        if self.book is not None:
            unwatch_book(self.book)
            self.book.terminate(error)
        else:
            self.fanout.fail_all(error)

    def _fail_from_pump(self, error: BaseException) -> None:
        self._terminate(error)
        if self._task is not None:
            self._task.cancel()

    # -- the poll ----------------------------------------------------------------

    async def _run(self) -> None:
        terminal: BaseException | None = None
        async with AsyncExitStack() as exits:
            try:
                if self._grace > 0:
                    await asyncio.sleep(self._grace)
                if self.book is not None:
                    await self._poll_ack(self.book, exits)
                else:
                    await self._poll_fast(exits)
                terminal = PollTerminated(
                    f"the poll of shared stream {self.name} returned; open_shared_stream / "
                    "open_stream must yield for the lifetime of the group or raise"
                )
            except asyncio.CancelledError:
                raise  # stop() or the pump ended us; whoever did has already evicted
            except Exception as exc:
                # Any poll error ends the group; subscribers get the cause and
                # the broker redelivers what was not advanced.
                terminal = exc
                if getattr(exc, "retryable", False):  # the broker's doing: one line says it
                    log.warning("shared stream stopped; its triggers start it again after "
                                "their restart backoff", stream=self.name, error=exc)
                elif isinstance(exc, SharedStreamError):
                    # A named, lasting problem (settings that cannot work, a stream that does
                    # not exist): every subscriber gets it and its owner says it, once.
                    log.debug("the poll of the shared stream failed", stream=self.name,
                              error=exc)
                else:
                    log.exception("the poll of the shared stream failed", stream=self.name)
            finally:
                if terminal is not None:
                    self._terminate(terminal)
            # Leaving the exit stack (only now: eviction above must not wait on
            # anything) closes the source, stops the watchdog, drains the
            # pump and closes the producer, in that order.

    async def _poll_fast(self, exits: AsyncExitStack) -> None:
        source = self.trigger_class.open_shared_stream(self.kwargs)
        exits.push_async_callback(self._close_source, source)
        broadcast = self.fanout.broadcast
        count = 0
        valve = self._valve
        async for raw in source:
            overflowed = broadcast(raw, raw)
            if overflowed is not None:
                for sub in overflowed:
                    self._report_overflow(sub)
                    sub.set_error(overflow_error(self.name, sub.trigger_id, self.fanout.capacity))
            count += 1
            if self.fanout.crowded or not valve.is_open or not count % YIELD_EVERY:
                await self._hold()

    async def _poll_ack(self, book: ResolutionBook, exits: AsyncExitStack) -> None:
        producer = self.trigger_class.create_shared_stream_producer(self.kwargs)
        if not isinstance(producer, SharedStreamProducer):
            raise ProducerContractError(
                f"{self.trigger_class.__qualname__}.create_shared_stream_producer returned "
                f"{type(producer).__qualname__}, not a SharedStreamProducer"
            )
        self._producer = producer
        self._producer_open = True
        self._fingerprints = (type(producer).raw_event_fingerprint
                              is not SharedStreamProducer.raw_event_fingerprint)
        producer.stream_name = self.name
        if self._dead_letter_fallback is not None:
            producer.dead_letter_fallback = self._dead_letter_fallback
        if self._failure_ledger is not None:
            producer.failure_ledger = self._failure_ledger
        exits.push_async_callback(self._close_producer, producer)
        if self._tracer_provider is not None:
            book.tracer = StreamTracer(self._tracer_provider, self.name, producer)
            exits.callback(book.tracer.close)  # after the drain: spans left end abandoned
        tracer = book.tracer
        pump = AdvancePump(book, producer, on_failure=self._fail_from_pump, totals=self._totals)
        book.on_ready = pump.notify
        pump_task = asyncio.get_running_loop().create_task(
            pump.run(), name=f"sharedstream-advance[{self.name}]"
        )
        exits.push_async_callback(_drain_pump, pump, pump_task, self.name)
        watchdog = asyncio.get_running_loop().create_task(
            run_ack_watchdog(book, self._clock), name=f"sharedstream-ack-watchdog[{self.name}]"
        )
        exits.push_async_callback(_cancel_and_wait, watchdog)

        source = producer.open_stream()
        exits.push_async_callback(self._close_source, source)
        get_lane = producer.get_advance_lane
        # Asked only of a producer that can narrow a redelivery (the hot path stays as it was).
        audience_of = (producer.delivery_audience
                       if type(producer).delivery_audience
                       is not SharedStreamProducer.delivery_audience else None)
        clock = self._clock
        fanout = self.fanout
        valve = self._valve
        count = 0
        async for item in source:
            try:
                raw, payload = item
            except (TypeError, ValueError) as exc:
                raise ProducerContractError(
                    f"{type(producer).__qualname__}.open_stream must yield "
                    f"(raw_event, broker_payload) pairs, got {type(item).__qualname__}"
                ) from exc
            lane = get_lane(payload)
            if tracer is not None:
                tracer.received(raw, payload)
            try:
                overflowed = book.broadcast(raw, payload, lane, clock(),
                                            None if audience_of is None else audience_of(payload))
            except TypeError as exc:
                raise ProducerContractError(
                    f"{type(producer).__qualname__}.get_advance_lane returned an "
                    f"unhashable {type(lane).__qualname__}"
                ) from exc
            if tracer is not None:
                tracer.fanned_out(len(fanout.live), fanout.skipped)
            if overflowed is not None:
                for sub in overflowed:
                    self._report_overflow(sub)
            count += 1
            if fanout.crowded or not valve.is_open or not count % YIELD_EVERY:
                await self._hold()

    async def _hold(self) -> None:
        """Yield to the loop; wait while intake is closed or a durable member's inbox is full.

        Called between two broadcasts, so the source is not asked for more
        (its own read-ahead is bounded) until the wait is over.
        """
        await asyncio.sleep(0)
        valve, fanout = self._valve, self.fanout
        while True:
            if not valve.is_open:
                began = time.monotonic()
                try:
                    await valve.wait_open()
                finally:
                    self.paused["intake"] += time.monotonic() - began
                continue
            sub = fanout.full_member()
            if sub is None:
                return
            self._report_behind(sub)
            began = time.monotonic()
            try:
                await fanout.wait_for_room(sub, ROOM_RECHECK)
            finally:
                self.paused["watcher_behind"] += time.monotonic() - began

    def _report_behind(self, sub: Subscriber) -> None:
        instruments().pauses.add(1, {"stream": self.name, "reason": "subscriber_behind"})
        now = time.monotonic()
        last = self._behind_logged.get(sub.trigger_id)
        if last is not None and now - last < BEHIND_LOG_INTERVAL:
            return
        self._behind_logged[sub.trigger_id] = now
        log.info(
            "shared stream paused: trigger behind, until it has worked through half its queue",
            stream=self.name, trigger=sub.trigger_id, queue_size=self.fanout.capacity,
        )

    def _report_overflow(self, sub: Subscriber) -> None:
        instruments().forced_failures.add(1, {"stream": self.name, "reason": "overflow"})
        log.warning(
            "trigger fell behind the shared stream (its queue is full); failing it alone",
            stream=self.name, trigger=sub.trigger_id, queue_size=self.fanout.capacity,
        )

    async def _close_source(self, source: AsyncIterator[Any]) -> None:
        """Close an async-generator source now, in this task, so its ``finally`` runs here."""
        aclose = getattr(source, "aclose", None)
        if aclose is None:
            return
        try:
            await aclose()
        except Exception:
            # The poll is over; a failing cleanup in the source must not stop
            # the drain and producer close that follow.
            log.exception("closing the source of the shared stream failed", stream=self.name)

    async def _close_producer(self, producer: SharedStreamProducer) -> None:
        self._producer_open = False
        try:
            await producer.aclose()
        except Exception:
            # Best-effort by contract: the poll is over either way, and what
            # was not advanced will be redelivered.
            log.exception("producer.aclose() of the shared stream failed", stream=self.name)


def _no_bind(_trigger_id: Hashable) -> None:
    """``StreamGroup.bind`` on the fast path: nothing waits on persistence."""


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])


async def _drain_pump(pump: AdvancePump, task: asyncio.Task[None], stream: str) -> None:
    """Let the pump advance what is resolved, for at most ``DRAIN_TIMEOUT`` seconds."""
    pump.request_stop()
    done, _ = await asyncio.wait([task], timeout=DRAIN_TIMEOUT)
    if not done:
        log.error(
            "shared stream stopping: advancing resolved events timed out; abandoning them to "
            "broker redelivery",
            stream=stream, timeout_s=DRAIN_TIMEOUT,
        )
        await _cancel_and_wait(task)
