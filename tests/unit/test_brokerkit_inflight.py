"""The in-flight limit: the poll waits for room, a release or an interrupt wakes it."""

from __future__ import annotations

import asyncio

import pytest

from sharedstream.brokerkit.inflight import InFlightLimit


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_room_waits_until_a_release_makes_enough() -> None:
    limit = InFlightLimit(10)
    limit.take(8)
    await limit.room(2)  # fits: returns at once
    waiter = asyncio.create_task(limit.room(5))
    await settle()
    assert not waiter.done()
    limit.release(2)  # 6 in flight: 5 more do not fit yet
    await settle()
    assert not waiter.done()
    limit.release(1)
    await settle()
    assert waiter.done()
    assert limit.count == 5, "room() does not take"


async def test_interrupt_wakes_every_waiter_for_good() -> None:
    limit = InFlightLimit(1)
    limit.take()
    waiters = [asyncio.create_task(limit.room()) for _ in range(2)]
    await settle()
    limit.interrupt()
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    await asyncio.wait_for(limit.room(), 1)  # still interrupted


def test_release_never_goes_below_zero() -> None:
    limit = InFlightLimit(3)
    limit.take(2)
    limit.release(5)
    assert limit.count == 0
    assert limit.has_room(3)
    assert not limit.has_room(4)
    with pytest.raises(ValueError, match=">= 1"):
        InFlightLimit(0)
