"""A slow watcher that fails on a poison message, for the crash-loop tests of every broker.

``class Slow(PacedPoison, ServiceBusSharedStreamTrigger): pace = 0.1`` in a
definitions file: the filter takes ``pace`` seconds over each message (so a
killed triggerer holds many) and raises on a JSON message whose
``"poison"`` is true (a bug in a user's filter), which makes that message
fail on its own and every message queued behind it fail unseen.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sharedstream.brokerkit.trigger import BrokerTrigger

__all__ = ["PacedPoison"]


class PacedPoison(BrokerTrigger):
    """Fires for every message, ``pace`` seconds after it came; raises on a poison one."""

    pace: float = 0.1

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async def paced() -> AsyncIterator[Any]:
            async for message in shared_stream:
                await asyncio.sleep(self.pace)
                yield message

        async for event in super().filter_shared_stream(paced()):
            yield event

    def matches(self, value: Any, message: Any) -> bool:
        if value.get("poison"):
            raise ValueError(f"cannot handle message {value['id']}")
        return bool(super().matches(value, message))
