"""SQS: changing messages' visibility, in batches of 10, never racing each other.

Private to :mod:`sharedstream.producers.sqs`. Nothing here imports
aiobotocore: the producer hands in its API call and its logger.

A message is named here by its *lease*: its receipt handle and its message
id (the id only for log lines). Visibility changes are of two kinds: the
lease keeper's renewals (``visibility_timeout`` again, while a message is
outstanding) and re-shows (a failed message after its backoff, a bounced
one at once).

Invariants:

1. Renewals and re-shows never race: both run under :attr:`SqsVisibility.lock`
   (the lease keeper holds it for a renewal round, :meth:`~SqsVisibility.show`
   for its calls), so a re-show is never overwritten by a renewal sent
   before it.
2. Nothing here raises for a change that failed: it is logged, and the
   message's current visibility lapses on its own (it comes again at worst
   a ``visibility_timeout`` later). A cancellation is raised as is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sharedstream.brokerkit.batches import in_batches
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._sqs_types import BATCH, SqsPayload, SqsRequestError

__all__ = ["CONCURRENT_BATCHES", "Lease", "SqsVisibility", "leases_of"]

CONCURRENT_BATCHES = 8
"""``ChangeMessageVisibilityBatch`` calls in flight at once at most (renewals, re-shows)."""

Lease = tuple[str, str]
"""A receipt handle and the message id it belongs to."""


def leases_of(payloads: Sequence[SqsPayload]) -> list[Lease]:
    """The leases of ``payloads``, in order."""
    return [(p.receipt_handle, p.message_id) for p in payloads]


class SqsVisibility:
    """Changes the visibility of one queue's messages (see the module docstring).

    ``call`` is the producer's SQS call (``call(operation, **parameters)``,
    raising :class:`SqsRequestError`), ``logger`` the producer's. Called
    from the producer's event loop.
    """

    def __init__(self, *, call: Callable[..., Awaitable[dict[str, Any]]],
                 logger: KeyValueLogger) -> None:
        self._call, self._log = call, logger
        self.lock = asyncio.Lock()
        """Held by every change: the lease keeper's ``guard`` for its renewal rounds."""

    async def show(self, queue_url: str, leases: Sequence[Lease], seconds: int) -> list[Lease]:
        """Set the visibility of ``leases`` to ``seconds``; returns those that took.

        Batches of 10, up to :data:`CONCURRENT_BATCHES` at once, under
        :attr:`lock` (never racing a renewal round).
        """
        async with self.lock:
            done = await in_batches(leases, lambda chunk: self.change(queue_url, chunk, seconds),
                                    size=BATCH, concurrency=CONCURRENT_BATCHES)
        return [lease for chunk in done for lease in chunk]

    async def change(self, queue_url: str, chunk: Sequence[Lease], seconds: int) -> list[Lease]:
        """One ``ChangeMessageVisibilityBatch`` of up to 10; returns the leases SQS changed.

        The caller holds :attr:`lock` (:meth:`show`, the lease keeper).
        """
        entries = [{"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                   for i, (handle, _) in enumerate(chunk)]
        try:
            response = await self._call("ChangeMessageVisibilityBatch",
                                        QueueUrl=queue_url, Entries=entries)
        except SqsRequestError as exc:
            self._log.warning("changing visibility failed; it lapses on its own",
                              message_ids=[message_id for _, message_id in chunk], error=exc)
            return []
        refused = {f["Id"]: f.get("Code") for f in response.get("Failed") or []}
        done = []
        for i, lease in enumerate(chunk):
            if str(i) in refused:
                self._log.info("visibility not changed", message_id=lease[1],
                               error=refused[str(i)])
            else:
                done.append(lease)
        return done
