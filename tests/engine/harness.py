"""A scriptable in-memory upstream and a trigger-runner stand-in for engine tests.

``Feed`` is the test's handle on one upstream: push raw events (or an
exception, or END) into it, read what the producer advanced, observe
opens, closes and the advance calls in flight. Triggers find their feed by
name through ``FEEDS`` because the producer factory only gets kwargs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sharedstream import (
    AckTimeout,
    AdvanceItem,
    AdvanceOutcome,
    BaseEventTrigger,
    SharedStreamManager,
    SharedStreamProducer,
    TriggerEvent,
    reject_shared_stream_event,
)

END = object()
"""Pushed into a feed: the upstream generator returns (a contract violation)."""


@dataclass
class Feed:
    """One scripted upstream and everything its producer did."""

    items: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    factory_calls: int = 0
    opens: int = 0
    closes: int = 0
    close_error: BaseException | None = None
    batches: list[list[AdvanceItem]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    advance_hook: Callable[[Sequence[AdvanceItem]], Awaitable[None]] | None = None
    lane_of: Callable[[Any], Hashable] = lambda payload: None
    events: list[str] = field(default_factory=list)  # "advance", "aclose" in call order

    def push(self, *raws: Any, lane: Hashable = None) -> None:
        """Queue raw events; the payload of each is the raw event itself."""
        for raw in raws:
            self.items.put_nowait((raw, raw))

    def fail(self, error: BaseException) -> None:
        self.items.put_nowait(error)

    def end(self) -> None:
        self.items.put_nowait(END)

    def advanced(self) -> list[tuple[Any, AdvanceOutcome]]:
        return [(item.broker_payload, item.outcome) for batch in self.batches for item in batch]


FEEDS: dict[str, Feed] = {}


class FeedProducer(SharedStreamProducer):
    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self.feed.opens += 1
        while True:
            item = await self.feed.items.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return self.feed.lane_of(broker_payload)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        feed = self.feed
        feed.in_flight += 1
        feed.max_in_flight = max(feed.max_in_flight, feed.in_flight)
        feed.events.append("advance")
        try:
            if feed.advance_hook is not None:
                await feed.advance_hook(batch)
            feed.batches.append(list(batch))
        finally:
            feed.in_flight -= 1

    async def aclose(self) -> None:
        self.feed.closes += 1
        self.feed.events.append("aclose")
        if self.feed.close_error is not None:
            raise self.feed.close_error


class FeedTriggerBase(BaseEventTrigger):
    """Emits ``emit`` events per raw event, except those in ``skip``; rejects ``rejects``."""

    def __init__(
        self, feed: str, name: str, *, skip: Sequence[Any] = (), rejects: Sequence[Any] = (),
        emit: int = 1,
    ) -> None:
        super().__init__()
        self.feed, self.name = feed, name
        self.skip, self.rejects, self.emit = list(skip), list(rejects), emit

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"feed": self.feed, "name": self.name, "skip": self.skip, "rejects": self.rejects,
             "emit": self.emit},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError
        yield  # type: ignore[unreachable]

    def shared_stream_key(self) -> Hashable:
        return ("feed", self.feed)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            if raw in self.rejects:
                reject_shared_stream_event()
                continue
            if raw in self.skip:
                continue
            for n in range(self.emit):
                yield TriggerEvent({"raw": raw, "by": self.name, "n": n})


class FeedTrigger(FeedTriggerBase):
    """Ack mode: the feed's producer is advanced as subscribers resolve."""

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        feed = FEEDS[kwargs["feed"]]
        feed.factory_calls += 1
        return FeedProducer(feed)


class FastFeedTrigger(FeedTriggerBase):
    """The fast path: no producer, no acks."""

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        feed = FEEDS[kwargs["feed"]]
        feed.opens += 1
        try:
            while True:
                item = await feed.items.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item[0]
        finally:
            feed.closes += 1


class Runner:
    """Drives one trigger the way the triggerer does, recording what happens.

    Each emitted event is bound; with ``auto_confirm`` its seq is confirmed at
    once (a store that persists instantly), otherwise seqs collect in
    ``unconfirmed`` for the test to confirm.
    """

    def __init__(
        self, manager: SharedStreamManager, trigger: FeedTriggerBase, trigger_id: int,
        *, auto_confirm: bool = True,
    ) -> None:
        self.manager, self.trigger, self.trigger_id = manager, trigger, trigger_id
        self.key = trigger.shared_stream_key()
        self.auto_confirm = auto_confirm
        self.events: list[TriggerEvent] = []
        self.unconfirmed: list[int] = []
        self.error: BaseException | None = None
        self.gate: asyncio.Event | None = None  # when set, the filter pauses after each event
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Runner:
        stream = self.manager.subscribe(
            trigger_id=self.trigger_id, trigger=self.trigger, key=self.key
        )
        self.task = asyncio.get_running_loop().create_task(self._run(stream))
        return self

    async def _run(self, stream: AsyncIterator[Any]) -> None:
        try:
            async for event in self.trigger.filter_shared_stream(stream):
                seq = self.manager.bind_pending_event(trigger_id=self.trigger_id, key=self.key)
                self.events.append(event)
                if seq is not None:
                    if self.auto_confirm:
                        self.manager.confirm_persisted([seq])
                    else:
                        self.unconfirmed.append(seq)
                if self.gate is not None:
                    await self.gate.wait()
        except Exception as exc:  # noqa: BLE001 - recorded for the test to assert on
            self.error = exc

    def failure(self) -> BaseException | None:
        """The error the filter ended with so far (a call, so type checkers don't pin it)."""
        return self.error

    def confirm_all(self) -> None:
        seqs, self.unconfirmed = self.unconfirmed, []
        self.manager.confirm_persisted(seqs)

    async def stop(self) -> None:
        """Cancel the filter task, then unsubscribe (the triggerer's order)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])
        await self.manager.unsubscribe(self.trigger_id, self.key)

    def raws(self) -> list[Any]:
        return [event.payload["raw"] for event in self.events]


async def settle(rounds: int = 20) -> None:
    """Let every ready task run until the loop is quiet (no timers involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def eventually(predicate: Callable[[], bool], within: float = 3.0) -> None:
    """Wait until ``predicate()`` holds, failing the test after ``within`` seconds.

    Polling is deliberate: the predicates read state from several objects
    that have no common event to wait on.
    """
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - see docstring
            await asyncio.sleep(0.001)


class MemberRunner:
    """Drives a durable member the way the triggerer does: one ``run_attempt`` per attempt.

    ``start()`` begins an attempt; when it ends with an error (the filter
    raised, or the ack watchdog interrupted it) the error is recorded and
    the attempt is over - ``restart()`` begins the next. ``hang_on`` makes
    the filter hang on that raw event until cancelled (by the ack watchdog's
    interrupt); ``raise_on`` makes it raise on that raw event (every time,
    or ``raise_times`` times).
    """

    def __init__(
        self, manager: SharedStreamManager, trigger: FeedTriggerBase, trigger_id: int,
        *, auto_confirm: bool = True,
    ) -> None:
        self.manager, self.trigger, self.trigger_id = manager, trigger, trigger_id
        self.member = manager.join(
            trigger_id=trigger_id, trigger=trigger, key=trigger.shared_stream_key())
        self.auto_confirm = auto_confirm
        self.events: list[TriggerEvent] = []
        self.unconfirmed: list[int] = []
        self.errors: list[BaseException] = []
        self.raise_on: Any = None
        self.raise_times = 1_000_000
        self.hang_on: Any = None
        self.pulls = asyncio.Event()  # set whenever a raw event is pulled
        self.gate: asyncio.Event | None = None  # when set, the filter waits before each raw
        self.task: asyncio.Task[None] | None = None
        self.interrupted: list[BaseException] = []
        self.identities: list[tuple[str, str | None] | None] = []  # raw_event_identity per event

    def start(self, delay: float = 0.0) -> MemberRunner:
        self.task = asyncio.get_running_loop().create_task(self._attempt(delay))
        return self

    restart = start

    async def _filter(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            self.pulls.set()
            if self.gate is not None:
                await self.gate.wait()
            if raw == self.hang_on:
                await asyncio.Event().wait()
            if raw == self.raise_on and self.raise_times > 0:
                self.raise_times -= 1
                raise RuntimeError(f"boom on {raw!r}")
            yield TriggerEvent({"raw": raw, "by": self.trigger.name, "n": 0})

    async def _consume(self, stream: AsyncIterator[Any]) -> None:
        async for event in self._filter(stream):
            seq = self.member.bind()
            self.identities.append(self.member.raw_event_identity())
            self.events.append(event)
            if seq is not None:
                if self.auto_confirm:
                    self.manager.confirm_persisted([seq])
                else:
                    self.unconfirmed.append(seq)

    async def _attempt(self, delay: float) -> None:
        try:
            await self.member.run_attempt(self._consume, delay=delay)
        except AckTimeout as exc:  # the watchdog interrupted the hung filter
            self.interrupted.append(exc)
            self.errors.append(exc)
        except Exception as exc:  # noqa: BLE001 - recorded for the test to assert on
            self.errors.append(exc)

    def confirm_all(self) -> None:
        seqs, self.unconfirmed = self.unconfirmed, []
        self.manager.confirm_persisted(seqs)

    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def stop(self) -> None:
        """Cancel the attempt, then leave (the triggerer's order)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])
        await self.member.leave()

    def raws(self) -> list[Any]:
        return [event.payload["raw"] for event in self.events]
