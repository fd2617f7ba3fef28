"""``cancellation_kept``: a cancellation an SDK call lost is raised again (its module's invariants).

The lost cancellation is made the way azure-servicebus loses it on Python
3.11: ``asyncio.wait_for`` around a read whose data arrives in the same
loop turn as the cancellation. On 3.12 and later ``wait_for`` keeps it
itself; the guard must then change nothing.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from sharedstream.brokerkit.cancellation import cancellation_kept


async def read_meeting_a_cancel(task_of_reader: list[asyncio.Task[None]]) -> bytes:
    """``wait_for`` on a read that completes in the very turn the caller is cancelled.

    The read's data and the cancellation are delivered by one callback:
    the read's task runs first and finishes, so 3.11's ``wait_for`` sees
    it done when the ``CancelledError`` reaches it, and returns its result.
    """
    loop = asyncio.get_running_loop()
    data: asyncio.Future[bytes] = loop.create_future()

    async def read() -> bytes:
        return await data

    def arrive_and_cancel() -> None:
        data.set_result(b"frame")
        task_of_reader[0].cancel()

    loop.call_later(0.01, arrive_and_cancel)
    return await asyncio.wait_for(read(), timeout=5)


async def swallowing_loop(guarded: bool, attempts: list[int]) -> None:
    """A session worker's shape: ask again after each answer until cancelled."""
    task = asyncio.current_task()
    assert task is not None
    while True:
        attempts.append(1)
        if len(attempts) > 3:
            return  # asked again after its cancellation: the bug
        if guarded:
            with cancellation_kept():
                await read_meeting_a_cancel([task])
        else:
            await read_meeting_a_cancel([task])


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps it itself from 3.12")
async def test_python_3_11_wait_for_loses_a_cancellation_that_meets_its_result() -> None:
    attempts: list[int] = []
    task = asyncio.create_task(swallowing_loop(False, attempts))
    await task
    assert not task.cancelled(), "the premise: the cancellation was lost"
    assert len(attempts) > 3, "the premise: the loop asked again after it"


async def test_a_lost_cancellation_is_raised_at_the_end_of_the_block() -> None:
    attempts: list[int] = []
    task = asyncio.create_task(swallowing_loop(True, attempts))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert len(attempts) == 1


async def test_a_lost_cancellation_turned_into_another_error_is_raised_with_it_as_cause() -> None:
    async def converting() -> None:
        task = asyncio.current_task()
        assert task is not None
        with cancellation_kept():
            try:
                await read_meeting_a_cancel([task])
            finally:
                raise LookupError("the SDK's own timeout")

    task = asyncio.create_task(converting())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_an_uncancelled_block_ends_as_it_would_without_the_guard() -> None:
    with cancellation_kept():
        result = await asyncio.sleep(0, "value")
    assert result == "value"
    with pytest.raises(LookupError), cancellation_kept():
        raise LookupError("its own")


async def test_a_cancellation_taken_in_the_block_passes_unchanged() -> None:
    async def sleeper(started: asyncio.Event) -> None:
        with cancellation_kept():
            started.set()
            await asyncio.sleep(10)

    started = asyncio.Event()
    task = asyncio.create_task(sleeper(started))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_timeout_around_it_turns_a_lost_deadline_into_timeout_error() -> None:
    async def deaf() -> str:
        """Loses every cancellation: it goes on sleeping in small steps."""
        for _ in range(200):
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                return "swallowed"
        return "done"

    async def bounded() -> None:
        async with asyncio.timeout(0.05):
            with cancellation_kept():
                await deaf()

    with pytest.raises(TimeoutError):
        await bounded()
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_task_group_that_withdrew_its_cancellation_leaves_the_block_alone() -> None:
    async def failing_group() -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(asyncio.sleep(0))
            tasks.create_task(_fail())
            await asyncio.sleep(1)

    with cancellation_kept():
        with pytest.raises(ExceptionGroup):
            await failing_group()
        result = await asyncio.sleep(0, "still running")
    assert result == "still running"


async def _fail() -> None:
    raise LookupError("a child failed")
