"""Pub/Sub: dead-lettering a message, acking it once its copy is kept somewhere.

Private to :mod:`sharedstream.producers.pubsub`. Nothing here imports
google-cloud-pubsub: the producer hands in its call wrapper, its SDK
loader, its publisher client and its ways of acking and nacking.

Where a dead letter goes, in order: a ``Publish`` to ``dead_letter_topic``
(:data:`~sharedstream.producers._pubsub_types.PUBLISH_BATCH` messages a
call, original data and attributes plus ``sharedstream.*`` ones); when
there is none, or Pub/Sub refuses the copy for good (too big, say), the
engine's ``dead_letter_fallback``; with neither, it is discarded with a
warning (the desk's).

Invariants:

1. A message is acked only once its copy is kept (published, kept by the
   fallback, or discarded by configuration): never a loss by acking.
2. A copy that could not be kept (Pub/Sub unreachable, a fallback that
   raised) nacks the message: it comes again and is dead-lettered then.
3. A batch Pub/Sub refuses for good is published again message by
   message, so one message's fault sends only that one to the fallback.
4. Only a :class:`PubSubConfigError` (no such topic, no permission) is
   raised: the poll ends with that line. A cancellation is raised as is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sharedstream.brokerkit.deadletters import DeadLetterDesk
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.engine.producer import Verdict
from sharedstream.producers._pubsub_types import (
    PUBLISH_BATCH,
    PubSubConfigError,
    PubSubPayload,
    PubSubRequestError,
    dead_letter_attributes,
    transient,
)

__all__ = ["Disposal", "PubSubDeadLetters"]

Disposal = tuple[PubSubPayload, str, Sequence[Verdict]]
"""A message to dead-letter, why (``rejected``, ``max_redeliveries``), and who said what."""

Settle = Callable[[list[PubSubPayload]], Awaitable[None]]
"""Acks or nacks messages (the producer's)."""


class PubSubDeadLetters:
    """Dead-letters one subscription's messages (see the module docstring for where they go).

    ``call(operation, request)`` is the producer's unary call (counted,
    retried, errors wrapped in :class:`PubSubRequestError` or
    :class:`PubSubConfigError`); ``sdk`` its SDK loader; ``ack`` queues the
    acks of messages whose copies are kept, ``nack`` hands messages back;
    ``timeout`` bounds one ``Publish``; ``logger`` is the producer's.
    Called from the producer's event loop.
    """

    def __init__(self, *, call: Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]],
                 sdk: OptionalSdk, letters: DeadLetterDesk, ack: Settle, nack: Settle,
                 timeout: float, logger: KeyValueLogger) -> None:
        self._call, self._sdk, self._letters = call, sdk, letters
        self._ack, self._nack, self._timeout, self._log = ack, nack, timeout, logger

    async def dispose(self, items: list[Disposal], *, topic: str | None,
                      publisher: Any) -> None:
        """Dead-letter ``items`` to ``topic`` (a path) with the ``publisher`` client.

        ``topic`` ``None``: no dead-letter topic, the fallback keeps them.
        Returns once every item is acked (queued) or nacked.
        """
        if topic is None:
            await self._elsewhere(items, self._letters.unconfigured())
            return
        for start in range(0, len(items), PUBLISH_BATCH):
            await self._publish(topic, publisher, items[start:start + PUBLISH_BATCH])

    async def _publish(self, topic: str, publisher: Any, chunk: list[Disposal]) -> None:
        types = self._sdk("google.pubsub_v1.types")
        messages = [types.PubsubMessage(data=payload.message.data,
                                        attributes=dead_letter_attributes(payload, reason, said))
                    for payload, reason, said in chunk]
        try:
            await self._call("Publish", lambda: publisher.publish(
                topic=topic, messages=messages, retry=None, timeout=self._timeout))
        except PubSubConfigError:
            raise  # no such topic, no permission: the poll ends with that line
        except PubSubRequestError as exc:
            cause = exc.__cause__
            if cause is None or (isinstance(cause, Exception) and transient(cause)):
                self._log.error("dead-lettering failed; nacked, they come again",
                                message_ids=[p.message_id for p, _, _ in chunk],
                                destination=topic, error=exc)
                await self._nack([p for p, _, _ in chunk])
            elif len(chunk) > 1:  # refused: perhaps one message's fault; find it
                for item in chunk:
                    await self._publish(topic, publisher, [item])
            else:
                await self._elsewhere(chunk, f"the dead_letter_topic refused it: {exc}")
            return
        for payload, reason, verdicts in chunk:
            self._letters.sent(payload.message_id, topic, reason, verdicts)
        await self._ack([payload for payload, _, _ in chunk])

    async def _elsewhere(self, items: list[Disposal], why: str) -> None:
        """Keep ``items`` through the fallback (or discard them), then ack them."""
        kept, left = [], []
        for payload, reason, verdicts in items:
            message = payload.message
            try:
                await self._letters.keep(
                    source=message.message_id, reason=reason, cause=why, verdicts=verdicts,
                    payload=message.data,
                    headers=tuple((k, v.encode("utf-8", "surrogatepass"))
                                  for k, v in message.attributes.items()),
                    history=f"delivery attempt {message.delivery_attempt or 'unknown'}",
                )
            except Exception as exc:  # noqa: BLE001 - not kept: the message is nacked, comes again
                self._log.error("keeping a message in the dead-letter fallback failed; nacked, "
                                "it comes again", message_id=message.message_id, error=exc)
                left.append(payload)
                continue
            kept.append(payload)
        if left:
            await self._nack(left)
        await self._ack(kept)
