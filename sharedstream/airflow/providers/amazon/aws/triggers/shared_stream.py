"""Mirror of ``airflow.providers.amazon.aws.triggers.shared_stream``: the provider's SQS watcher.

``from airflow.providers.amazon.aws.triggers.shared_stream import
SqsSharedStreamTrigger`` ports as ``from
sharedstream.airflow.providers.amazon.aws.triggers.shared_stream import
SqsSharedStreamTrigger``, with the provider's constructor, ``serialize``
kwargs, shared-stream key, event payload and filter hook::

    SqsSharedStreamTrigger(sqs_queue="https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                           aws_conn_id="aws_default", visibility_timeout=120)

The shared stream's items are the message bodies (``str``), as the provider
hands them to :meth:`~SqsSharedStreamTrigger.filter_shared_stream`; the
default filter fires ``TriggerEvent(body)`` for every message. Subclass and
override ``filter_shared_stream`` to filter or transform.

Underneath it is :class:`sharedstream.producers.sqs.SqsSharedStreamProducer`
- lanes (a FIFO queue's message group, else the receive batch), batched
deletes, visibility renewal while a message is outstanding, the redelivery
limit for poison messages, the persistence gate - with credentials and
client options from the Airflow connection ``aws_conn_id`` (see
:mod:`sharedstream.airflow.providers.amazon.aws._aws_connection`), looked up
when the stream opens in the triggerer (as the provider's producer does when
it connects), never when the definitions file is loaded or the producer is
built: no secret is in the trigger's kwargs.

Differences from the provider are listed in ``docs/airflow.md``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Hashable
from typing import Any

from sharedstream.airflow.providers._lazy_producer import LazyProducer
from sharedstream.airflow.providers.amazon.aws._aws_connection import client_settings
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.producers import sqs as _ours

__all__ = ["SqsBrokerPayload", "SqsSharedStreamProducer", "SqsSharedStreamTrigger"]

SqsBrokerPayload = _ours.SqsPayload
"""The broker payload: ``receipt_handle`` and ``message_id`` as in the provider.

It is our producer's payload: the group id is on its ``message``
(``message.group_id``), and ``lane`` is the lane it was advanced in.
"""

STREAM_KIND = "sqs-shared-stream"
"""The first element of every shared-stream key of this trigger."""

_PRODUCER_ARGS = ("sqs_queue", "aws_conn_id", "max_messages", "wait_time_seconds",
                  "visibility_timeout", "region_name", "verify", "botocore_config")

_PLACEHOLDER_REGION = "us-east-1"  # only to check the receive settings at construction


def _check(sqs_queue: str, max_messages: int, wait_time_seconds: int,
           visibility_timeout: int) -> None:
    """``SqsConfigError`` (one line) for receive settings no queue accepts."""
    if not isinstance(sqs_queue, str) or not sqs_queue:
        raise _ours.SqsConfigError(f"sqs_queue must be a queue URL, got {sqs_queue!r}")
    _ours.SqsSettings(queue=sqs_queue, region_name=_PLACEHOLDER_REGION,
                      max_messages=max_messages, wait_time_seconds=wait_time_seconds,
                      visibility_timeout=visibility_timeout).validate()


def _producer(*, sqs_queue: str, aws_conn_id: str | None, max_messages: int,
              wait_time_seconds: int, visibility_timeout: int, region_name: str | None,
              verify: bool | str | None, botocore_config: dict[str, Any] | None,
              ) -> _ours.SqsSharedStreamProducer:
    """Our producer, with the client settings of connection ``aws_conn_id`` (read now)."""
    client = client_settings(aws_conn_id=aws_conn_id, sqs_queue=sqs_queue,
                             region_name=region_name, verify=verify,
                             botocore_config=botocore_config)
    return _ours.SqsSharedStreamProducer(_ours.SqsSettings(
        queue=sqs_queue, region_name=client.region_name, endpoint_url=client.endpoint_url,
        credentials=client.credentials, verify=client.verify,
        client_config=client.client_config, max_messages=max_messages,
        wait_time_seconds=wait_time_seconds, visibility_timeout=visibility_timeout,
    ))


class SqsSharedStreamProducer(LazyProducer[_ours.SqsSharedStreamProducer]):
    """Our SQS producer, configured from an Airflow connection, yielding message bodies.

    Built by :meth:`SqsSharedStreamTrigger.create_shared_stream_producer`
    in the triggerer; building it checks the receive settings and reads
    nothing. The stream, when it opens, reads ``aws_conn_id`` (:meth:`resolve`
    does it at once): a missing connection (except ``aws_default``:
    botocore's default chain) or an unusable one is a one-line
    :class:`~sharedstream.connections.ConnectionNotFound` or
    :class:`~sharedstream.connections.InvalidConnection` of that stream's
    poll, restarted with backoff like a queue that cannot be reached, while
    other streams run on. Extras without effect here are named in one
    warning per connection. Everything else - the outcome policy, deletes,
    renewals - is :class:`sharedstream.producers.sqs.SqsSharedStreamProducer`'s.
    """

    def __init__(
        self,
        *,
        sqs_queue: str,
        aws_conn_id: str | None = "aws_default",
        max_messages: int = 10,
        wait_time_seconds: int = 20,
        visibility_timeout: int = 120,
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: dict[str, Any] | None = None,
    ) -> None:
        _check(sqs_queue, max_messages, wait_time_seconds, visibility_timeout)
        super().__init__(
            functools.partial(_producer, sqs_queue=sqs_queue, aws_conn_id=aws_conn_id,
                              max_messages=max_messages, wait_time_seconds=wait_time_seconds,
                              visibility_timeout=visibility_timeout, region_name=region_name,
                              verify=verify, botocore_config=botocore_config),
            attributes={"messaging.system": "aws_sqs",
                        "messaging.destination.name": _ours.queue_name(sqs_queue)},
            together=_ours.SqsSharedStreamProducer.advances_lanes_together)

    def unwrap(self, message: Any) -> Any:
        """The message's body (``str``), as the provider hands it on."""
        return message.body


class SqsSharedStreamTrigger(BaseEventTrigger):
    """Fire for every message of ``sqs_queue``: the provider's shared-stream SQS watcher.

    :param sqs_queue: the queue URL.
    :param aws_conn_id: the Airflow AWS connection (``None``: botocore's
        default chain).
    :param max_messages: messages per receive (1..10).
    :param wait_time_seconds: long-poll wait per receive (0..20).
    :param visibility_timeout: seconds a received message stays hidden; it is
        renewed while subscribers work on it.
    :param region_name: the region, over the connection's.
    :param verify: TLS verification (``False``, or a CA bundle path), over
        the connection's.
    :param botocore_config: botocore ``Config`` options, over the connection's.

    Triggers with the same queue, connection and region share one receiver;
    the first subscriber's other arguments configure it.
    """

    def __init__(
        self,
        *,
        sqs_queue: str,
        aws_conn_id: str | None = "aws_default",
        max_messages: int = 10,
        wait_time_seconds: int = 20,
        visibility_timeout: int = 120,
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        _check(sqs_queue, max_messages, wait_time_seconds, visibility_timeout)
        self.sqs_queue = sqs_queue
        self.aws_conn_id = aws_conn_id
        self.max_messages = max_messages
        self.wait_time_seconds = wait_time_seconds
        self.visibility_timeout = visibility_timeout
        self.region_name = region_name
        self.verify = verify
        self.botocore_config = botocore_config

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``; the classpath names the class, a subclass included."""
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "sqs_queue": self.sqs_queue,
            "aws_conn_id": self.aws_conn_id,
            "max_messages": self.max_messages,
            "wait_time_seconds": self.wait_time_seconds,
            "visibility_timeout": self.visibility_timeout,
            "region_name": self.region_name,
            "verify": self.verify,
            "botocore_config": self.botocore_config,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: this trigger runs on its shared stream only."""
        raise NotImplementedError(f"{type(self).__qualname__} runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def shared_stream_name(self) -> str:
        """``sqs orders-queue``: the queue's name (of a URL, its last segment; sharedstream's)."""
        return f"sqs {_ours.queue_name(self.sqs_queue)}"

    def shared_stream_key(self) -> Hashable:
        """``("sqs-shared-stream", sqs_queue, aws_conn_id, region_name)``, as the provider's."""
        return (STREAM_KIND, self.sqs_queue, self.aws_conn_id, self.region_name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs; reads the connection.

        Only the provider's arguments are taken, so a subclass may add its own kwargs.
        """
        return SqsSharedStreamProducer(**{name: kwargs[name] for name in _PRODUCER_ARGS
                                          if name in kwargs})

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Fire ``TriggerEvent(body)`` per message; override to filter or transform."""
        async for body in shared_stream:
            yield TriggerEvent(body)
