"""A memory-broker watcher whose filter can be held: what the endpoint tests watch lag on.

``HELD`` is a gate the test closes and opens (``HELD.clear()`` holds,
``HELD.set()`` releases); while it is closed the watcher's filter stops
pulling, so the raw events fanned out to it queue up unresolved.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sharedstream import TriggerEvent
from sharedstream.testing.memory import MemorySharedStreamTrigger

HELD = asyncio.Event()
HELD.set()
BROKER = "ops-endpoint"
STREAM = "orders"


class HeldMemoryTrigger(MemorySharedStreamTrigger):
    """A memory trigger whose filter waits for ``HELD`` before each event it yields."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for event in super().filter_shared_stream(shared_stream):
            await HELD.wait()
            yield event
