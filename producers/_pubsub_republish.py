"""Pub/Sub: dead letters kept in the store, published again to the subscription's topic.

What :meth:`PubSubSharedStreamProducer.republish
<sharedstream.producers.pubsub.PubSubSharedStreamProducer.republish>` does, on
clients of its own (closed before it returns):

* the topic is the one the subscription is attached to, read with
  ``GetSubscription`` (a subscription whose topic was deleted refuses the
  call). Publishing there reaches *every* subscription of the topic whose
  filter takes the message, not only this one: they all get the copy;
* each letter becomes one new message (a new message id), published in the
  given order in ``Publish`` calls of up to 1,000 messages and 9 MB, with the
  kept payload as its data and the kept headers as its attributes (Pub/Sub
  attributes are text: a value that is not UTF-8 refuses the call before
  anything is published; of a name kept twice the last value counts);
* no ordering key: the producer does not keep it. On a subscription with
  message ordering the copies are delivered without an order of their own;
* a ``Publish`` that fails for a reason that may pass is retried per the
  retry policy (a retried call may have been published already: a
  duplicate), then raises; the calls before it are published.

Nothing here imports google-cloud-pubsub: the producer hands its client
factory and SDK loader in.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.errors import BrokerRequestError
from sharedstream.brokerkit.retry import retrying
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._pubsub_types import (
    PUBLISH_BATCH,
    PubSubConfigError,
    PubSubProducerError,
    PubSubRequestError,
    PubSubSettings,
    sdk_error,
    transient,
)

__all__ = ["PubSubRepublishError", "republish_messages"]

log = key_value_logger("sharedstream.producers.pubsub")

_T = TypeVar("_T")
_CALL_TIMEOUT = 30.0
_PUBLISH_BYTES = 9 * 1024 * 1024
"""Data and attributes per Publish call at most (the service takes 10 MB a request)."""
_DELETED_TOPIC = "_deleted-topic_"
"""What ``GetSubscription`` says of a subscription whose topic was deleted."""


class PubSubRepublishError(PubSubProducerError, BrokerRequestError):
    """Publishing dead letters again failed, or a letter cannot be a Pub/Sub message.

    ``retryable`` is ``False`` when the letters or the subscription
    themselves were refused (nothing was published).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def _attributes(letter: DeadLetter) -> dict[str, str]:
    try:
        return {name: value.decode("utf-8") for name, value in letter.headers}
    except UnicodeDecodeError as exc:
        raise PubSubRepublishError(
            f"dead letter {letter.source!r}: a header value is not UTF-8 text, which a Pub/Sub "
            "attribute cannot carry; nothing was published", retryable=False) from exc


_Message = tuple[bytes, dict[str, str]]
"""A message's data and attributes."""


def _chunks(messages: list[_Message]) -> list[list[_Message]]:
    """``messages`` in Publish calls of at most 1,000 messages and :data:`_PUBLISH_BYTES`."""
    chunks: list[list[_Message]] = []
    size = 0
    for data, attributes in messages:
        grow = len(data) + sum(len(k.encode()) + len(v.encode()) for k, v in attributes.items())
        if not chunks or len(chunks[-1]) >= PUBLISH_BATCH or size + grow > _PUBLISH_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append((data, attributes))
        size += grow
    return chunks


async def republish_messages(
    letters: Sequence[DeadLetter], *, settings: PubSubSettings,
    clients: Callable[[], tuple[Any, Any]], calls: BrokerCalls, sdk: OptionalSdk,
) -> None:
    """Publish ``letters`` again to the subscription's topic; see the module docstring.

    ``clients()`` makes a subscriber and a publisher (closed here). Raises
    :class:`PubSubRepublishError` for a refused letter (before connecting),
    a subscription without a topic, or a failed ``Publish``;
    :class:`~sharedstream.producers.pubsub.PubSubConfigError` for no such
    subscription or topic, or no permission.
    """
    messages = [(letter.payload, _attributes(letter)) for letter in letters]
    if not messages:
        return
    exceptions = sdk("google.api_core.exceptions")
    types = sdk("google.pubsub_v1.types")
    subscription = settings.subscription_path

    async def call(operation: str, where: str, request: Callable[[], Awaitable[_T]]) -> _T:
        async def attempt() -> _T:
            calls.count(operation)
            return await request()

        try:
            return await retrying(f"{operation} on {where}", attempt,
                                  policy=settings.retry_policy(),
                                  catch=exceptions.GoogleAPICallError, transient=transient,
                                  wrap=PubSubRequestError)
        except PubSubRequestError as exc:
            cause = exc.__cause__
            if not isinstance(cause, exceptions.GoogleAPICallError) or transient(cause):
                raise PubSubRepublishError(str(exc)) from cause  # the retries are spent
            error = sdk_error(f"{operation} on {where}", cause, exceptions)
            if isinstance(error, PubSubConfigError):
                raise error from cause  # no such subscription or topic, no permission
            raise PubSubRepublishError(str(error), retryable=False) from cause

    subscriber, publisher = clients()
    try:
        found = await call("GetSubscription", subscription, functools.partial(
            subscriber.get_subscription, subscription=subscription, retry=None,
            timeout=_CALL_TIMEOUT))
        topic = str(found.topic)
        if not topic or topic == _DELETED_TOPIC:
            raise PubSubRepublishError(f"subscription {subscription} has no topic any more "
                                       "(it was deleted): nowhere to publish", retryable=False)
        for chunk in _chunks(messages):
            batch = [types.PubsubMessage(data=data, attributes=attributes)
                     for data, attributes in chunk]
            await call("Publish", topic, functools.partial(
                publisher.publish, topic=topic, messages=batch, retry=None,
                timeout=_CALL_TIMEOUT))
    finally:
        for client in (subscriber, publisher):
            await client.transport.close()
    log.info("re-drove dead letters", subscription=subscription, topic=topic,
             count=len(messages))
