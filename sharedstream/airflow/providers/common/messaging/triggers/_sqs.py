"""``MessageQueueTrigger(scheme="sqs")``: ``SqsSensorTrigger``'s arguments on a shared stream.

Airflow's Amazon provider serves ``scheme="sqs"`` with ``SqsSensorTrigger``,
one receiver per trigger, firing ``{"status": "success", "message_batch":
[...]}`` for the messages one receive returned (after its filter) and
deleting them. :class:`SqsMessageQueueTrigger` takes the same arguments and
fires the same payload with a batch of one message per event, on the Amazon
provider mirror's producer (connection ``aws_conn_id`` read when the stream
opens; visibility renewal, batched deletes, the persistence gate). Every
such trigger with the same queue, connection and region shares one receiver.

Invariants: a message is deleted only once every watcher of the stream has
resolved it and the events it fired are stored; a message a watcher's
filter skips is resolved for that watcher, so a message no watcher matches
is deleted (Airflow's filter leaves it in the queue, to come back after its
visibility timeout).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Any

from sharedstream.airflow.providers.amazon.aws.triggers.shared_stream import (
    SqsSharedStreamProducer,
)
from sharedstream.airflow.providers.common.messaging.triggers.msg_queue import (
    MessageQueueTrigger,
    check_arguments,
)
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.sqs import SqsMessage

__all__ = ["SqsMessageQueueTrigger", "message_dict"]

STREAM_KIND = "sqs-message-queue"
"""The first element of every shared-stream key of this trigger."""

OWNER = "SqsSensorTrigger"

DEFAULTS: Mapping[str, Any] = {
    "sqs_queue": None, "aws_conn_id": "aws_default", "max_messages": 5, "num_batches": 1,
    "wait_time_seconds": 1, "visibility_timeout": None, "message_filtering": None,
    "message_filtering_match_values": None, "message_filtering_config": None,
    "delete_message_on_reception": True, "waiter_delay": 60, "region_name": None,
    "verify": None, "botocore_config": None,
}
"""``SqsSensorTrigger``'s arguments and defaults (Amazon provider 9.39)."""

DEFAULT_VISIBILITY_TIMEOUT = 120
"""Seconds a received message stays hidden when ``visibility_timeout`` is ``None``
(the queue's own default would do in Airflow; here it is renewed while watchers work)."""


class _WholeMessages(SqsSharedStreamProducer):
    """The Amazon provider mirror's producer, handing on whole messages (not only bodies)."""

    def unwrap(self, message: Any) -> Any:
        return message


def message_dict(message: SqsMessage) -> dict[str, Any]:
    """A message as ``SqsSensorTrigger``'s ``message_batch`` holds it, less its receipt handle.

    ``MessageId``, ``Body``, ``MD5OfBody`` and ``Attributes`` (the system
    attributes). The receipt handle is left out: the message is deleted by
    the time anyone reads the event, and a redelivery's handle differs.
    Message attributes are left out too (their binary values have no JSON form).
    """
    return {
        "MessageId": message.message_id,
        "Body": message.body,
        "MD5OfBody": hashlib.md5(message.body.encode(), usedforsecurity=False).hexdigest(),
        "Attributes": dict(message.system_attributes),
    }


class SqsMessageQueueTrigger(MessageQueueTrigger):
    """Fire for each message of ``sqs_queue`` its filter keeps (scheme ``sqs``).

    Arguments are ``SqsSensorTrigger``'s. Used: ``sqs_queue``,
    ``aws_conn_id``, ``max_messages`` (per receive, 1..10),
    ``wait_time_seconds`` (long poll, 0..20), ``visibility_timeout``
    (``None``: 120 s, renewed while watchers work), ``region_name``,
    ``verify``, ``botocore_config``, and ``message_filtering`` ``None`` (every
    message) or ``"literal"`` (the body is one of
    ``message_filtering_match_values``). Accepted without effect:
    ``num_batches``, ``waiter_delay`` (the receiver never sleeps),
    ``message_filtering_config``. Refused: ``message_filtering`` ``"jsonpath"``
    or ``"jsonpath-ext"`` (subclass and override ``filter_shared_stream``
    instead) and ``delete_message_on_reception`` false (messages are deleted
    once their events are stored).

    Each event's payload is ``{"status": "success", "message_batch":
    [message]}`` with the message as :func:`message_dict` gives it.
    """

    scheme = "sqs"

    def broker_arguments(self, uri: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``SqsSensorTrigger``'s arguments; a URI is the queue URL when none is given."""
        given = dict(kwargs)
        if uri is not None and given.get("sqs_queue") is None:
            given["sqs_queue"] = uri
        merged = check_arguments(OWNER, given, DEFAULTS, required=("sqs_queue",))
        if merged["delete_message_on_reception"] is not True:
            raise ValueError("MessageQueueTrigger: delete_message_on_reception must be true "
                             "here: messages are deleted once their events are stored")
        if merged["message_filtering"] not in {None, "literal"}:
            raise ValueError(f"MessageQueueTrigger: message_filtering="
                             f"{merged['message_filtering']!r} is not supported here (None or "
                             "'literal'); subclass and override filter_shared_stream instead")
        if merged["message_filtering"] == "literal" and merged[
                "message_filtering_match_values"] is None:
            raise ValueError("MessageQueueTrigger: message_filtering='literal' needs "
                             "message_filtering_match_values")
        self._producer(merged)  # checks the receive settings, reading nothing
        return merged

    @staticmethod
    def _producer(kwargs: Mapping[str, Any]) -> _WholeMessages:
        visibility = kwargs["visibility_timeout"]
        return _WholeMessages(
            sqs_queue=kwargs["sqs_queue"], aws_conn_id=kwargs["aws_conn_id"],
            max_messages=kwargs["max_messages"], wait_time_seconds=kwargs["wait_time_seconds"],
            visibility_timeout=DEFAULT_VISIBILITY_TIMEOUT if visibility is None else visibility,
            region_name=kwargs["region_name"], verify=kwargs["verify"],
            botocore_config=kwargs["botocore_config"])

    def shared_stream_key(self) -> Hashable:
        """``("sqs-message-queue", sqs_queue, aws_conn_id, region_name)``."""
        return (STREAM_KIND, self.kwargs["sqs_queue"], self.kwargs["aws_conn_id"],
                self.kwargs["region_name"])

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs; reads nothing yet."""
        return cls._producer({**DEFAULTS, **kwargs})

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Fire ``{"status": "success", "message_batch": [message]}`` per message kept."""
        literal = self.kwargs["message_filtering"] == "literal"
        values = self.kwargs["message_filtering_match_values"]
        async for message in shared_stream:
            if literal and message.body not in values:
                continue
            yield TriggerEvent({"status": "success", "message_batch": [message_dict(message)]})
