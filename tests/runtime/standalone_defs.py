"""Definitions for the end-to-end tests of standalone (non-shared) triggers.

``AT`` (env ``STANDALONE_AT``, ISO-8601) is when the built-in
``DateTimeTrigger`` watcher fires; ``SLOW_CLEANUP`` makes every trigger's
``cleanup()`` take that many seconds, to test the second signal;
``RUN_SECONDS`` is how long its ``run()`` lasts before it ends empty (0.05 s),
and ``RUN_MARK`` names a file each run creates as it begins. With
``STANDALONE_DELTA`` (seconds) a ``TimeDeltaTrigger`` watcher feeds DAG
``after_delay`` too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.temporal import DateTimeTrigger, TimeDeltaTrigger


class EndsEmpty(BaseEventTrigger):
    """A standalone trigger whose run() ends without firing: an error each time."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"label": self.label})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        mark = os.environ.get("RUN_MARK")
        if mark:  # the test waits for a run to be under way before it signals
            Path(mark).touch()  # noqa: ASYNC240 - a test marker, microseconds
        await asyncio.sleep(float(os.environ.get("RUN_SECONDS", "0.05")))
        return
        yield  # type: ignore[unreachable]

    async def cleanup(self) -> None:
        await asyncio.sleep(float(os.environ.get("SLOW_CLEANUP", "0")))


AT = datetime.fromisoformat(os.environ["STANDALONE_AT"])

once = Asset("once", watchers=[AssetWatcher("at", trigger=DateTimeTrigger(AT))])
empty = Asset("empty", watchers=[AssetWatcher("nothing", trigger=EndsEmpty("x"))])
Dag("on_time", schedule=once)

if os.environ.get("STANDALONE_DELTA"):
    later = Asset("later", watchers=[AssetWatcher("delay", trigger=TimeDeltaTrigger(
        timedelta(seconds=float(os.environ["STANDALONE_DELTA"]))))])
    Dag("after_delay", schedule=later)
