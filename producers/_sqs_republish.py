"""SQS: dead letters kept in the store, sent again to the queue (``republish``).

What :meth:`SqsSharedStreamProducer.republish
<sharedstream.producers.sqs.SqsSharedStreamProducer.republish>` does, on an
SQS client of its own (the producer's settings, closed before it returns):

* each letter becomes one new message of the producer's queue, sent with
  ``SendMessageBatch`` (10 entries and 1 MiB a call at most), in the given
  order. The body is the kept payload as text: SQS bodies are text, so a
  payload that is not UTF-8 refuses the whole call before anything is sent;
* the kept headers come back as message attributes. The producer keeps an
  attribute's value as bytes, not its type, so a value that is UTF-8 comes
  back as a ``String`` attribute (a ``Number`` too: its digits), any other
  as ``Binary``; of a name kept twice the last value counts;
* on a FIFO queue (its name ends in ``.fifo``) the message group is
  :data:`REDRIVE_GROUP` (the original's group is not kept, being a system
  attribute): re-driven messages keep their order among themselves and hold
  no original group back. The deduplication id is a digest of the letter's
  source and payload, so SQS drops a copy re-driven again within its
  five-minute deduplication window; past it, or on a standard queue, a
  second call sends second copies;
* entries SQS fails for a reason that may pass are sent again per the retry
  policy (after those of their batch that took); an entry it refuses (a
  sender fault), or one still failing, raises :class:`SqsRepublishError`
  naming the letters not sent. The batches before it are sent; the one that
  failed may be partly sent.

:func:`dead_letter_message` rebuilds the message a kept letter was, for a
replay of a watcher's dead letters (``dead_letter_event``): the same message
id, body and attribute values (typed as they come back when re-driven,
above); what the letter does not keep (system attributes: receive count,
sent time, group id) is absent.

Nothing here imports aiobotocore: the producer hands its client factory and
SDK loader in.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.errors import BrokerRequestError
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._sqs_types import (
    OPERATIONS,
    SqsMessage,
    SqsProducerError,
    SqsSettings,
    queue_name,
    sdk_error,
    sized_chunks,
)

__all__ = ["REDRIVE_GROUP", "SqsRepublishError", "dead_letter_message", "redrive_entry",
           "republish_messages"]

log = key_value_logger("sharedstream.producers.sqs")

REDRIVE_GROUP = "sharedstream-redrive"
"""The ``MessageGroupId`` of messages re-driven to a FIFO queue."""

_Call = Callable[..., Awaitable[dict[str, Any]]]


class SqsRepublishError(SqsProducerError, BrokerRequestError):
    """Sending dead letters again failed, or a letter cannot be an SQS message.

    ``retryable`` is ``False`` when SQS (or the check before sending)
    refused a letter itself: sending it again fails the same way.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def _attribute(value: bytes) -> dict[str, Any]:
    try:
        return {"DataType": "String", "StringValue": value.decode("utf-8")}
    except UnicodeDecodeError:
        return {"DataType": "Binary", "BinaryValue": value}


def dead_letter_message(queue: str, letter: DeadLetter) -> SqsMessage | None:
    """The :class:`SqsMessage` ``letter`` was, as a filter received it; ``None``: not text.

    ``letter.source`` is the message id (what the producer's dead-letter
    path keeps), ``queue`` the queue as the settings name it. ``Binary``
    attributes that are UTF-8 come back as ``String`` ones (the letter
    keeps bytes, not types).
    """
    try:
        body = letter.payload.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return SqsMessage(queue, {"MessageId": letter.source, "Body": body,
                              "MessageAttributes": {name: _attribute(value)
                                                    for name, value in letter.headers}})


def redrive_entry(entry_id: str, letter: DeadLetter, *, fifo: bool) -> dict[str, Any]:
    """The ``SendMessageBatch`` entry of ``letter``; raises when its payload is not text."""
    try:
        body = letter.payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SqsRepublishError(
            f"dead letter {letter.source!r}: its body is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}), which an SQS message cannot carry; nothing was sent",
            retryable=False) from exc
    entry: dict[str, Any] = {"Id": entry_id, "MessageBody": body}
    attributes = {name: _attribute(value) for name, value in letter.headers}
    if attributes:
        entry["MessageAttributes"] = attributes
    if fifo:
        digest = hashlib.sha256(letter.source.encode("utf-8", "surrogatepass") + b"\0"
                                + letter.payload)
        entry["MessageGroupId"] = REDRIVE_GROUP
        entry["MessageDeduplicationId"] = digest.hexdigest()
    return entry


def _caller(client: Any, calls: BrokerCalls, exceptions: Any) -> _Call:
    """One SQS call on ``client`` (counted), its SDK errors wrapped as the producer's are."""

    async def call(operation: str, **kwargs: Any) -> dict[str, Any]:
        calls.count(operation)
        try:
            response: dict[str, Any] = await getattr(client, OPERATIONS[operation])(**kwargs)
        except (exceptions.ClientError, exceptions.BotoCoreError) as exc:
            queue = kwargs.get("QueueUrl") or kwargs.get("QueueName")
            raise sdk_error(f"{operation} on {queue}", exc, exceptions) from exc
        return response

    return call


async def republish_messages(
    letters: Sequence[DeadLetter], *, settings: SqsSettings,
    new_client: Callable[[], AbstractAsyncContextManager[Any]], calls: BrokerCalls,
    sdk: OptionalSdk,
) -> None:
    """Send ``letters`` again to ``settings.queue``; see the module docstring.

    Raises :class:`SqsRepublishError` for a letter that cannot be sent
    (before connecting) and for entries SQS failed, and the producer's
    request or configuration error when a call fails (no such queue, SQS
    unreachable after botocore's retries). The client is closed either way.
    """
    fifo = queue_name(settings.queue).endswith(".fifo")
    pairs = [(letter, redrive_entry(str(i), letter, fifo=fifo))
             for i, letter in enumerate(letters)]
    if not pairs:
        return
    exceptions = sdk("botocore.exceptions")
    async with new_client() as client:
        call = _caller(client, calls, exceptions)
        url = settings.queue
        if not url.startswith(("http://", "https://")):
            url = str((await call("GetQueueUrl", QueueName=url))["QueueUrl"])
        for chunk in sized_chunks(pairs):
            await _send(call, url, chunk, settings)
    log.info("re-drove dead letters", queue=queue_name(url), count=len(pairs))


async def _send(call: _Call, url: str, chunk: list[tuple[Any, dict[str, Any]]],
                settings: SqsSettings) -> None:
    """One batch; entries SQS failed for a reason that may pass are sent again (bounded)."""
    delays = settings.retry_policy().delays()
    pending = chunk
    while True:
        response = await call("SendMessageBatch", QueueUrl=url,
                              Entries=[entry for _, entry in pending])
        failed: Mapping[str, Mapping[str, Any]] = {
            f["Id"]: f for f in response.get("Failed") or []}
        if not failed:
            return
        pending = [pair for pair in pending if pair[1]["Id"] in failed]
        refused = any(f.get("SenderFault") for f in failed.values())
        delay = None if refused else next(delays, None)
        if delay is None:
            said = "; ".join(f"{letter.source}: {failed[entry['Id']].get('Code')} "
                             f"{failed[entry['Id']].get('Message') or ''}".strip()
                             for letter, entry in pending)
            raise SqsRepublishError(f"SendMessageBatch to {queue_name(url)} did not take "
                                    f"{len(pending)} dead letter(s): {said}",
                                    retryable=not refused)
        log.warning("re-driving: SQS failed some entries; sending them again",
                    queue=queue_name(url), count=len(pending), delay_s=round(delay, 2))
        await asyncio.sleep(delay)
