"""Definitions for the trigger-queue test: three tickers, in queues ``team-a``, ``team-b`` and none.

Written as Airflow 3.4 code routes triggers: ``BaseEventTrigger(queue=...)``
in the constructor (team a) and the class attribute ``queue`` (team b).
Each event names the process that fired it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from sharedstream.airflow.sdk import Asset, AssetWatcher
from sharedstream.airflow.triggers.base import BaseEventTrigger, TriggerEvent

TICK = 0.1


class QueuedTicker(BaseEventTrigger):
    """Fires ``{"label", "pid", "at"}`` every ``TICK`` seconds, never ending."""

    def __init__(self, label: str, queue: str | None = None) -> None:
        super().__init__(queue=queue)
        self.label = label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"label": self.label})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            yield TriggerEvent({"label": self.label, "pid": os.getpid(), "at": time.time()})
            await asyncio.sleep(TICK)


class TeamBTicker(QueuedTicker):
    """A ticker of team b's queue, by class attribute."""

    queue = "team-b"


Asset("ticks_a", watchers=[AssetWatcher("a", trigger=QueuedTicker("a", queue="team-a"))])
Asset("ticks_b", watchers=[AssetWatcher("b", trigger=TeamBTicker("b"))])
Asset("ticks_c", watchers=[AssetWatcher("c", trigger=QueuedTicker("c"))])
