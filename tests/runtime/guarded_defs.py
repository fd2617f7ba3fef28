"""Definitions for the shutdown test: a watcher whose filter loop catches ``Exception``.

What the filter saw at the end is appended to ``GUARDED_SEEN`` (one line:
``caught <Error>`` or ``cancelled``), and ``cleanup`` appends ``cleanup``.
Each match is logged structlog-style (``self.log.info("matched", order_id=...)``).
Importing ``filelog_defs`` for its trigger brings its watchers along; they
share the stream and do not matter here. (Small local file writes; blocking
calls in async code are deliberate.)
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

SEEN = Path(os.environ["GUARDED_SEEN"])


def note(line: str) -> None:
    with SEEN.open("a") as handle:
        handle.write(line + "\n")


class GuardedFileLogTrigger(FileLogTrigger):
    """Fires for every order; its loop logs any ``Exception`` and ends, Airflow-style."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        try:
            try:
                async for message in shared_stream:
                    if isinstance(message, dict) and message.get("kind") in self.kinds:
                        self.log.info("matched", order_id=message["id"], kind=message["kind"])
                        yield TriggerEvent({"id": message["id"], "kind": message["kind"]})
            except Exception as exc:  # noqa: BLE001 - the habit under test
                self.log.warning("the stream failed: %s", exc)
                note(f"caught {type(exc).__name__}")
        except asyncio.CancelledError:
            note("cancelled")
            raise

    async def cleanup(self) -> None:
        note("cleanup")


guarded = Asset("guarded", watchers=[
    AssetWatcher("guarded", trigger=GuardedFileLogTrigger(os.environ["FILELOG_PATH"], ["order"])),
])
Dag("process_guarded", schedule=guarded)
