"""The Service Bus producer's broker backlog: n/a on an emulator, the admin API's counts elsewhere.

The kit's AMQP server (and Microsoft's emulator) serve no administration
API, so an emulator connection is never asked and reports ``n/a``. What the
real service answers is mapped from the SDK's own runtime-properties
objects, and the SDK's administration client is driven for real against an
address where nothing listens, to show its failure comes back as this
module's error naming the entity (and so as ``unknown``, not as 0).
"""

from __future__ import annotations

import pytest

from sharedstream.engine.errors import BacklogUnavailable
from sharedstream.producers._servicebus_backlog import (
    EMULATOR_REASON,
    runtime_counts,
    uses_emulator,
)
from sharedstream.producers.servicebus import (
    ServiceBusRequestError,
    ServiceBusSettings,
    ServiceBusSharedStreamProducer,
)

pytest.importorskip("azure.servicebus")
models = pytest.importorskip("azure.servicebus.management._models")
generated = pytest.importorskip("azure.servicebus.management._generated.models")

EMULATOR = ("Endpoint=sb://127.0.0.1:5672/;SharedAccessKeyName=k;SharedAccessKey=v;"
            "UseDevelopmentEmulator=true;")
NOWHERE = "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=v"


async def test_an_emulator_connection_is_not_asked_and_says_why() -> None:
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string=EMULATOR, queue="orders"))
    with pytest.raises(BacklogUnavailable) as raised:
        await producer.broker_backlog()
    assert str(raised.value) == EMULATOR_REASON
    assert "not available from this server" in EMULATOR_REASON


def test_the_emulator_flag_is_read_in_any_case_and_only_when_true() -> None:
    def settings(text: str) -> ServiceBusSettings:
        return ServiceBusSettings(connection_string=text, queue="q")
    lower = EMULATOR.replace("UseDevelopmentEmulator", "usedevelopmentemulator")
    assert uses_emulator(settings(lower))
    assert not uses_emulator(settings(NOWHERE))
    assert not uses_emulator(settings(NOWHERE + ";UseDevelopmentEmulator=false"))
    assert not uses_emulator(ServiceBusSettings(
        namespace="orders.servicebus.windows.net",
        credential={"shared_access_key_name": "k", "shared_access_key": "v"}, queue="q"))


def test_the_sdks_runtime_properties_map_to_active_and_dead_letter() -> None:
    details = generated.MessageCountDetails(active_message_count=7, dead_letter_message_count=2,
                                            scheduled_message_count=4)
    queue = models.QueueRuntimeProperties._from_internal_entity(
        "orders", generated.QueueDescription(message_count_details=details))
    assert runtime_counts(queue) == {"active": 7, "dead_letter": 2}
    subscription = models.SubscriptionRuntimeProperties._from_internal_entity(
        "audit", generated.SubscriptionDescription(message_count_details=details))
    assert runtime_counts(subscription) == {"active": 7, "dead_letter": 2}
    partial = generated.MessageCountDetails(active_message_count=1)
    left_out = models.QueueRuntimeProperties._from_internal_entity(
        "orders", generated.QueueDescription(message_count_details=partial))
    assert runtime_counts(left_out) == {"active": 1}  # never a 0 the service did not say


@pytest.mark.parametrize("entity", [{"queue": "orders"},
                                    {"topic": "events", "subscription": "audit"}])
async def test_the_admin_client_failing_is_this_modules_error_naming_the_entity(
    entity: dict[str, str],
) -> None:
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string=NOWHERE, retries=0, **entity))  # type: ignore[arg-type]
    with pytest.raises(ServiceBusRequestError) as raised:
        await producer.broker_backlog()
    assert str(raised.value).startswith(
        f"reading the runtime properties of {producer.settings.entity_path} failed: ")
    assert "SharedAccessKey" not in str(raised.value)
