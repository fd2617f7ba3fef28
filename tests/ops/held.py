"""A memory-broker watcher whose filter can be held: what the endpoint tests watch lag on.

``HELD`` is a gate the test closes and opens (``HELD.clear()`` holds,
``HELD.set()`` releases); while it is closed the watcher's filter stops
pulling, so the raw events fanned out to it queue up unresolved.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.testing.memory import MemorySharedStreamTrigger


class Gate:
    """Open or closed; :meth:`wait` returns once open. Usable from any event loop.

    (An ``asyncio.Event`` binds to the loop that first waits on it, and each
    test has a loop of its own.)
    """

    def __init__(self) -> None:
        self._open = True
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        self._open = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._open = False

    async def wait(self) -> None:
        if self._open:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter


HELD = Gate()
BROKER = "ops-endpoint"
STREAM = "orders"


class HeldFilter(BaseEventTrigger):
    """Mixed in before a trigger class: its filter waits for ``HELD`` before each event."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for event in super().filter_shared_stream(shared_stream):
            await HELD.wait()
            yield event


class HeldMemoryTrigger(HeldFilter, MemorySharedStreamTrigger):
    """A memory trigger whose filter waits for ``HELD`` before each event it yields."""
