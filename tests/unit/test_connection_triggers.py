"""Broker triggers given ``conn_id``: the per-broker mapping, and when the connection is read.

The mapping is pure (a :class:`Connection` in, settings out), so it is
tested here without brokers; the end-to-end runs are in
``tests/kafka/test_connections_e2e.py`` and ``tests/sqs/test_connections_e2e.py``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.brokerkit.errors import BrokerConfigError
from sharedstream.connections import (
    Connection,
    ConnectionNotFound,
    InvalidConnection,
    parse_connection_uri,
    set_file_connections,
)
from sharedstream.producers.kafka import KafkaConfigError, KafkaSharedStreamProducer
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger, kafka_settings_from_connection
from sharedstream.triggers.pubsub import (
    PubSubSharedStreamTrigger,
    pubsub_settings_from_connection,
)
from sharedstream.triggers.servicebus import (
    ServiceBusSharedStreamTrigger,
    servicebus_settings_from_connection,
)
from sharedstream.triggers.sqs import SqsSharedStreamTrigger, sqs_settings_from_connection
from tests.log_lines import fields_of, text_of

SB_STRING = "Endpoint=sb://orders-ns.servicebus.windows.net/;SharedAccessKeyName=n;SharedAccessKey=k"


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("KAFKA_MAIN", "AWS_MAIN", "GCP_MAIN", "BUS_MAIN", "NOWHERE"):
        monkeypatch.delenv(f"SHAREDSTREAM_CONN_{name}", raising=False)
        monkeypatch.delenv(f"AIRFLOW_CONN_{name}", raising=False)
    set_file_connections({})
    yield
    set_file_connections({})


def kafka_conn(**extra: Any) -> Connection:
    return Connection("kafka_main", "kafka", extra={"bootstrap.servers": "b1:9092,b2:9092",
                                                    "group.id": "g1", **extra}, source="test")


# --- Kafka ------------------------------------------------------------------------------------


def test_kafka_connection_maps_librdkafka_names() -> None:
    found = kafka_settings_from_connection(kafka_conn(**{
        "client.id": "c1", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
        "sasl.username": "u", "sasl.password": "p", "auto.offset.reset": "smallest",
        "session.timeout.ms": "30000", "enable.auto.commit": "false"}))
    assert found == {
        "bootstrap_servers": "b1:9092,b2:9092", "group_id": "g1", "client_id": "c1",
        "security": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                     "sasl_plain_username": "u", "sasl_plain_password": "p"},
        "consumer_overrides": {"session_timeout_ms": 30000, "enable_auto_commit": False,
                               "auto_offset_reset": "earliest"}}


def test_kafka_tuning_without_an_equivalent_is_ignored_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = kafka_conn(**{"statistics.interval.ms": 0, "linger.ms": 5, "check.crcs": "1"})
    for _ in range(2):
        found = kafka_settings_from_connection(conn)
    assert found["consumer_overrides"] == {"check_crcs": True}
    [warning] = [r for r in caplog.records if r.name == "sharedstream.connections"]
    assert text_of(warning) == "connection extra keys have no effect on this broker; ignored"
    assert fields_of(warning) == {"conn_id": "kafka_main", "source": "test",
                                  "keys": ["linger.ms", "statistics.interval.ms"],
                                  "broker": "the Kafka trigger"}


def test_kafka_ssl_settings_become_an_ssl_context(tmp_path: Path) -> None:
    found = kafka_settings_from_connection(kafka_conn(**{
        "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}))
    context = found["security"]["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname is False
    assert found["security"]["security_protocol"] == "SSL"
    with pytest.raises(InvalidConnection, match=r"cannot load its ssl\.\* files") as caught:
        kafka_settings_from_connection(kafka_conn(**{
            "security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p",
            "ssl.ca.location": str(tmp_path / "no")}))
    assert str(tmp_path) not in str(caught.value)


@pytest.mark.parametrize(
    ("conn", "words"),
    [
        (kafka_conn(**{"sasl.oauthbearer.config": "x"}),
         "extra key 'sasl.oauthbearer.config' is not supported by the Kafka trigger"),
        (kafka_conn(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}),
         "sasl.mechanism GSSAPI is not supported"),
        (kafka_conn(**{"security.protocol": "SASL_PLAINTEXT", "sasl.password": "secret-pw"}),
         "SASL_PLAINTEXT with PLAIN needs sasl.username and sasl.password"),
        (kafka_conn(**{"sasl.password": "secret-pw"}), "without security.protocol"),
        (kafka_conn(**{"security.protocol": "SSL", "sasl.username": "u"}),
         "sasl.* settings with security.protocol SSL"),
        (kafka_conn(**{"security.protocol": "TLS"}), "security.protocol must be one of"),
        (parse_connection_uri("k", "kafka://broker:9093"),
         "host is not supported by the Kafka trigger: give extra bootstrap.servers"),
        (Connection("k", "kafka", None, None, "u", "secret-pw"),
         "login is not supported by the Kafka trigger: give extra sasl.username"),
        (Connection("k", "kafka", schema="s"), "the Kafka trigger does not use the connection's "
                                               "schema"),
        (Connection("k", "aws"), "its conn_type is 'aws'; the Kafka trigger takes 'kafka'"),
        (kafka_conn(**{"auto.offset.reset": "middle"}), "auto.offset.reset must be one of"),
        (kafka_conn(**{"session.timeout.ms": "soon"}), "extra session.timeout.ms must be an "
                                                        "integer"),
    ],
)
def test_kafka_refuses_what_it_cannot_honour(conn: Connection, words: str) -> None:
    with pytest.raises(InvalidConnection, match=words) as caught:
        kafka_settings_from_connection(conn)
    assert "secret-pw" not in str(caught.value)
    assert isinstance(caught.value, BrokerConfigError)


def test_kafka_auto_commit_from_a_connection_is_refused_as_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_MAIN", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "b:9092", "group.id": "g",
                                         "enable.auto.commit": True}}))
    trigger = KafkaSharedStreamTrigger(topics=["t"], conn_id="kafka_main")
    with pytest.raises(KafkaConfigError, match="enable_auto_commit=True is refused"):
        KafkaSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])


def test_kafka_trigger_reads_its_connection_only_when_the_producer_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trigger = KafkaSharedStreamTrigger(topics=["orders"], conn_id="kafka_main",
                                       security={"sasl_mechanism": "SCRAM-SHA-256"})
    _, kwargs = trigger.serialize()
    assert kwargs["conn_id"] == "kafka_main"
    assert kwargs["bootstrap_servers"] is None  # nothing from the connection is stored
    with pytest.raises(ConnectionNotFound, match="AIRFLOW_CONN_KAFKA_MAIN"):
        KafkaSharedStreamTrigger.create_shared_stream_producer(kwargs)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_MAIN", kafka_conn().get_uri() + (
        "&security.protocol=SASL_PLAINTEXT&sasl.mechanism=PLAIN&sasl.username=u&"
        "sasl.password=pw"))
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(kwargs)
    assert isinstance(producer, KafkaSharedStreamProducer)
    config = producer.consumer_config()
    assert (config["bootstrap_servers"], config["group_id"]) == ("b1:9092,b2:9092", "g1")
    assert config["sasl_mechanism"] == "SCRAM-SHA-256"  # given inline: it wins
    assert config["sasl_plain_password"] == "pw"  # noqa: S105 - from the connection
    assert "pw" not in json.dumps(kwargs)


def test_kafka_inline_settings_win_over_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAREDSTREAM_CONN_KAFKA_MAIN", kafka_conn().get_uri())
    trigger = KafkaSharedStreamTrigger(topics=["t"], group_id="mine", conn_id="kafka_main")
    settings = trigger.settings()
    assert (settings.group_id, settings.bootstrap_servers) == ("mine", "b1:9092,b2:9092")


def test_kafka_without_servers_or_connection_is_refused_where_declared() -> None:
    with pytest.raises(KafkaConfigError, match="bootstrap_servers is required"):
        KafkaSharedStreamTrigger(topics=["t"], group_id="g")
    with pytest.raises(KafkaConfigError, match="enable_auto_commit=True is refused"):
        KafkaSharedStreamTrigger(topics=["t"], conn_id="kafka_main",
                                 consumer_overrides={"enable_auto_commit": True})


def test_the_conn_id_is_part_of_the_shared_stream_key() -> None:
    one = KafkaSharedStreamTrigger(topics=["t"], conn_id="kafka_main", match={"key": "a"})
    two = KafkaSharedStreamTrigger(topics=["t"], conn_id="kafka_main", match={"key": "b"})
    other = KafkaSharedStreamTrigger(topics=["t"], conn_id="kafka_other")
    inline = KafkaSharedStreamTrigger(topics=["t"], bootstrap_servers="b:9092", group_id="g")
    assert one.shared_stream_key() == two.shared_stream_key()
    assert one.shared_stream_key() != other.shared_stream_key()
    assert "conn_id" not in inline.serialize()[1]  # unchanged kwargs without a connection
    key = one.shared_stream_key()
    assert isinstance(key, tuple)
    assert ("conn_id", "kafka_main") in key


# --- SQS --------------------------------------------------------------------------------------


def test_aws_connection_maps_keys_region_and_endpoint() -> None:
    conn = parse_connection_uri(
        "aws_main", "aws://AKID:s3cr%2Bt@/?region_name=eu-west-1&aws_session_token=tok&"
        "endpoint_url=http%3A%2F%2Flocalhost%3A5000&verify=false")
    assert sqs_settings_from_connection(conn) == {
        "credentials": {"aws_access_key_id": "AKID", "aws_secret_access_key": "s3cr+t",
                        "aws_session_token": "tok"},
        "region_name": "eu-west-1", "endpoint_url": "http://localhost:5000", "verify": False}
    nested = Connection("a", "aws", extra={"service_config": {"sqs": {"endpoint_url": "http://e"}},
                                           "config_kwargs": {"connect_timeout": 5}})
    found = sqs_settings_from_connection(nested)
    assert (found["endpoint_url"], found["client_config"]) == ("http://e", {"connect_timeout": 5})


@pytest.mark.parametrize(
    ("conn", "words"),
    [
        (Connection("a", "aws", extra={"role_arn": "arn:aws:iam::1:role/r"}),
         "role_arn is not supported by the SQS trigger: give keys"),
        (Connection("a", "aws", extra={"profile_name": "dev"}), "profile_name is not supported"),
        (Connection("a", "aws", host="h"), "host is not supported by the SQS trigger: give extra "
                                           "endpoint_url"),
        (Connection("a", "kafka"), "its conn_type is 'kafka'"),
    ],
)
def test_aws_refuses_what_it_cannot_honour(conn: Connection, words: str) -> None:
    with pytest.raises(InvalidConnection, match=words):
        sqs_settings_from_connection(conn)


def test_aws_extras_without_effect_are_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = sqs_settings_from_connection(Connection("a", "aws", extra={"regoin_name": "x"}))
    assert found["region_name"] is None
    [warning] = caplog.records
    assert fields_of(warning)["keys"] == ["regoin_name"]
    assert fields_of(warning)["broker"] == "the SQS trigger"


def test_sqs_region_from_the_connection_and_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = SqsSharedStreamTrigger(queue="q")
    assert plain.serialize()[1]["region_name"] == "us-east-1"  # stored as before
    trigger = SqsSharedStreamTrigger(queue="q", conn_id="aws_main")
    assert trigger.serialize()[1]["region_name"] is None
    monkeypatch.setenv("AIRFLOW_CONN_AWS_MAIN", "aws://")
    assert trigger.settings().region_name == "us-east-1"
    monkeypatch.setenv("AIRFLOW_CONN_AWS_MAIN", "aws://?region_name=eu-north-1")
    assert trigger.settings().region_name == "eu-north-1"
    inline = SqsSharedStreamTrigger(queue="q", region_name="ap-south-1", conn_id="aws_main")
    assert inline.settings().region_name == "ap-south-1"
    assert trigger.shared_stream_key() == SqsSharedStreamTrigger(
        queue="q", conn_id="aws_main", match={"json": {"a": 1}},
        payload_format="json").shared_stream_key()


# --- Pub/Sub and Service Bus ------------------------------------------------------------------


def test_gcp_connection_gives_the_project_and_refuses_key_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = Connection("g", "google_cloud_platform", extra={
        "extra__google_cloud_platform__project": "p1", "num_retries": 5, "scope": ""})
    assert pubsub_settings_from_connection(conn) == {"project": "p1", "emulator_host": None}
    for key in ("key_path", "keyfile_dict", "extra__google_cloud_platform__key_path"):
        with pytest.raises(InvalidConnection, match="Application Default Credentials"):
            pubsub_settings_from_connection(Connection("g", extra={key: "x"}))
    trigger = PubSubSharedStreamTrigger(subscription="s", conn_id="gcp_main")
    monkeypatch.setenv("AIRFLOW_CONN_GCP_MAIN", "google-cloud-platform://?project=p2&"
                       "emulator_host=localhost%3A8085")
    settings = trigger.settings()
    assert (settings.subscription_path, settings.emulator_host) == (
        "projects/p2/subscriptions/s", "localhost:8085")
    conn = Connection("g", "google_cloud_platform", extra={
        "project": "p1", "emulator_host": "localhost:8443", "tls_ca_file": "/etc/test-ca.pem"})
    assert pubsub_settings_from_connection(conn)["tls_ca_file"] == "/etc/test-ca.pem"


def test_service_bus_connection_string_in_schema_or_namespace_in_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_schema = Connection("b", "azure_service_bus", schema=SB_STRING)
    assert servicebus_settings_from_connection(in_schema) == {
        "connection_string": SB_STRING, "namespace": None}
    namespaced = Connection("b", "azure_service_bus", extra={
        "fully_qualified_namespace": "ns.servicebus.windows.net", "sas_token": "sig"})
    assert servicebus_settings_from_connection(namespaced) == {
        "connection_string": None, "namespace": "ns.servicebus.windows.net",
        "credential": {"sas_token": "sig"}}
    with pytest.raises(InvalidConnection, match="AZURE_CLIENT_ID"):
        servicebus_settings_from_connection(Connection("b", extra={
            "managed_identity_client_id": "x"}))
    trigger = ServiceBusSharedStreamTrigger(queue="orders", conn_id="bus_main")
    assert trigger.serialize()[1]["connection_string"] is None
    monkeypatch.setenv("AIRFLOW_CONN_BUS_MAIN", json.dumps(
        {"conn_type": "azure_service_bus", "schema": SB_STRING}))
    assert trigger.settings().identity() == ("orders-ns.servicebus.windows.net", "orders")


def test_every_broker_fails_with_the_one_line_not_found_message() -> None:
    triggers = [
        KafkaSharedStreamTrigger(topics=["t"], conn_id="nowhere"),
        SqsSharedStreamTrigger(queue="q", conn_id="nowhere"),
        PubSubSharedStreamTrigger(subscription="s", conn_id="nowhere"),
        ServiceBusSharedStreamTrigger(queue="q", conn_id="nowhere"),
    ]
    for trigger in triggers:
        with pytest.raises(ConnectionNotFound) as caught:
            type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        assert str(caught.value) == (
            "connection 'nowhere' not found: no environment variable SHAREDSTREAM_CONN_NOWHERE "
            "or AIRFLOW_CONN_NOWHERE, and no [connections.nowhere] table in the config file "
            "(none loaded)")
