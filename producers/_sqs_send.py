"""Sending to an SQS queue with ``aiobotocore`` (``sharedstream send --broker sqs``).

Where to connect is the SQS trigger's: the queue (a URL, or a name looked
up with ``GetQueueUrl``), ``endpoint_url``, ``region_name`` and the keys of
an ``aws`` connection (``conn_id``, read by
:func:`~sharedstream.triggers.sqs.sqs_settings_from_connection`), through
the producer's own client (:func:`~sharedstream.producers.sqs.sqs_client`).
Each message is one ``SendMessageBatch`` entry (10 and 256 KiB a call at
most, the producer's chunking): the body as text (SQS bodies are text, so
a body that is not UTF-8 is refused before anything is sent), the
properties as ``String`` message attributes. On a FIFO queue (a name
ending in ``.fifo``) the ``key`` is the ``MessageGroupId`` (required
there) and the deduplication id is ``dedup_id`` as given (SQS keeps the
first message of an id within its five-minute window and drops the
others), else a digest of the body, as SQS's content-based deduplication
makes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any, ClassVar

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.brokerkit.sending import OutgoingMessage, SendConnectError, SendFailed
from sharedstream.connections.settings import resolve_inline
from sharedstream.producers._sqs_client import sqs_client
from sharedstream.producers._sqs_types import (
    SqsConfigError,
    SqsSettings,
    queue_name,
    sdk_error,
    sized_chunks,
)
from sharedstream.triggers.sqs import DEFAULT_REGION, sqs_settings_from_connection

__all__ = ["SqsSender"]

_sdk = OptionalSdk(broker="SQS", package="aiobotocore", extra="sqs", error=SqsConfigError,
                   user="sending to SQS")


class SqsSender:
    """Messages to one queue, with ``SendMessageBatch``."""

    broker: ClassVar[str] = "sqs"
    options: ClassVar[frozenset[str]] = frozenset(
        {"queue", "group_id", "dedup_id", "endpoint_url", "region", "conn_id"})
    key_option: ClassVar[str | None] = "group_id"
    batch_size: ClassVar[int] = 100

    def __init__(self, settings: SqsSettings) -> None:
        """Send to ``settings.queue`` with its endpoint, region and keys (no I/O yet)."""
        _sdk()
        self.settings = settings
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._url = settings.queue

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SqsSender:
        """``queue`` (required), ``endpoint_url``, ``region`` and/or ``conn_id``."""
        if not options.get("queue"):
            raise SqsConfigError("sending to SQS needs --queue (a queue URL or name)")
        inline = {"endpoint_url": options.get("endpoint_url"),
                  "region_name": options.get("region"), "conn_id": options.get("conn_id")}
        found = resolve_inline(inline, sqs_settings_from_connection, mappings=("credentials",))
        settings = SqsSettings(
            queue=options["queue"], region_name=found.get("region_name") or DEFAULT_REGION,
            endpoint_url=found.get("endpoint_url"),
            credentials=dict(found.get("credentials") or {}), verify=found.get("verify"),
            client_config=dict(found.get("client_config") or {}), retries=2)
        settings.validate()
        return cls(settings)

    @property
    def destination(self) -> str:
        """``sqs queue <name>``."""
        return f"sqs queue {queue_name(self.settings.queue)}"

    def _address(self) -> str:
        return self.settings.endpoint_url or f"SQS in {self.settings.region_name}"

    @property
    def fifo(self) -> bool:
        """Whether the queue is a FIFO queue (its name ends in ``.fifo``)."""
        return queue_name(self.settings.queue).endswith(".fifo")

    async def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        exceptions = _sdk("botocore.exceptions")
        try:
            response: dict[str, Any] = await getattr(self._client, method)(**kwargs)
        except exceptions.EndpointConnectionError as exc:
            raise SendConnectError(f"cannot reach {self._address()} ({exc})") from exc
        except (exceptions.ClientError, exceptions.BotoCoreError) as exc:
            raise sdk_error(f"{method} on {queue_name(self.settings.queue)}", exc,
                            exceptions) from exc
        return response

    async def open(self) -> None:
        """Open the client and find the queue's URL (which checks that the queue exists)."""
        self._client = await self._stack.enter_async_context(sqs_client(self.settings))
        if not self._url.startswith(("http://", "https://")):
            self._url = str((await self._call("get_queue_url", QueueName=self._url))["QueueUrl"])
        else:
            await self._call("get_queue_attributes", QueueUrl=self._url,
                             AttributeNames=["QueueArn"])

    def _entry(self, index: int, message: OutgoingMessage) -> dict[str, Any]:
        try:
            body = message.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SqsConfigError(f"an SQS message body must be UTF-8 text ({exc.reason} at "
                                 f"byte {exc.start})") from exc
        entry: dict[str, Any] = {"Id": str(index), "MessageBody": body}
        if message.properties:
            entry["MessageAttributes"] = {
                name: {"DataType": "String", "StringValue": value}
                for name, value in message.properties}
        if self.fifo:
            if message.key is None:
                raise SqsConfigError(f"{self.destination} is a FIFO queue: give --group-id")
            dedup = message.dedup_id or hashlib.sha256(message.body).hexdigest()
            entry |= {"MessageGroupId": message.key, "MessageDeduplicationId": dedup}
        elif message.key is not None or message.dedup_id is not None:
            raise SqsConfigError(f"--group-id and --dedup-id are for FIFO queues; "
                                 f"{self.destination} is a standard queue")
        return entry

    async def send(self, batch: Sequence[OutgoingMessage]) -> None:
        """Send ``batch`` in ``SendMessageBatch`` calls, in order; any failed entry raises."""
        pairs = [(message, self._entry(index, message)) for index, message in enumerate(batch)]
        for chunk in sized_chunks(pairs):
            response = await self._call("send_message_batch", QueueUrl=self._url,
                                        Entries=[entry for _, entry in chunk])
            failed = response.get("Failed") or []
            if failed:
                first = failed[0]
                raise SendFailed(f"SQS did not take {len(failed)} message(s) for "
                                 f"{self.destination}: {first.get('Code')} "
                                 f"{first.get('Message') or ''}".strip())

    async def close(self) -> None:
        """Close the client; idempotent."""
        self._client = None
        await self._stack.aclose()
