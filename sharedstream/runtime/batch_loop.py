"""The batch loop: turns batched DAGs' queues into runs (``[scheduler] batch_asset_events``).

Started by the triggerer, beside its triggers, only when some DAG of its
definitions is batched. Every :data:`INTERVAL` seconds it asks the store to
make the due runs (:meth:`~sharedstream.store.MetadataStore.release_batches`,
one transaction on the triggerer's database thread) and tells the dispatcher
of new ones. With several triggerers each runs the loop; the store makes
each run once. A pass that fails is logged and the next one tries again:
the queue keeps everything meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.store import MetadataStore, StoreError

__all__ = ["INTERVAL", "BatchLoop"]

log = key_value_logger("sharedstream.runtime")

INTERVAL = 0.5
"""Seconds between two passes: the latency a batch adds, past its own ``max_wait``."""


class BatchLoop:
    """Makes batched DAGs' runs every :data:`INTERVAL` seconds; ``queued`` counts them."""

    def __init__(self, store: Callable[[], MetadataStore], db: Callable[..., Awaitable[Any]],
                 on_runs: Callable[[list[str]], None], interval: float = INTERVAL) -> None:
        self._store = store
        self._db = db
        self._on_runs = on_runs
        self.interval = interval
        self.queued = 0
        """Runs this loop made."""

    async def run(self) -> None:
        """Pass after pass until cancelled."""
        failing = False
        while True:
            try:
                made: list[str] = await self._db(self._store().release_batches)
            except StoreError as exc:
                if not failing:
                    log.warning("making batched runs failed; trying again", error=str(exc))
                failing = True
            else:
                failing = False
                if made:
                    self.queued += len(made)
                    log.debug("queued batched DAG runs", runs=len(made), first=made[0])
                    self._on_runs(made)
            await asyncio.sleep(self.interval)
