"""The settle sender against a fake send function (no broker, no real sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from sharedstream.brokerkit.retry import RetryPolicy
from sharedstream.brokerkit.settle import SettleSender


class Flaky(Exception):
    """A call-level failure the sender retries (its ``retry_on``)."""


class Broker:
    """Settles what it is sent, except what it is told to fail; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.settled: list[str] = []
        self.fail_items: dict[str, int] = {}  # item -> how many more calls fail it
        self.raise_calls: list[Exception] = []  # raised by the next calls, in order
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.most_in_flight = 0

    async def send(self, batch: Sequence[str]) -> list[tuple[str, str]]:
        self.calls.append(list(batch))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            if self.gate is not None:
                await self.gate.wait()
            if self.raise_calls:
                raise self.raise_calls.pop(0)
        finally:
            self.in_flight -= 1
        failed = []
        for item in batch:
            if self.fail_items.get(item, 0) > 0:
                self.fail_items[item] -= 1
                failed.append((item, f"Busy: {item} later"))
            else:
                self.settled.append(item)
        return failed


class Harness:
    def __init__(self, broker: Broker, *, retries: int = 2, **kwargs: int) -> None:
        self.broker = broker
        self.delays: list[float] = []
        self.given_up: list[tuple[str, str]] = []
        self.sender: SettleSender[str] = SettleSender(
            broker.send,
            batch_size=kwargs.get("batch_size", 10),
            senders=kwargs.get("senders", 1),
            backlog=kwargs.get("backlog"),
            policy=RetryPolicy(retries, backoff=0.5),
            retry_on=Flaky,
            on_given_up=lambda item, detail: self.given_up.append((item, detail)),
            sleep=self.sleep,
        )

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def start(harness: Harness, running: list[asyncio.Task[None]]) -> asyncio.Task[None]:
    task = asyncio.get_running_loop().create_task(harness.sender.run(), name="test settle")
    running.append(task)
    return task


async def drained(harness: Harness) -> bool:
    async with asyncio.timeout(5):
        return await harness.sender.drain()


async def test_items_go_out_in_batches_in_queue_order(running: list[asyncio.Task[None]]) -> None:
    harness = Harness(Broker(), batch_size=10)
    start(harness, running)
    items = [f"m{i}" for i in range(25)]
    await harness.sender.put(items)
    assert await drained(harness)
    assert [len(call) for call in harness.broker.calls] == [10, 10, 5]
    assert harness.broker.settled == items
    assert harness.sender.idle


async def test_at_most_senders_calls_are_in_flight(running: list[asyncio.Task[None]]) -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    harness = Harness(broker, batch_size=2, senders=3, backlog=100)
    start(harness, running)
    await harness.sender.put([f"m{i}" for i in range(20)])
    for _ in range(10):
        await asyncio.sleep(0)
    assert broker.in_flight == 3  # three senders, each on one batch
    broker.gate.set()
    assert await drained(harness)
    assert broker.most_in_flight == 3
    assert sorted(broker.settled) == sorted(f"m{i}" for i in range(20))


async def test_put_waits_while_the_backlog_is_full(running: list[asyncio.Task[None]]) -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    harness = Harness(broker, batch_size=2, senders=1, backlog=4)
    start(harness, running)
    await harness.sender.put(["a", "b", "c", "d"])  # within the backlog: returns at once
    put = asyncio.get_running_loop().create_task(harness.sender.put(["e", "f", "g"]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not put.done()  # 7 queued - the 2 being sent = 5 > 4: advance would wait here
    assert harness.sender.queued == 5
    broker.gate.set()
    async with asyncio.timeout(5):
        await put
    assert harness.sender.queued <= 4
    assert await drained(harness)
    assert broker.settled == ["a", "b", "c", "d", "e", "f", "g"]


async def test_interrupt_releases_a_waiting_put_and_drain() -> None:
    harness = Harness(Broker(), batch_size=2, senders=1, backlog=1)  # never run: nothing sends
    put = asyncio.get_running_loop().create_task(harness.sender.put(["a", "b", "c"]))
    drain = asyncio.get_running_loop().create_task(harness.sender.drain())
    await asyncio.sleep(0)
    assert not put.done()
    assert not drain.done()
    harness.sender.interrupt()
    async with asyncio.timeout(5):
        await put
        assert not await drain  # woken, and it says something is left
    await harness.sender.put(["d", "e"])  # no waiting once interrupted
    assert harness.sender.queued == 5


async def test_drain_delivers_everything_queued_before_close(
    running: list[asyncio.Task[None]],
) -> None:
    broker = Broker()
    harness = Harness(broker, batch_size=3, senders=2, backlog=1000)
    await harness.sender.put([f"m{i}" for i in range(50)])  # queued before the senders run
    assert not harness.sender.idle
    start(harness, running)
    assert await drained(harness)
    assert sorted(broker.settled) == sorted(f"m{i}" for i in range(50))
    assert harness.sender.queued == 0


async def test_items_failed_transiently_are_retried_alone_with_backoff(
    running: list[asyncio.Task[None]],
) -> None:
    broker = Broker()
    broker.fail_items = {"b": 2}
    harness = Harness(broker, retries=3)
    start(harness, running)
    await harness.sender.put(["a", "b", "c"])
    assert await drained(harness)
    assert broker.calls == [["a", "b", "c"], ["b"], ["b"]]
    assert harness.delays == [0.5, 1.0]
    assert broker.settled == ["a", "c", "b"]
    assert harness.given_up == []


async def test_items_still_failing_when_retries_run_out_are_given_up(
    running: list[asyncio.Task[None]],
) -> None:
    broker = Broker()
    broker.fail_items = {"b": 5}
    harness = Harness(broker, retries=1)
    start(harness, running)
    await harness.sender.put(["a", "b"])
    assert await drained(harness)
    assert broker.calls == [["a", "b"], ["b"]]
    assert harness.given_up == [("b", "Busy: b later")]  # reported, with the broker's detail
    assert broker.settled == ["a"]


async def test_a_failed_call_is_retried_whole(running: list[asyncio.Task[None]]) -> None:
    broker = Broker()
    broker.raise_calls = [Flaky("throttled"), Flaky("throttled")]
    harness = Harness(broker, retries=2)
    start(harness, running)
    await harness.sender.put(["a", "b"])
    assert await drained(harness)
    assert broker.calls == [["a", "b"]] * 3
    assert harness.delays == [0.5, 1.0]
    assert broker.settled == ["a", "b"]


async def test_a_call_failing_past_the_retries_ends_run_with_its_error(
    running: list[asyncio.Task[None]],
) -> None:
    broker = Broker()
    cause = ConnectionError("reset")
    error = Flaky("gone")
    error.__cause__ = cause
    broker.raise_calls = [Flaky("throttled"), error]
    harness = Harness(broker, retries=1, senders=1, batch_size=1, backlog=1)
    task = start(harness, running)
    put = asyncio.get_running_loop().create_task(harness.sender.put(["a", "b", "c", "d"]))
    with pytest.raises(Flaky) as raised:  # the sender's own error, not an exception group
        async with asyncio.timeout(5):
            await task
    assert raised.value is error
    assert raised.value.__cause__ is cause
    async with asyncio.timeout(5):
        await put  # interrupted: nobody waits on a sender that is gone
    assert not await harness.sender.drain()


async def test_an_error_outside_retry_on_is_not_retried(running: list[asyncio.Task[None]]) -> None:
    broker = Broker()
    broker.raise_calls = [ValueError("bad request")]
    harness = Harness(broker, retries=5)
    task = start(harness, running)
    await harness.sender.put(["a"])
    with pytest.raises(ValueError, match="bad request"):
        async with asyncio.timeout(5):
            await task
    assert broker.calls == [["a"]]
    assert harness.delays == []


def test_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        SettleSender(Broker().send, batch_size=0, senders=1, policy=RetryPolicy(0, 0.1),
                     retry_on=Flaky, on_given_up=lambda item, detail: None)


async def test_flush_waits_at_most_its_bound_and_says_what_is_left(
    running: list[asyncio.Task[None]],
) -> None:
    broker = Broker()
    harness = Harness(broker, batch_size=2, senders=1)
    start(harness, running)
    await harness.sender.put(["a", "b"])
    assert await harness.sender.flush(5) == 0  # everything went out
    broker.gate = asyncio.Event()  # the broker stops answering
    await harness.sender.put(["c", "d", "e", "f"])
    assert await harness.sender.flush(0.05) == 2  # c, d in flight; e, f still queued
    broker.gate.set()
    assert await harness.sender.flush(5) == 0
    assert broker.settled == ["a", "b", "c", "d", "e", "f"]
