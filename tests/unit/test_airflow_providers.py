"""The provider-compatible Kafka and SQS triggers, without a broker: shapes and connections.

What a definitions file written for Airflow's providers relies on - the
constructor's defaults, ``serialize``, the shared-stream key, the default
filter's payloads - and how a connection becomes our producer's settings:
confluent-kafka keys honoured, refused (one line) or ignored (one warning),
AWS login/password/extra with the trigger's arguments winning. Connections
come from ``AIRFLOW_CONN_*`` variables set with ``monkeypatch``; building a
producer connects to nothing.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sharedstream.airflow.providers.amazon.aws import _aws_connection
from sharedstream.airflow.providers.amazon.aws.triggers import shared_stream as sqs_mirror
from sharedstream.airflow.providers.apache.kafka.triggers import shared_stream as kafka_mirror
from sharedstream.connections import ConnectionNotFound, InvalidConnection
from sharedstream.engine.events import TriggerEvent
from sharedstream.producers.kafka import KafkaConfigError
from sharedstream.producers.sqs import SqsConfigError
from tests.log_lines import fields_of, text_of

pytest.importorskip("aiokafka")
pytest.importorskip("aiobotocore")

BASE = {"bootstrap.servers": "b1:9092,b2:9092", "group.id": "orders",
        "enable.auto.commit": False}


async def collect(filter_stream: AsyncIterator[TriggerEvent]) -> list[Any]:
    return [event.payload async for event in filter_stream]


async def items(*values: Any) -> AsyncIterator[Any]:
    for value in values:
        yield value


# -- Kafka: the trigger ----------------------------------------------------------------------


def test_kafka_trigger_has_the_providers_defaults_serialize_and_key() -> None:
    trigger = kafka_mirror.KafkaSharedStreamTrigger(topics=["b", "a"])
    classpath, kwargs = trigger.serialize()
    assert classpath == ("sharedstream.airflow.providers.apache.kafka.triggers.shared_stream."
                         "KafkaSharedStreamTrigger")
    assert kwargs == {"topics": ["a", "b"], "kafka_config_id": "kafka_default",
                      "poll_timeout": 1.0, "dlq_topic": None}
    assert trigger.shared_stream_key() == ("kafka-shared-stream", ("a", "b"), "kafka_default")
    assert kafka_mirror.KafkaSharedStreamTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_a_kafka_subclass_serializes_under_its_own_classpath() -> None:
    class Mine(kafka_mirror.KafkaSharedStreamTrigger):
        pass

    classpath, _ = Mine(topics=["a"]).serialize()
    assert classpath.endswith(".Mine")


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"topics": []}, "topics must be a non-empty list"),
    ({"topics": "orders"}, "topics must be a non-empty list"),
    ({"topics": ["a"], "poll_timeout": 0}, "poll_timeout must be a positive"),
    ({"topics": ["a"], "dlq_topic": "a"}, "dlq_topic must not be one of the consumed topics"),
])
def test_kafka_trigger_refuses_arguments_no_stream_can_run_with(
    kwargs: dict[str, Any], problem: str,
) -> None:
    with pytest.raises(KafkaConfigError, match=problem):
        kafka_mirror.KafkaSharedStreamTrigger(**kwargs)


async def test_kafka_default_filter_fires_decoded_values_and_passes_others_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trigger = kafka_mirror.KafkaSharedStreamTrigger(topics=["a"])
    stream = items(b"caf\xc3\xa9", None, b"\xff", b"{}")
    assert await collect(trigger.filter_shared_stream(stream)) == ["café", None, "{}"]
    # Not UTF-8: rejected (outside an ack-mode window, rejecting only warns).
    assert "outside an ack-mode binding window" in caplog.text


async def test_kafka_run_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="shared stream only"):
        await anext(kafka_mirror.KafkaSharedStreamTrigger(topics=["a"]).run())


# -- Kafka: the connection -------------------------------------------------------------------


def set_kafka(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: dict[str, Any]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       json.dumps({"conn_type": "kafka", "extra": extra}))


def test_confluent_keys_reach_our_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    set_kafka(monkeypatch, "kafka_map", {
        **BASE, "client.id": "me", "auto.offset.reset": "largest",
        "session.timeout.ms": "6000", "isolation.level": "read_committed",
        "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "u", "sasl.password": "p",
        "ssl.endpoint.identification.algorithm": "none",
    })
    producer = kafka_mirror.KafkaSharedStreamProducer(
        topics=["a"], kafka_config_id="kafka_map").resolve()
    consumer = producer.consumer_config()
    assert {name: consumer[name] for name in (
        "bootstrap_servers", "group_id", "client_id", "auto_offset_reset",
        "session_timeout_ms", "isolation_level", "security_protocol", "sasl_mechanism",
        "sasl_plain_username", "sasl_plain_password", "enable_auto_commit")} == {
        "bootstrap_servers": "b1:9092,b2:9092", "group_id": "orders", "client_id": "me",
        "auto_offset_reset": "latest", "session_timeout_ms": 6000,
        "isolation_level": "read_committed", "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u",
        "sasl_plain_password": "p", "enable_auto_commit": False}
    context = consumer["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname is False
    assert producer.dead_letter_config()["ssl_context"] is context


@pytest.mark.parametrize(("extra", "problem"), [
    ({**BASE, "enable.auto.commit": "true"}, "must set enable.auto.commit=false"),
    ({**BASE, "enable.auto.commit": True}, "must set enable.auto.commit=false"),
    ({"group.id": "g"}, "bootstrap.servers is required"),
    ({"bootstrap.servers": "b:1"}, "group.id is required"),
    ({**BASE, "security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p",
      "sasl.kerberos.service.name": "kafka"}, "sasl.kerberos.service.name"),
])
def test_connection_settings_we_refuse_are_one_line_connection_errors(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], problem: str,
) -> None:
    set_kafka(monkeypatch, "kafka_x", extra)
    producer = kafka_mirror.KafkaSharedStreamProducer(topics=["a"], kafka_config_id="kafka_x")
    with pytest.raises(InvalidConnection, match=problem) as raised:
        producer.resolve()
    assert str(raised.value).startswith(
        "invalid connection 'kafka_x' (from environment variable AIRFLOW_CONN_KAFKA_X): ")
    assert "\n" not in str(raised.value)


def test_the_kafka_producer_reads_the_connection_when_its_stream_opens(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    trigger = kafka_mirror.KafkaSharedStreamTrigger(
        topics=["b", "a"], kafka_config_id="kafka_unit", poll_timeout=0.25, dlq_topic="dlq")
    _, kwargs = trigger.serialize()
    # built before the connection exists, as the provider's: nothing is read yet
    producer = kafka_mirror.KafkaSharedStreamTrigger.create_shared_stream_producer(kwargs)
    assert isinstance(producer, kafka_mirror.KafkaSharedStreamProducer)
    assert (producer.connected, producer.messaging_attributes) == (
        None, {"messaging.system": "kafka", "messaging.destination.name": "a,b"})
    set_kafka(monkeypatch, "kafka_unit", {**BASE, "linger.ms": 5})
    with caplog.at_level(logging.WARNING):
        built = producer.resolve()
        kafka_mirror.KafkaSharedStreamProducer(topics=["a", "b"],
                                               kafka_config_id="kafka_unit").resolve()
    assert producer.resolve() is built
    assert producer.messaging_attributes["messaging.consumer.group.name"] == "orders"
    settings = built.settings
    assert (settings.topics, settings.group_id, settings.dead_letter_topic,
            settings.poll_timeout_ms) == (("a", "b"), "orders", "dlq", 250)
    warnings = [r.getMessage() for r in caplog.records if "linger.ms" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per connection, however often it is built


def test_a_missing_kafka_connection_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_NOWHERE", raising=False)
    producer = kafka_mirror.KafkaSharedStreamProducer(topics=["a"],
                                                      kafka_config_id="kafka_nowhere")
    with pytest.raises(ConnectionNotFound, match="kafka_nowhere") as raised:
        producer.resolve()
    assert "\n" not in str(raised.value)


# -- SQS ---------------------------------------------------------------------------------------

QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


def test_sqs_trigger_has_the_providers_defaults_serialize_and_key() -> None:
    trigger = sqs_mirror.SqsSharedStreamTrigger(sqs_queue=QUEUE)
    classpath, kwargs = trigger.serialize()
    assert classpath == ("sharedstream.airflow.providers.amazon.aws.triggers.shared_stream."
                         "SqsSharedStreamTrigger")
    assert kwargs == {"sqs_queue": QUEUE, "aws_conn_id": "aws_default", "max_messages": 10,
                      "wait_time_seconds": 20, "visibility_timeout": 120, "region_name": None,
                      "verify": None, "botocore_config": None}
    assert trigger.shared_stream_key() == ("sqs-shared-stream", QUEUE, "aws_default", None)


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"sqs_queue": ""}, "sqs_queue must be a queue URL"),
    ({"sqs_queue": QUEUE, "max_messages": 11}, "max_messages must be within 1..10"),
    ({"sqs_queue": QUEUE, "wait_time_seconds": 21}, "wait_time_seconds must be within 0..20"),
])
def test_sqs_trigger_refuses_unusable_receive_settings(
    kwargs: dict[str, Any], problem: str,
) -> None:
    with pytest.raises(SqsConfigError, match=problem):
        sqs_mirror.SqsSharedStreamTrigger(**kwargs)


async def test_sqs_default_filter_fires_each_body() -> None:
    trigger = sqs_mirror.SqsSharedStreamTrigger(sqs_queue=QUEUE)
    assert await collect(trigger.filter_shared_stream(items("a", "{}"))) == ["a", "{}"]


def test_aws_connection_fields_and_the_triggers_arguments_over_them() -> None:
    env = {"AIRFLOW_CONN_AWS_UNIT": json.dumps({
        "conn_type": "aws", "login": "AKID", "password": "secret", "extra": {
            "aws_session_token": "tok", "region_name": "eu-west-2", "verify": False,
            "service_config": {"sqs": {"endpoint_url": "http://sqs.local"}},
            "config_kwargs": {"connect_timeout": 3, "read_timeout": 40}, "retries": 2}})}
    client = _aws_connection.client_settings(
        aws_conn_id="aws_unit", sqs_queue=QUEUE, region_name="us-west-1",
        botocore_config={"read_timeout": 50}, environ=env)
    assert client.credentials == {"aws_access_key_id": "AKID",
                                  "aws_secret_access_key": "secret",
                                  "aws_session_token": "tok"}
    assert (client.region_name, client.endpoint_url, client.verify) == (
        "us-west-1", "http://sqs.local", False)
    assert client.client_config == {"connect_timeout": 3, "read_timeout": 50}


def test_without_a_connection_botocores_chain_and_region_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    none = _aws_connection.client_settings(aws_conn_id=None, sqs_queue=QUEUE, environ={})
    assert (none.credentials, none.region_name) == ({}, "eu-west-1")  # the URL's region
    with caplog.at_level(logging.WARNING):
        default = _aws_connection.client_settings(
            aws_conn_id="aws_default", sqs_queue="http://localhost/q",
            environ={"AWS_DEFAULT_REGION": "ap-south-1"})
    assert (default.credentials, default.region_name) == ({}, "ap-south-1")
    [line] = caplog.records
    assert text_of(line).startswith("AWS connection not defined; ")
    assert fields_of(line) == {"conn_id": "aws_default"}
    with pytest.raises(ConnectionNotFound, match="aws_typo"):
        _aws_connection.client_settings(aws_conn_id="aws_typo", sqs_queue=QUEUE, environ={})


@pytest.mark.parametrize(("extra", "problem"), [
    ({"role_arn": "arn:aws:iam::1:role/x"}, "role_arn is not supported"),
    ({"profile_name": "dev"}, "profile_name is not supported"),
])
def test_aws_extras_we_cannot_honour_are_one_line_errors(
    extra: dict[str, Any], problem: str,
) -> None:
    env = {"AIRFLOW_CONN_AWS_X": json.dumps({"conn_type": "aws", "extra": extra})}
    with pytest.raises(InvalidConnection, match=problem):
        _aws_connection.client_settings(aws_conn_id="aws_x", sqs_queue=QUEUE, environ=env)


def test_the_sqs_producer_reads_the_connection_when_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_AWS_UNIT",
                       "aws://AKID:se%2Fcret@/?region_name=eu-central-1"
                       "&endpoint_url=http%3A%2F%2F127.0.0.1%3A5000")
    trigger = sqs_mirror.SqsSharedStreamTrigger(sqs_queue=QUEUE, aws_conn_id="aws_unit",
                                                max_messages=5, visibility_timeout=60)
    _, kwargs = trigger.serialize()
    producer = sqs_mirror.SqsSharedStreamTrigger.create_shared_stream_producer(
        {**kwargs, "added_by_a_subclass": 1})
    assert isinstance(producer, sqs_mirror.SqsSharedStreamProducer)
    settings = producer.resolve().settings
    assert (settings.queue, settings.region_name, settings.endpoint_url, settings.max_messages,
            settings.visibility_timeout) == (QUEUE, "eu-central-1", "http://127.0.0.1:5000", 5, 60)
    assert settings.credentials == {"aws_access_key_id": "AKID",
                                    "aws_secret_access_key": "se/cret"}
