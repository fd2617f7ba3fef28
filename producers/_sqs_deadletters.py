"""SQS: dead-lettering a message, deleting it once its copy is kept somewhere.

Private to :mod:`sharedstream.producers.sqs`. Nothing here imports
aiobotocore: the producer hands in its API call, its dead-letter desk and
its way of deleting a settled message.

Where a dead letter goes, in order: a ``SendMessageBatch`` to the
``dead_letter_queue`` (batches within the call's limits,
:func:`~sharedstream.producers._sqs_types.sized_chunks`); when there is
none, or SQS refuses the copy for good (a sender fault: too big, say), the
engine's ``dead_letter_fallback``; with neither, it is discarded with a
warning (the desk's).

Invariants:

1. A message is deleted only once its copy is kept (sent, kept by the
   fallback, or discarded by configuration): never a loss by deletion.
2. A failure that may pass (SQS unreachable, throttled, a fallback that
   raised) leaves the message where it is: undeleted, it comes again and
   is dead-lettered then. Nothing here raises for one message's failure.
3. A batch SQS refuses as a whole for a sender fault is sent again entry by
   entry, so one entry's fault sends only that entry to the fallback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sharedstream.brokerkit.deadletters import DeadLetterDesk
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.engine.producer import Verdict
from sharedstream.producers._sqs_types import (
    SqsPayload,
    SqsRequestError,
    attribute_bytes,
    dead_letter_entry,
    queue_name,
    sized_chunks,
)

__all__ = ["Disposal", "SqsDeadLetters"]

Disposal = tuple[SqsPayload, str, Sequence[Verdict]]
"""A message to dead-letter, why (``rejected``, ``max_redeliveries``), and who said what."""

_Pair = tuple[Disposal, dict[str, Any]]
"""A disposal and its ``SendMessageBatch`` entry."""


class SqsDeadLetters:
    """Dead-letters one producer's messages (see the module docstring for where they go).

    ``call`` is the producer's SQS call (``call(operation, **parameters)``,
    raising :class:`SqsRequestError`), ``letters`` its dead-letter desk,
    ``delete`` queues the deletion of messages whose copies are kept, and
    ``logger`` is the producer's. Called from the producer's event loop;
    calls may overlap (each works on its own items).
    """

    def __init__(self, *, call: Callable[..., Awaitable[dict[str, Any]]],
                 letters: DeadLetterDesk,
                 delete: Callable[[list[SqsPayload]], Awaitable[None]],
                 logger: KeyValueLogger) -> None:
        self._call, self._letters, self._delete, self._log = call, letters, delete, logger
        self._refusals: dict[str, str] = {}  # message id -> why the DLQ refused it

    async def dispose(self, items: list[Disposal], *, source: str,
                      destination: str | None) -> None:
        """Dead-letter ``items`` of the queue ``source`` (a URL) to ``destination`` (a URL).

        ``destination`` ``None``: no dead-letter queue, the fallback keeps
        them. Returns once every item is deleted (queued for deletion) or
        left to come again; raises only a cancellation.
        """
        if destination is None:
            await self._elsewhere(items, self._letters.unconfigured(), source)
            return
        fifo, queue = destination.endswith(".fifo"), queue_name(source)
        pairs = [(item, dead_letter_entry(str(i), *item, queue=queue, fifo=fifo))
                 for i, item in enumerate(items)]
        for chunk in sized_chunks(pairs):
            await self._send(chunk, source, destination)

    async def _send(self, chunk: list[_Pair], source: str, destination: str) -> None:
        """One SendMessageBatch; a batch SQS refuses as a whole is tried again entry by entry."""
        log = self._log
        try:
            response = await self._call("SendMessageBatch", QueueUrl=destination,
                                        Entries=[entry for _, entry in chunk])
        except SqsRequestError as exc:
            if exc.sender_fault and len(chunk) > 1:  # maybe one entry's fault: find it
                for pair in chunk:
                    await self._send([pair], source, destination)
            elif exc.sender_fault:
                item = chunk[0][0]
                self._refusals[item[0].message_id] = exc.code or "refused"
                await self._elsewhere([item], "the dead_letter_queue refused it", source)
            else:
                log.error("dead-lettering failed; the messages stay and come again",  # noqa: TRY400 - the cause is error=
                          queue=queue_name(source),
                          message_ids=[item[0].message_id for item, _ in chunk], error=exc)
            return
        failed = {f["Id"]: f for f in response.get("Failed") or []}
        stored, refused = [], []
        for item, entry in chunk:
            payload, reason, verdicts = item
            failure = failed.get(entry["Id"])
            if failure is None:
                self._letters.sent(payload.message_id, queue_name(destination), reason,
                                   verdicts)
                stored.append(payload)
            elif failure.get("SenderFault"):
                refused.append(item)
                self._refusals[payload.message_id] = str(failure.get("Code"))
            else:
                log.error("dead-lettering failed; the message stays and comes again",
                          message_id=payload.message_id, error=failure.get("Code"))
        await self._delete(stored)
        if refused:
            await self._elsewhere(refused, "the dead_letter_queue refused it", source)

    async def _elsewhere(self, items: list[Disposal], why: str, source: str) -> None:
        """Keep ``items`` through the fallback (or discard them), then delete them."""
        kept = []
        for payload, reason, verdicts in items:
            message = payload.message
            refusal = self._refusals.pop(payload.message_id, None)
            try:
                await self._letters.keep(
                    source=payload.message_id, reason=reason,
                    cause=f"{why} ({refusal})" if refusal else why, verdicts=verdicts,
                    payload=message.body.encode("utf-8", "surrogatepass"),
                    headers=tuple((name, attribute_bytes(value)) for name, value in
                                  message.raw_attributes.items()),
                    history=f"received {message.receive_count} times",
                )
            except Exception as exc:  # noqa: BLE001 - not kept: the message stays and comes again
                self._log.error("keeping a message in the dead-letter fallback failed; it "
                                "stays and comes again", queue=queue_name(source),
                                message_id=payload.message_id, error=exc)
                continue
            kept.append(payload)
        await self._delete(kept)
