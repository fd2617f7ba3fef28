"""Sending to an Azure Service Bus queue or topic (``sharedstream send --broker servicebus``).

Where to connect is the Service Bus trigger's: a connection string, or an
``azure_service_bus`` connection (``conn_id``, read by
:func:`~sharedstream.triggers.servicebus.servicebus_settings_from_connection`:
a connection string, or a namespace with a key, a SAS token or Microsoft
Entra ID), through the producer's client
(:func:`~sharedstream.producers.servicebus.open_client`). A batch is one
``send_messages`` call: each message's properties become its application
properties and its ``key`` its session id (required by a queue with
sessions). The sender runs without the SDK's keep-alive pinger (closing
would wait for it), as the demo's clients do. A missing queue or topic
(Service Bus refuses its token with 404) and a refused key are
configuration errors (:func:`~sharedstream.producers._servicebus_types.sdk_error`):
one line, exit 2.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.brokerkit.sending import OutgoingMessage, SendConnectError, SendFailed
from sharedstream.connections.settings import resolve_inline
from sharedstream.producers._servicebus_types import (
    ServiceBusConfigError,
    ServiceBusSettings,
    open_client,
    sdk_error,
)
from sharedstream.triggers.servicebus import servicebus_settings_from_connection

__all__ = ["ServiceBusSender"]

_sdk = OptionalSdk(broker="Service Bus", package="azure.servicebus", extra="servicebus",
                   error=ServiceBusConfigError, user="sending to Service Bus")


class ServiceBusSender:
    """Messages to one queue or topic, through one SDK sender."""

    broker: ClassVar[str] = "servicebus"
    options: ClassVar[frozenset[str]] = frozenset(
        {"queue", "topic", "session_id", "connection_string", "conn_id"})
    key_option: ClassVar[str | None] = "session_id"
    batch_size: ClassVar[int] = 200
    send_timeout: float = 30.0
    """Seconds opening the sender, or one batch, may take: the SDK's own ``timeout`` does
    not bound a transfer that is never settled (the kit's server leaves a message without
    a session id for a queue with sessions so; Service Bus refuses it)."""

    def __init__(self, settings: ServiceBusSettings) -> None:
        """Send to ``settings.queue`` (or ``.topic``) of its namespace; no I/O yet."""
        _sdk()
        self.settings = settings
        self._client: Any = None
        self._identity: Any = None
        self._sender: Any = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ServiceBusSender:
        """``queue`` or ``topic``, and ``connection_string`` or ``conn_id``."""
        if bool(options.get("queue")) == bool(options.get("topic")):
            raise ServiceBusConfigError("sending to Service Bus needs --queue or --topic "
                                        "(one of them)")
        inline = {"connection_string": options.get("connection_string"),
                  "conn_id": options.get("conn_id")}
        found = resolve_inline(inline, servicebus_settings_from_connection,
                               mappings=("credential",))
        if not found.get("connection_string") and not found.get("namespace"):
            raise ServiceBusConfigError("sending to Service Bus needs --connection-string "
                                        "(or --conn-id naming a connection)")
        settings = ServiceBusSettings(
            connection_string=found.get("connection_string"),
            namespace=None if found.get("connection_string") else found.get("namespace"),
            credential=found.get("credential") or None,
            queue=options.get("queue"), topic=options.get("topic"), retries=2)
        return cls(settings)

    @property
    def destination(self) -> str:
        """``servicebus queue <name>`` or ``servicebus topic <name>``."""
        s = self.settings
        return f"servicebus queue {s.queue}" if s.queue else f"servicebus topic {s.topic}"

    async def open(self) -> None:
        """Make the client and open the sender (the link: the namespace must answer)."""
        aio = _sdk("azure.servicebus.aio")
        errors = _sdk("azure.servicebus.exceptions")
        self._client, self._identity = open_client(self.settings, aio,
                                                   _sdk("azure.core.credentials"))
        s = self.settings
        self._sender = (self._client.get_queue_sender(queue_name=s.queue, keep_alive=None)
                        if s.queue else
                        self._client.get_topic_sender(topic_name=s.topic, keep_alive=None))
        try:
            async with asyncio.timeout(self.send_timeout):
                await self._sender.__aenter__()
        except TimeoutError as exc:
            raise SendConnectError(f"Service Bus at {s.namespace_host} did not open a sender "
                                   f"to {self.destination} within {self.send_timeout:g} s") from exc
        except errors.ServiceBusConnectionError as exc:
            raise SendConnectError(f"cannot reach Service Bus at {s.namespace_host} "
                                   f"({type(exc).__name__})") from exc
        except errors.ServiceBusError as exc:
            meaning = sdk_error(f"opening a sender to {self.destination}", exc)
            if isinstance(meaning, ServiceBusConfigError):  # a missing entity, a refused key
                raise meaning from exc
            raise SendFailed(f"cannot open a sender to {self.destination}: "
                             f"{str(exc).splitlines()[0]}") from exc

    async def send(self, batch: Sequence[OutgoingMessage]) -> None:
        """Send ``batch`` in one call.

        Ends at once if the task was cancelled during the call even where
        the SDK lost the cancellation (seen 1 in 5 on Python 3.11: the call
        returns; a loop of batches would go on).
        """
        servicebus = _sdk("azure.servicebus")
        errors = _sdk("azure.servicebus.exceptions")
        messages = [servicebus.ServiceBusMessage(
                        message.body, application_properties=dict(message.properties) or None,
                        session_id=message.key)
                    for message in batch]
        hint = "" if any(m.key for m in batch) else " (a queue with sessions needs --session-id)"
        try:
            async with asyncio.timeout(self.send_timeout):
                await self._sender.send_messages(messages)
        except TimeoutError as exc:
            raise SendFailed(f"Service Bus did not acknowledge the messages for "
                             f"{self.destination} within {self.send_timeout:g} s{hint}") from exc
        except errors.ServiceBusError as exc:
            raise SendFailed(f"Service Bus did not take the messages for {self.destination}: "
                             f"{str(exc).splitlines()[0]}"
                             f"{hint if 'session' in str(exc).lower() else ''}") from exc
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError

    async def close(self) -> None:
        """Close the sender, the client and a credential it made; idempotent."""
        for handle in (self._sender, self._client, self._identity):
            if handle is not None:
                await handle.close()
        self._sender = self._client = self._identity = None
