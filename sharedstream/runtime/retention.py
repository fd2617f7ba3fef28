"""``[store] retention``: the triggerer prunes what is done, every so often, in small bites.

:class:`Retention` runs beside the triggers (an owned task): a first pass a
minute after start-up, then one every tenth of the retention period (at
least a minute, at most an hour). A pass calls the store's ``prune`` with
a bounded ``limit`` until nothing is left, pausing between calls, so the
persistence gate's writes - on the same database thread - wait at most for
one small transaction. With several triggerers each prunes; deleting what
another already deleted deletes nothing. A pass that fails is logged and
tried again at the next; nothing else depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.store import MetadataStore, PruneResult, StoreError

__all__ = ["Retention", "prune_all"]

log = key_value_logger("sharedstream.runtime")

BATCH = 1000
"""Rows of each kind one ``prune`` call deletes at most."""


async def prune_all(store: MetadataStore, db: Callable[..., Awaitable[Any]], before: datetime,
                    *, batch: int = BATCH, pause: float = 0.05,
                    progress: Callable[[PruneResult], None] | None = None) -> PruneResult:
    """Prune everything done before ``before``, ``batch`` rows a kind per transaction.

    ``db`` runs a store call on the store's thread; ``progress`` is told the
    running totals after each call. Returns the totals. Raises what the
    store raises (:class:`StoreError`), keeping what earlier calls deleted.
    """
    total = PruneResult()
    while True:
        bite: PruneResult = await db(store.prune, before, batch)
        total = PruneResult(
            dag_runs=total.dag_runs + bite.dag_runs,
            trigger_events=total.trigger_events + bite.trigger_events,
            asset_events=total.asset_events + bite.asset_events,
            dead_letters=total.dead_letters + bite.dead_letters,
            triggerers=total.triggerers + bite.triggerers,
            failure_counts=total.failure_counts + bite.failure_counts,
            replays=total.replays + bite.replays)
        if progress is not None:
            progress(total)
        if not bite.more:
            return total
        await asyncio.sleep(pause)


class Retention:
    """Prunes ``store`` of what is older than ``keep`` (see the module docstring)."""

    def __init__(self, store: Callable[[], MetadataStore], db: Callable[..., Awaitable[Any]],
                 keep: timedelta, *, interval: float | None = None,
                 first_delay: float | None = None) -> None:
        """``interval``/``first_delay``: seconds between passes / before the first (tests)."""
        self._store = store
        self._db = db
        self.keep = keep
        self.interval = interval if interval is not None else min(
            3600.0, max(60.0, keep.total_seconds() / 10))
        self.first_delay = min(60.0, self.interval) if first_delay is None else first_delay

    async def run(self) -> None:
        """Prune now and then until cancelled."""
        await asyncio.sleep(self.first_delay)
        while True:
            before = datetime.now(UTC) - self.keep
            try:
                done = await prune_all(self._store(), self._db, before)
            except StoreError as exc:
                log.warning("pruning the store failed; trying again later", error=str(exc),
                            retry_in_s=self.interval)
            else:
                if done.total():
                    log.info("pruned what is done", before=before.isoformat(timespec="seconds"),
                             dag_runs=done.dag_runs, trigger_events=done.trigger_events,
                             asset_events=done.asset_events, dead_letters=done.dead_letters,
                             triggerers=done.triggerers, failure_counts=done.failure_counts,
                             replays=done.replays)
            await asyncio.sleep(self.interval)
