"""Definitions for the crash-loop test: one slow watcher that raises on a poison message.

``all`` takes ``SERVICEBUS_TEST_PACE`` seconds over each message (so a
killed triggerer holds many) and raises on a message whose JSON says
``"poison": true`` (a bug in a user's filter). The queue, the server and
whether it has sessions come from the environment as for
``servicebus_defs.py``; a failure is never tolerated (``max_redeliveries``
0), so every delivery a crash caused looks, to the broker's count alone,
like one too many.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger

PACE = float(os.environ.get("SERVICEBUS_TEST_PACE", "0.1"))


class Slow(ServiceBusSharedStreamTrigger):
    """Fires for every message, ``PACE`` seconds after it came; raises on a poison one."""

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async def paced() -> AsyncIterator[Any]:
            async for message in shared_stream:
                await asyncio.sleep(PACE)
                yield message

        async for event in super().filter_shared_stream(paced()):
            yield event

    def matches(self, value: Any, message: Any) -> bool:
        if value.get("poison"):
            raise ValueError(f"cannot handle message {value['id']}")
        return bool(super().matches(value, message))


every = Asset("every", watchers=[AssetWatcher("all", trigger=Slow(
    connection_string=os.environ.get("SERVICEBUS_TEST_CONNECTION_STRING", ""),
    queue=os.environ.get("SERVICEBUS_TEST_QUEUE", "orders"),
    sessions=os.environ.get("SERVICEBUS_TEST_SESSIONS") == "1",
    lock_duration=5, max_wait_time=1.0, max_messages=10, max_in_flight=10, max_redeliveries=0,
    payload_format="json",
))])
