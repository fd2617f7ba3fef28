"""PollWorkers: batches reach the poll in order; a failed worker ends it, wakes waiters, stops."""

from __future__ import annotations

import asyncio

import pytest

from sharedstream.brokerkit.workers import PollWorkers


async def test_batches_reach_the_poll_in_order_and_tasks_are_named() -> None:
    workers: PollWorkers[int] = PollWorkers()
    gate = asyncio.Event()

    async def receive() -> None:
        for start in (0, 3):
            workers.put([start, start + 1, start + 2])
        await gate.wait()

    workers.start("memory s", [("receive", receive)])
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert "memory s receive" in names
    seen: list[int] = []
    async for batch in workers.batches():
        seen.extend(batch)
        if len(seen) == 6:
            break
    assert seen == [0, 1, 2, 3, 4, 5]
    await workers.stop()
    assert workers.broken is None


async def test_a_failed_worker_ends_the_poll_and_wakes_the_waiters() -> None:
    woken: list[str] = []
    workers: PollWorkers[int] = PollWorkers(on_broken=[lambda: woken.append("sender"),
                                                       lambda: woken.append("in-flight")])
    other_cancelled = asyncio.Event()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("client gone")

    async def runs() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            other_cancelled.set()

    workers.start("memory s", [("receive", fails), ("renew", runs)])
    with pytest.raises(ConnectionError, match="client gone"):
        async for _ in workers.batches():
            pass
    assert isinstance(workers.broken, ConnectionError)
    assert woken == ["sender", "in-flight"]
    assert not other_cancelled.is_set()  # the others run until stopped
    await workers.stop()
    assert other_cancelled.is_set()
    await workers.stop()  # idempotent


async def test_batches_put_before_the_failure_come_first() -> None:
    workers: PollWorkers[str] = PollWorkers()

    async def receive_then_fail() -> None:
        workers.put(["a"])
        raise RuntimeError("then broke")

    workers.start("x", [("receive", receive_then_fail)])
    got: list[str] = []

    async def poll() -> None:
        async for batch in workers.batches():
            got.extend(batch)

    with pytest.raises(RuntimeError, match="then broke"):
        await poll()
    assert got == ["a"]
    await workers.stop()
