"""The store as the producers' failure ledger: each raw event's own failures, durably.

A broker that counts deliveries (Pub/Sub, Service Bus, SQS) cannot tell a
message a watcher kept failing on from one that was delivered again
because the process holding it died. The engine counts the first kind in
:class:`StoreFailureLedger` (the ``raw_event_failures`` table, see
``MetadataStore.add_raw_failures``); a producer asks it about a message
the broker delivered too often, so a crash loop never dead-letters a
healthy message (:class:`sharedstream.brokerkit.redelivery.PoisonCheck`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sharedstream.store import MetadataStore

__all__ = ["StoreFailureLedger"]


class StoreFailureLedger:
    """A :class:`~sharedstream.engine.producer.FailureLedger` over the metadata store.

    ``store`` gives the open store at call time; ``db`` runs a store call
    on the store's thread. Both calls raise what the store raises.
    """

    def __init__(self, store: Callable[[], MetadataStore],
                 db: Callable[..., Awaitable[Any]]) -> None:
        self._store = store
        self._db = db

    async def add(self, names: Sequence[str]) -> None:
        """Count one more failure against each name, in one transaction."""
        await self._db(self._store().add_raw_failures, list(names))

    async def counts(self, names: Sequence[str]) -> Mapping[str, int]:
        """The failures counted against those of ``names`` that have any."""
        counted: Mapping[str, int] = await self._db(self._store().raw_failures, list(names))
        return counted
