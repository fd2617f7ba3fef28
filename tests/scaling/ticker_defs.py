"""Definitions for the scale-out tests of standalone triggers: two tickers, one DAG.

A :class:`Ticker` is a standalone trigger that fires forever, every
``TICK`` seconds, an event saying which process fired it and when; what
the store keeps shows which triggerer ran it at each moment.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher, Dag

TICK = 0.1


class Ticker(BaseEventTrigger):
    """Fires ``{"label", "pid", "n", "at"}`` every ``TICK`` seconds, never ending."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"label": self.label})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        n = 0
        while True:
            yield TriggerEvent({"label": self.label, "pid": os.getpid(), "n": n,
                                "at": time.time()})
            n += 1
            await asyncio.sleep(TICK)


first = Asset("ticks_a", watchers=[AssetWatcher("a", trigger=Ticker("a"))])
second = Asset("ticks_b", watchers=[AssetWatcher("b", trigger=Ticker("b"))])
# TICKER_RUN: a JSON command line each on_tick run runs (the dispatch scale-out test)
Dag("on_tick", schedule=first, run=json.loads(os.environ.get("TICKER_RUN") or "null"))
