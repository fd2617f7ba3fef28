"""Definitions of the quiet-stop test: a filter whose client turns a cancellation into an error.

Many client libraries answer a cancelled call with their own exception
("connection closed"); this filter does the same when the triggerer stops
it. Importing ``filelog_defs`` for its trigger brings its watchers along;
they share the stream and do not matter here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
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
