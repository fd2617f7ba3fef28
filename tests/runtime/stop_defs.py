"""Definitions of the quiet-stop tests: filters that end while the triggerer stops.

Many client libraries answer a cancelled call with their own exception
("connection closed"); ``ClosingFileLogTrigger`` does the same when the
triggerer stops it. With ``STOP_FAIL_MARK`` set, ``FailsLateFileLogTrigger``
also watches: on its first order it creates that file, waits
``STOP_FAIL_AFTER`` seconds and raises (a real failure, during the stop).
Importing ``filelog_defs`` for its trigger brings its watchers along; they
share the stream and do not matter here. (A small local file write; a
blocking call in async code is deliberate.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sharedstream import TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher, Dag
from tests.runtime.filelog_defs import FileLogTrigger


class ClosingFileLogTrigger(FileLogTrigger):
    """Fires for every order; a cancellation comes out of it as ``ConnectionResetError``."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        try:
            async for message in shared_stream:
                if isinstance(message, dict) and message.get("kind") in self.kinds:
                    yield TriggerEvent({"id": message["id"]})
        except asyncio.CancelledError as exc:
            raise ConnectionResetError("connection closed") from exc


closing = Asset("closing", watchers=[
    AssetWatcher("closing", trigger=ClosingFileLogTrigger(os.environ["FILELOG_PATH"], ["order"])),
])
Dag("process_closing", schedule=closing)


class FailsLateFileLogTrigger(FileLogTrigger):
    """Raises on its first order, ``STOP_FAIL_AFTER`` seconds after saying so in a file."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            if isinstance(message, dict) and message.get("kind") in self.kinds:
                Path(os.environ["STOP_FAIL_MARK"]).touch()  # noqa: ASYNC240 - a test marker
                await asyncio.sleep(float(os.environ.get("STOP_FAIL_AFTER", "2")))
                raise ValueError(f"cannot handle order {message['id']}")
        yield TriggerEvent({})  # never reached: the filter is a generator


if os.environ.get("STOP_FAIL_MARK"):
    late = Asset("late", watchers=[AssetWatcher("late", trigger=FailsLateFileLogTrigger(
        os.environ["FILELOG_PATH"], ["order"]))])
