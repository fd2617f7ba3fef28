"""Definitions for the end-to-end tests of standalone (non-shared) triggers.

``AT`` (env ``STANDALONE_AT``, ISO-8601) is when the built-in
``DateTimeTrigger`` watcher fires; ``SLOW_CLEANUP`` makes every trigger's
``cleanup()`` take that many seconds, to test the second signal.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.temporal import DateTimeTrigger


class EndsEmpty(BaseEventTrigger):
    """A standalone trigger whose run() ends without firing: an error each time."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"label": self.label})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await asyncio.sleep(0.05)
        return
        yield  # type: ignore[unreachable]

    async def cleanup(self) -> None:
        await asyncio.sleep(float(os.environ.get("SLOW_CLEANUP", "0")))


AT = datetime.fromisoformat(os.environ["STANDALONE_AT"])

once = Asset("once", watchers=[AssetWatcher("at", trigger=DateTimeTrigger(AT))])
empty = Asset("empty", watchers=[AssetWatcher("nothing", trigger=EndsEmpty("x"))])
Dag("on_time", schedule=once)
