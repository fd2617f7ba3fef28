"""The Service Bus trigger's settings and key, and the dead-letter details: pure logic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sharedstream.engine.producer import Verdict
from sharedstream.producers._servicebus_types import (
    ServiceBusConfigError,
    dead_letter_details,
    namespace_of,
)
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.log_lines import fields_of, text_of

CONNECTION = ("Endpoint=sb://Orders-NS.servicebus.windows.net/;SharedAccessKeyName=listen;"
              "SharedAccessKey=hunter2")


def trigger(**overrides: Any) -> ServiceBusSharedStreamTrigger:
    kwargs: dict[str, Any] = {"connection_string": CONNECTION, "queue": "orders"}
    kwargs.update(overrides)
    return ServiceBusSharedStreamTrigger(**kwargs)


def test_the_namespace_is_read_from_the_connection_string() -> None:
    assert namespace_of(CONNECTION) == "orders-ns.servicebus.windows.net"
    assert namespace_of("Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;"
                        "SharedAccessKey=v;UseDevelopmentEmulator=true;") == "127.0.0.1:5672"


def test_key_holds_consumer_settings_not_filter_settings() -> None:
    plain = trigger()
    assert plain.shared_stream_key() == trigger(payload_format="json",
                                                match={"json": {"a": 1}}).shared_stream_key()
    for change in ({"max_messages": 10}, {"lock_duration": 30}, {"sessions": True},
                   {"queue": "other"}, {"max_redeliveries": 2},
                   {"connection_string": CONNECTION.replace("hunter2", "other")}):
        assert trigger(**change).shared_stream_key() != plain.shared_stream_key(), change


def test_key_and_logs_never_hold_the_key() -> None:
    key = repr(trigger().shared_stream_key())
    assert "hunter2" not in key
    assert "orders-ns.servicebus.windows.net" in key


def test_a_topic_subscription_is_an_entity_path() -> None:
    sub = trigger(queue=None, topic="events", subscription="audit")
    assert sub.settings().entity_path == "events/Subscriptions/audit"
    assert sub.shared_stream_key() != trigger().shared_stream_key()


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"queue": None}, "give either queue or topic (with subscription), not both"),
    ({"topic": "events"}, "give either queue or topic (with subscription), not both"),
    ({"queue": None, "topic": "events"}, "topic and subscription go together"),
    ({"queue": "a/b"}, "queue, topic and subscription are names, without '/'"),
    ({"max_messages": 0}, "max_messages must be within 1..5000"),
    ({"max_messages": True}, "max_messages must be an int, got bool"),
    ({"max_in_flight": 10}, "max_in_flight must be at least max_messages"),
    ({"lock_duration": 1}, "lock_duration must be within 5..300"),
    ({"max_lock_renewal": 10}, "max_lock_renewal must be at least lock_duration"),
    ({"sessions": "yes"}, "sessions must be True or False"),
    ({"max_wait_time": "5"}, "max_wait_time must be a number, got str"),
    ({"connection_string": "SharedAccessKey=x"}, "connection_string has no Endpoint"),
    ({"connection_string": ""}, "connection_string is empty"),
    ({"connection_string": None}, "give either connection_string or namespace"),
    ({"namespace": "orders-ns.servicebus.windows.net"},
     "give either connection_string or namespace"),
    ({"credential": {"sas_token": "t"}}, "credential goes with namespace"),
    ({"connection_string": None, "namespace": "n.servicebus.windows.net",
      "credential": {"password": "hunter2"}}, "credential must be"),
    ({"connection_string": None, "namespace": "n.servicebus.windows.net",
      "credential": {"sas_token": 7}}, "credential must be"),
])
def test_bad_settings_are_refused_with_the_reason(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ServiceBusConfigError, match="^" + problem.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")) as caught:
        trigger(**kwargs)
    assert "hunter2" not in str(caught.value)


def test_a_namespace_with_a_credential_is_the_same_entity_by_name() -> None:
    """Namespace + key: the same identity as a connection string to it; keys never shown."""
    import azure.core.credentials as core  # noqa: PLC0415
    from azure.core.credentials import (  # noqa: PLC0415 - the SDK's own credential types
        AzureNamedKeyCredential,
        AzureSasCredential,
    )

    from sharedstream.producers._servicebus_types import credential_of  # noqa: PLC0415

    keyed = trigger(connection_string=None, namespace="Orders-NS.servicebus.windows.net",
                    credential={"shared_access_key_name": "listen",
                                "shared_access_key": "hunter2"})
    settings = keyed.settings()
    assert settings.identity() == trigger().settings().identity()
    assert "hunter2" not in repr(keyed.shared_stream_key())
    named = credential_of(settings, core)
    assert isinstance(named, AzureNamedKeyCredential)
    assert named.named_key == ("listen", "hunter2")
    sas = trigger(connection_string=None, namespace="orders-ns.servicebus.windows.net",
                  credential={"sas_token": "SharedAccessSignature sr=x"})
    assert isinstance(credential_of(sas.settings(), core), AzureSasCredential)
    entra = trigger(connection_string=None, namespace="orders-ns.servicebus.windows.net")
    assert credential_of(entra.settings(), core) is None  # DefaultAzureCredential at connect
    assert len({t.shared_stream_key() for t in (keyed, sas, entra)}) == 3


def test_serialize_round_trips() -> None:
    original = trigger(topic="events", queue=None, subscription="audit", sessions=True,
                       payload_format="json", match={"properties": {"tenant": "t1"}})
    classpath, kwargs = original.serialize()
    assert classpath == "sharedstream.triggers.servicebus.ServiceBusSharedStreamTrigger"
    again = ServiceBusSharedStreamTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert again.shared_stream_key() == original.shared_stream_key()


def test_dead_letter_details_name_the_outcome_and_the_triggers() -> None:
    verdicts = [Verdict(trigger_id=7, resolution="rejected", reason="bad order")]
    reason, description = dead_letter_details("rejected", verdicts)
    assert reason == "sharedstream.rejected"
    assert "7" in description
    assert "bad order" in description
    reason, description = dead_letter_details("max_redeliveries", [])
    assert (reason, description) == ("sharedstream.max_redeliveries", "max_redeliveries")
    _, long = dead_letter_details("rejected", [Verdict(trigger_id=1, resolution="rejected",
                                                       reason="x" * 5000)])
    assert len(long) == 1024


class _ShutReceiver:
    """A receiver whose handler is gone: every settlement raises, as the SDK's does."""

    async def complete_message(self, message: object) -> None:
        raise ValueError("The handler has already been shutdown. Please use ServiceBusClient "
                         "to create a new instance.")


async def test_failed_completions_are_one_line_and_counted_off_their_session_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After an outage hundreds of completions fail alike: one warning, not one per message."""
    pytest.importorskip("azure.servicebus")
    from sharedstream.producers._servicebus_types import (  # noqa: PLC0415
        ServiceBusMessage,
        ServiceBusPayload,
    )
    from sharedstream.producers.servicebus import (  # noqa: PLC0415
        ServiceBusSharedStreamProducer,
    )

    producer = ServiceBusSharedStreamProducer(trigger(sessions=True).settings())
    receiver = _ShutReceiver()
    producer._open[id(receiver)] = 50
    chunk = [ServiceBusPayload(("session", "s"), ServiceBusMessage(
        "orders", sequence_number=n, body=b""), SimpleNamespace(lock_token=f"t{n}"), receiver)
        for n in range(1, 51)]
    with caplog.at_level("WARNING", logger="sharedstream.producers.servicebus"):
        retry = await producer._settlements.complete(chunk)
    assert retry == []
    [line] = caplog.records
    assert text_of(line).startswith("completing messages did not take; ")
    assert fields_of(line)["entity"] == "orders"
    assert fields_of(line)["count"] == 50
    assert fields_of(line)["sequence_numbers"] == list(range(1, 11))  # the first ten
    assert fields_of(line)["error"].startswith("ValueError: ")
    assert producer._open[id(receiver)] == 0, "each counted off its session once"


def test_entra_id_without_azure_identity_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("azure.servicebus")
    import sys  # noqa: PLC0415

    from sharedstream.producers.servicebus import (  # noqa: PLC0415
        ServiceBusSharedStreamProducer,
    )

    monkeypatch.setitem(sys.modules, "azure.identity.aio", None)
    producer = ServiceBusSharedStreamProducer(trigger(
        connection_string=None, namespace="orders-ns.servicebus.windows.net").settings())
    with pytest.raises(ServiceBusConfigError, match=r"needs azure-identity: pip install"):
        producer._connect()


def test_a_receiver_is_peek_lock_without_prefetch_or_keep_alive() -> None:
    servicebus = pytest.importorskip("azure.servicebus")
    from sharedstream.producers._servicebus_types import receiver_options  # noqa: PLC0415

    plain = receiver_options(trigger().settings(), servicebus, session=False)
    assert plain == {"receive_mode": servicebus.ServiceBusReceiveMode.PEEK_LOCK,
                     "prefetch_count": 0, "keep_alive": None}
    settings = trigger(sessions=True).settings()
    sessions = receiver_options(settings, servicebus, session=True)
    assert sessions == {**plain, "session_id": servicebus.NEXT_AVAILABLE_SESSION,
                        "max_wait_time": settings.max_wait_time}


async def test_a_client_from_a_connection_string_owns_no_credential() -> None:
    pytest.importorskip("azure.servicebus")
    import importlib  # noqa: PLC0415

    from sharedstream.producers._servicebus_types import open_client  # noqa: PLC0415

    aio = importlib.import_module("azure.servicebus.aio")
    client, identity = open_client(trigger().settings(), aio,
                                   importlib.import_module("azure.core.credentials"))
    try:
        assert isinstance(client, aio.ServiceBusClient)
        assert client.fully_qualified_namespace.lower() == "orders-ns.servicebus.windows.net"
        assert identity is None  # nothing for the producer to close but the client
    finally:
        await client.close()
