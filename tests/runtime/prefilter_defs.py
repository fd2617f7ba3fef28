"""Definitions for the JSON log test: a watcher whose prefilter raises on the second order.

The engine switches the prefilter off and logs one warning (``triggers``,
with the traceback); the filter then gets every raw event. Importing
``filelog_defs`` for its trigger brings its watchers along; they share the
stream and do not matter here.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from tests.runtime.filelog_defs import FileLogTrigger


class RaisingPrefilterTrigger(FileLogTrigger):
    """A FileLogTrigger whose prefilter raises ``LookupError`` on the order with id 1."""

    def shared_stream_prefilter(self) -> Any:
        def accept(raw: Any) -> bool:
            if isinstance(raw, dict) and raw.get("id") == 1:
                raise LookupError("prefilter bug on order 1")
            return True

        return accept


prefiltered = Asset("prefiltered", watchers=[
    AssetWatcher("prefiltered",
                 trigger=RaisingPrefilterTrigger(os.environ["FILELOG_PATH"], ["order"])),
])
Dag("process_prefiltered", schedule=prefiltered)
