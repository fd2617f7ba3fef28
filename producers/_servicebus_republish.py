"""Service Bus: dead letters kept in the store, sent again to the entity (``republish``).

The Service Bus producer dead-letters into the entity's own dead-letter
sub-queue, which takes every message, so it keeps nothing in the store
itself; a letter kept there by other means (a runtime of another version,
a tool writing ``add_dead_letter``) follows the shape the other brokers use:
``payload`` the body, ``headers`` the application properties as
``(name, bytes)`` pairs, ``source`` naming the original message.

What :meth:`ServiceBusSharedStreamProducer.republish
<sharedstream.producers.servicebus.ServiceBusSharedStreamProducer.republish>`
does, on a client of its own (closed before it returns):

* the destination is the queue the producer receives from, or for a topic
  subscription the topic: the copy then reaches *every* subscription of the
  topic whose rule takes it, not only this one;
* each letter becomes one new message (a new sequence number), sent in the
  given order in batches as large as the link allows, with the kept payload
  as its data body. Each header becomes a text application property; the
  SDK sends no binary ones (it decodes bytes as UTF-8), so a value that is
  not UTF-8 refuses the call before anything is sent. Of a name kept twice
  the last value counts;
* the ``message_id`` is a digest of the letter's source and payload, so an
  entity with duplicate detection drops a copy re-driven again within its
  detection window; elsewhere a second call sends second copies;
* on a session entity (``sessions=True``) the session is
  :data:`REDRIVE_SESSION` (the original's is not kept): the copies keep their
  order among themselves and hold back no original session;
* the batches are all made before the first is sent, so a letter too large
  for a message refuses the call with nothing sent; a send that fails after
  the SDK's retries raises, the batches before it sent.

:func:`dead_letter_message` rebuilds the message a kept letter was, for a
replay of a watcher's dead letters (``dead_letter_event``): its sequence
number from ``source`` (so its raw event name is the live one), the body,
and the application properties as received text (or bytes when not
UTF-8). What a letter does not keep is absent: the enqueued time (so the
rebuilt message has no fingerprint and the store matches its events by name
alone), message id, session, delivery count, and the properties' types (a
number comes back as its text).

Nothing here imports azure-servicebus: the producer hands its client factory
and SDK loader in.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.errors import BrokerRequestError
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._servicebus_received import property_value
from sharedstream.producers._servicebus_types import (
    ServiceBusMessage,
    ServiceBusProducerError,
    ServiceBusRequestError,
    ServiceBusSettings,
    sdk_error,
)

__all__ = ["REDRIVE_SESSION", "ServiceBusRepublishError", "dead_letter_message",
           "redrive_message_fields", "republish_messages"]

log = key_value_logger("sharedstream.producers.servicebus")

_T = TypeVar("_T")

REDRIVE_SESSION = "sharedstream-redrive"
"""The session id of messages re-driven to a session entity."""

Close = Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]]
"""The producer's bounded close of one SDK handle: ``(what, close)``."""


def dead_letter_message(entity: str, letter: DeadLetter) -> ServiceBusMessage | None:
    """The :class:`ServiceBusMessage` ``letter`` was (see the module docstring), or ``None``.

    ``letter.source`` is the message's sequence number (``"17"``, what the
    producer's dead-letter path names a message by) or
    ``"<entity>/<sequence number>"``; anything else, or another entity's
    name, is ``None``: not a message of ``entity``.
    """
    where, _, number = letter.source.rpartition("/")
    if (where and where != entity) or not number.isdigit():
        return None
    return ServiceBusMessage(
        entity, sequence_number=int(number), body=letter.payload,
        properties={name: property_value(value) for name, value in letter.headers})


class ServiceBusRepublishError(ServiceBusProducerError, BrokerRequestError):
    """Sending dead letters again failed, or a letter cannot be sent as kept.

    ``retryable`` is ``False`` when a letter itself was refused (nothing was
    sent).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def redrive_message_fields(letter: DeadLetter, *, sessions: bool) -> dict[str, Any]:
    """The ``ServiceBusMessage`` keyword arguments of ``letter``'s copy.

    Raises :class:`ServiceBusRepublishError` when a header is not UTF-8: the
    SDK sends every bytes property as text (it decodes it), so a binary one
    cannot be sent as kept.
    """
    digest = hashlib.sha256(letter.source.encode("utf-8", "surrogatepass") + b"\0"
                            + letter.payload)
    fields: dict[str, Any] = {"body": letter.payload, "message_id": digest.hexdigest()}
    if letter.headers:
        try:
            properties = {name: value.decode("utf-8") for name, value in letter.headers}
        except UnicodeDecodeError as exc:
            raise ServiceBusRepublishError(
                f"dead letter {letter.source!r}: a header value is not UTF-8 text, which the "
                "SDK cannot send as an application property; nothing was sent",
                retryable=False) from exc
        fields["application_properties"] = properties
    if sessions:
        fields["session_id"] = REDRIVE_SESSION
    return fields


async def republish_messages(
    letters: Sequence[DeadLetter], *, settings: ServiceBusSettings,
    connect: Callable[[], tuple[Any, Any]], close: Close, calls: BrokerCalls, sdk: OptionalSdk,
) -> None:
    """Send ``letters`` again to the entity; see the module docstring.

    ``connect()`` makes the client and, for Entra ID, the credential to
    close with it; ``close`` is the producer's bounded close. Raises
    :class:`ServiceBusRepublishError` for a letter refused (a binary header
    before connecting, one too large before sending) or a failed send;
    ``ServiceBusConfigError`` for a missing entity or a refused credential.
    """
    if not letters:
        return
    servicebus = sdk("azure.servicebus")
    exceptions = sdk("azure.servicebus.exceptions")
    destination = settings.queue if settings.queue is not None else str(settings.topic)
    messages = [servicebus.ServiceBusMessage(**redrive_message_fields(
        letter, sessions=settings.sessions)) for letter in letters]

    async def call(operation: str, request: Callable[[], Awaitable[_T]]) -> _T:
        if operation != "CreateBatch":  # made on the open link: no request to Service Bus
            calls.count(operation)
        try:
            return await request()
        except exceptions.ServiceBusError as exc:
            error = sdk_error(f"{operation} to {destination}", exc)
            if isinstance(error, ServiceBusRequestError):
                raise ServiceBusRepublishError(str(error)) from exc
            raise error from exc

    client, identity = connect()
    try:
        sender = (client.get_queue_sender(queue_name=settings.queue)
                  if settings.queue is not None else
                  client.get_topic_sender(topic_name=settings.topic))
        try:
            await call("OpenSender", sender.__aenter__)
            for batch in await _batches(sender, messages, letters, call,
                                        exceptions.MessageSizeExceededError):
                await call("Send", functools.partial(sender.send_messages, batch))
        finally:
            await close("sender", sender.close)
    finally:
        await close("client", client.close)
        if identity is not None:
            await identity.close()
    log.info("re-drove dead letters", destination=destination, count=len(messages))


async def _batches(sender: Any, messages: list[Any], letters: Sequence[DeadLetter],
                   call: Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]],
                   too_large: type[Exception]) -> list[Any]:
    """``messages`` in order, in batches as full as the link allows; nothing is sent yet.

    Raises :class:`ServiceBusRepublishError` when a message does not fit an
    empty batch.
    """
    batches = [await call("CreateBatch", sender.create_message_batch)]
    for message, letter in zip(messages, letters, strict=True):
        for fresh in (False, True):
            if fresh:
                batches.append(await call("CreateBatch", sender.create_message_batch))
            try:
                batches[-1].add_message(message)
                break
            except too_large:  # the batch is full, or the message too big for any
                if not len(batches[-1]):
                    raise ServiceBusRepublishError(
                        f"dead letter {letter.source!r} is too large for a Service Bus message "
                        f"({len(letter.payload)} bytes); nothing was sent",
                        retryable=False) from None
    return batches
