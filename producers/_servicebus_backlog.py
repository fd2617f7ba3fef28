"""Service Bus's backlog of a shared stream: the entity's active and dead-letter counts.

One lane, the entity (``queue`` or ``topic/Subscriptions/subscription``),
with two kinds: ``active`` (messages waiting or locked by a receiver, not
yet settled) and ``dead_letter`` (messages in the entity's dead-letter
sub-queue, ours and the service's own).

Service Bus gives these counts only through its administration API (ATOM
over HTTPS, the SDK's ``ServiceBusAdministrationClient``), not over AMQP.
Each poll opens an administration client with the producer's credentials,
asks ``get_queue_runtime_properties`` or
``get_subscription_runtime_properties`` once, and closes it; reading them
needs the *Manage* claim (a ``RootManageSharedAccessKey``-style policy, or
the Azure Service Bus Data Owner role); a *Listen*-only key is refused, and
the backlog shows as unknown, with the reason logged once.

A development emulator connection (``UseDevelopmentEmulator=true``: the
testing kit's AMQP server, Microsoft's emulator) is not asked: the kit's
server serves no administration API, and the SDK's client always speaks
HTTPS to the namespace's host, so the backlog is reported as not available
(:class:`~sharedstream.engine.errors.BacklogUnavailable`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.errors import BacklogUnavailable
from sharedstream.engine.producer import BrokerBacklog
from sharedstream.producers._servicebus_types import (
    ServiceBusRequestError,
    ServiceBusSettings,
    namespace_credential,
)

__all__ = ["EMULATOR_REASON", "entity_backlog", "runtime_counts", "uses_emulator"]

EMULATOR_REASON = ("not available from this server: a development emulator "
                   "(UseDevelopmentEmulator=true) serves no Service Bus administration API")


def uses_emulator(settings: ServiceBusSettings) -> bool:
    """Whether the connection string says ``UseDevelopmentEmulator=true`` (any case)."""
    text = settings.connection_string or ""
    pairs = (part.split("=", 1) for part in text.split(";") if "=" in part)
    return any(key.strip().lower() == "usedevelopmentemulator" and value.strip().lower() == "true"
               for key, value in pairs)


def runtime_counts(properties: Any) -> dict[str, int]:
    """``active`` and ``dead_letter`` of the SDK's queue or subscription runtime properties.

    A count the service left out is left out (never shown as 0).
    """
    counts = {"active": properties.active_message_count,
              "dead_letter": properties.dead_letter_message_count}
    return {kind: int(n) for kind, n in counts.items() if n is not None}


def _admin_client(settings: ServiceBusSettings, sdk: OptionalSdk) -> tuple[Any, Any]:
    """The SDK's async administration client and an Entra ID credential to close (or ``None``)."""
    admin = sdk("azure.servicebus.aio.management").ServiceBusAdministrationClient
    retry = {"retry_total": settings.retries, "retry_backoff_factor": settings.retry_backoff}
    if settings.connection_string is not None:
        return admin.from_connection_string(settings.connection_string, **retry), None
    credential, identity = namespace_credential(settings, sdk("azure.core.credentials"))
    return admin(settings.namespace_host, credential, **retry), identity


async def entity_backlog(settings: ServiceBusSettings, sdk: OptionalSdk) -> BrokerBacklog:
    """``{entity path: {active, dead_letter}}``, asked once through the administration API.

    Raises :class:`BacklogUnavailable` for an emulator connection and
    :class:`ServiceBusRequestError` (wrapping the SDK's ``AzureError``)
    when the service refuses or does not answer; the caller bounds the
    time.
    """
    if uses_emulator(settings):
        raise BacklogUnavailable(EMULATOR_REASON)
    azure_error = sdk("azure.core.exceptions").AzureError
    client, identity = _admin_client(settings, sdk)
    try:
        async with client:
            if settings.queue is not None:
                properties = await client.get_queue_runtime_properties(settings.queue)
            else:
                properties = await client.get_subscription_runtime_properties(
                    settings.topic, settings.subscription)
    except azure_error as exc:
        raise ServiceBusRequestError(
            f"reading the runtime properties of {settings.entity_path} failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    finally:
        if identity is not None:
            with contextlib.suppress(azure_error):  # closing a token cache; nothing to lose
                await identity.close()
    return {settings.entity_path: runtime_counts(properties)}
