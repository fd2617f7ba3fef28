"""Definitions for ``test_replay``: watchers of one topic, one of them added late.

``orders/all`` fires one event per record; ``late/all`` (listed only when
``REPLAY_LATE=1``) fires one per record whose ``id`` is even - a watcher
added after the stream was read, the one a replay catches up. Both share
one consumer (same settings). A DAG runs on each asset, one run per event.

Configured by environment: ``REPLAY_BOOTSTRAP``, ``REPLAY_TOPIC``,
``REPLAY_GROUP``, ``REPLAY_LATE``, ``REPLAY_DELAY``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.engine.events import TriggerEvent
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

DELAY = float(os.environ.get("REPLAY_DELAY", "0"))
COMMON: dict[str, Any] = {
    "bootstrap_servers": os.environ["REPLAY_BOOTSTRAP"],
    "topics": [os.environ["REPLAY_TOPIC"]],
    "group_id": os.environ["REPLAY_GROUP"],
    "payload_format": "json",
    "consumer_overrides": {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400},
}


class EvenIds(KafkaSharedStreamTrigger):
    """Matches records whose ``id`` is even; ``REPLAY_DELAY`` seconds per event (default 0)."""

    def matches(self, value: Any, message: Any) -> bool:
        return super().matches(value, message) and value.get("id", 1) % 2 == 0

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        async for event in super().filter_shared_stream(shared_stream):
            await asyncio.sleep(DELAY)
            yield event


orders = Asset("orders",
               watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(**COMMON))])
on_orders = Dag("on_orders", schedule=orders)
if os.environ.get("REPLAY_LATE") == "1":
    late = Asset("late", watchers=[AssetWatcher("all", trigger=EvenIds(**COMMON))])
    on_late = Dag("on_late", schedule=late)
