"""``sharedstream send``: the real CLI puts messages on real brokers; their SDKs read them back.

Each broker's test sends through the command (a subprocess, as a user runs
it) with what that broker carries beside a body - Kafka key and headers,
SQS attributes and FIFO group, Pub/Sub attributes and ordering key, Service
Bus application properties and session - and reads the messages back with
the broker's own SDK. The sources (``--value``, a JSON-lines file, stdin),
a connection from the config file, and the one-line errors (exit 2 for
usage, 1 for an unreachable broker) are checked on Kafka, the quickest.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.cli import main
from sharedstream.testing.fixtures import (
    moto_endpoint,
    pubsub_emulator_host,
    servicebus_connection_string,
    tansu_bootstrap,
)
from tests.cli import run_sharedstream

__all__ = ["moto_endpoint", "pubsub_emulator_host", "servicebus_connection_string",
           "tansu_bootstrap"]

ORDERS = [{"id": 1, "amount": 20}, {"id": 2, "amount": 250}, {"id": 3, "amount": 5}]
BODIES = [json.dumps(order) for order in ORDERS]
SB_QUEUE, SB_SESSION_QUEUE = "send-plain", "send-sessions"
AWS_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


@pytest.fixture(scope="session")
def servicebus_entities() -> Mapping[str, Any]:
    """A plain queue and a queue with sessions for the Service Bus test."""
    return {"queues": [{"name": SB_QUEUE}, {"name": SB_SESSION_QUEUE, "requires_session": True}]}


def _values() -> list[str]:
    return [arg for body in BODIES for arg in ("--value", body)]


def _ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr
    return str(result.stdout)


def _one_line_error(result: Any, status: int) -> str:
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sharedstream: error: "), lines
    return str(lines[0])


# -- Kafka ---------------------------------------------------------------------------------


async def _kafka_records(bootstrap: str, topic: str, count: int) -> list[Any]:
    aiokafka: Any = pytest.importorskip("aiokafka")
    consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                         auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        records: list[Any] = []
        async with asyncio.timeout(20):
            while len(records) < count:
                batches = await consumer.getmany(timeout_ms=500)
                records += [r for batch in batches.values() for r in batch]
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


async def test_kafka_values_with_key_and_headers(tansu_bootstrap: str, tmp_path: Path) -> None:
    topic = f"send-{uuid.uuid4().hex[:8]}"
    out = _ok(run_sharedstream(
        "send", "--broker", "kafka", "--bootstrap-servers", tansu_bootstrap, "--topic", topic,
        *_values(), "--key", "eu", "--header", "source=cli", "--header", "note=a=b",
        cwd=tmp_path))
    assert out == f"sent 3 messages to kafka topic {topic}\n"
    records = await _kafka_records(tansu_bootstrap, topic, 3)
    assert [r.value.decode() for r in records] == BODIES  # one key: one partition, in order
    assert {r.key for r in records} == {b"eu"}
    assert [list(r.headers) for r in records] == [[("source", b"cli"), ("note", b"a=b")]] * 3


async def test_kafka_file_and_stdin_through_a_config_connection(
        tansu_bootstrap: str, tmp_path: Path) -> None:
    config = tmp_path / "sharedstream.toml"
    config.write_text("[connections.local_kafka]\nconn_type = \"kafka\"\n"
                      f"extra = {{ \"bootstrap.servers\" = \"{tansu_bootstrap}\" }}\n")
    topic = f"send-{uuid.uuid4().hex[:8]}"
    lines = tmp_path / "orders.jsonl"
    lines.write_text(BODIES[0] + "\n\n" + BODIES[1] + "\r\n")  # a blank line is skipped
    common = ("send", "--broker", "kafka", "--conn-id", "local_kafka", "--topic", topic,
              "--key", "k")
    assert _ok(run_sharedstream(*common, "--file", str(lines), cwd=tmp_path)) == (
        f"sent 2 messages to kafka topic {topic}\n")
    assert _ok(run_sharedstream(*common, "--file", "-", stdin=BODIES[2] + "\n",
                                cwd=tmp_path)) == f"sent 1 message to kafka topic {topic}\n"
    records = await _kafka_records(tansu_bootstrap, topic, 3)
    assert [r.value.decode() for r in records] == BODIES


def test_unreachable_kafka_is_one_line_naming_the_address(tmp_path: Path) -> None:
    result = run_sharedstream("send", "--broker", "kafka", "--bootstrap-servers",
                              "127.0.0.1:1", "--topic", "t", "--value", "x", cwd=tmp_path)
    assert "cannot reach Kafka at 127.0.0.1:1" in _one_line_error(result, 1)


@pytest.mark.parametrize(("args", "said"), [
    (("--header", "no-equals-sign"), "expected NAME=VALUE"),
    (("--header", "=value"), "expected NAME=VALUE"),
    (("--session-id", "s"), "--session-id does not apply to --broker kafka"),
    (("--file", "missing.jsonl"), "--file missing.jsonl: No such file"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...],
                                               said: str) -> None:
    value = () if "--file" in args else ("--value", "x")
    result = run_sharedstream("send", "--broker", "kafka", "--topic", "t", *value, *args,
                              cwd=tmp_path)
    assert said in _one_line_error(result, 2)


def test_a_missing_sdk_names_the_extra_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for module in ("aiokafka", "aiobotocore", "google.pubsub_v1", "azure.servicebus"):
        monkeypatch.setitem(sys.modules, module, None)  # imports of it raise ImportError
    for broker, extra in (("kafka", "kafka"), ("sqs", "sqs"), ("pubsub", "pubsub"),
                          ("servicebus", "servicebus")):
        where = {"kafka": ["--topic", "t"], "sqs": ["--queue", "q"],
                 "pubsub": ["--topic", "t", "--project", "p"],
                 "servicebus": ["--queue", "q", "--connection-string", "Endpoint=sb://x/;"]}
        assert main(["send", "--broker", broker, *where[broker], "--value", "x"]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1, error
        assert f"pip install 'sharedstream[{extra}]'" in error, error


# -- SQS -----------------------------------------------------------------------------------


async def test_sqs_attributes_and_fifo_group(moto_endpoint: str, tmp_path: Path) -> None:
    session: Any = pytest.importorskip("aiobotocore.session").get_session()
    name = f"send-{uuid.uuid4().hex[:8]}"
    async with session.create_client(
            "sqs", region_name="us-east-1", endpoint_url=moto_endpoint,
            aws_access_key_id=AWS_KEYS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=AWS_KEYS["AWS_SECRET_ACCESS_KEY"]) as client:
        plain = (await client.create_queue(QueueName=name))["QueueUrl"]
        fifo = (await client.create_queue(QueueName=f"{name}.fifo",
                                          Attributes={"FifoQueue": "true"}))["QueueUrl"]
        common = ("send", "--broker", "sqs", "--endpoint-url", moto_endpoint)
        assert _ok(run_sharedstream(*common, "--queue", name, *_values(), "--attribute",
                                    "region=eu", cwd=tmp_path, env=AWS_KEYS)) == (
            f"sent 3 messages to sqs queue {name}\n")
        assert _ok(run_sharedstream(*common, "--queue", fifo, *_values(), "--group-id", "eu",
                                    cwd=tmp_path, env=AWS_KEYS)) == (
            f"sent 3 messages to sqs queue {name}.fifo\n")
        for url in (plain, fifo):
            received: list[Any] = []
            async with asyncio.timeout(20):
                while len(received) < 3:
                    response = await client.receive_message(
                        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                        MessageAttributeNames=["All"], AttributeNames=["All"])
                    received += response.get("Messages", [])
            if url == fifo:
                assert [m["Body"] for m in received] == BODIES
                assert {m["Attributes"]["MessageGroupId"] for m in received} == {"eu"}
            else:
                assert sorted(m["Body"] for m in received) == sorted(BODIES)
                assert [m["MessageAttributes"] for m in received] == [
                    {"region": {"DataType": "String", "StringValue": "eu"}}] * 3


# -- Pub/Sub -------------------------------------------------------------------------------


async def test_pubsub_attributes_and_ordering_key(pubsub_emulator_host: str,
                                                  tmp_path: Path) -> None:
    pytest.importorskip("google.pubsub_v1")
    from sharedstream.producers.pubsub import pubsub_clients  # noqa: PLC0415 - needs the SDK

    name = f"send-{uuid.uuid4().hex[:8]}"
    topic, subscription = f"projects/p/topics/{name}", f"projects/p/subscriptions/{name}"
    publisher = pubsub_clients(pubsub_emulator_host, "publisher")
    subscriber = pubsub_clients(pubsub_emulator_host, "subscriber")
    try:
        await publisher.create_topic(name=topic)
        await subscriber.create_subscription(request={
            "name": subscription, "topic": topic, "enable_message_ordering": True})
        out = _ok(run_sharedstream(
            "send", "--broker", "pubsub", "--emulator-host", pubsub_emulator_host, "--project",
            "p", "--topic", name, *_values(), "--attribute", "region=eu", "--ordering-key",
            "customer-7", cwd=tmp_path))
        assert out == f"sent 3 messages to pubsub topic {topic}\n"
        received: list[Any] = []
        async with asyncio.timeout(20):
            while len(received) < 3:
                response = await subscriber.pull(subscription=subscription, max_messages=10)
                received += response.received_messages
                if response.received_messages:
                    await subscriber.acknowledge(
                        subscription=subscription,
                        ack_ids=[r.ack_id for r in response.received_messages])
        assert [r.message.data.decode() for r in received] == BODIES
        assert [dict(r.message.attributes) for r in received] == [{"region": "eu"}] * 3
        assert {r.message.ordering_key for r in received} == {"customer-7"}
    finally:
        for client in (publisher, subscriber):
            await client.transport.close()


def test_pubsub_missing_topic_is_a_usage_error(pubsub_emulator_host: str,
                                               tmp_path: Path) -> None:
    result = run_sharedstream("send", "--broker", "pubsub", "--emulator-host",
                              pubsub_emulator_host, "--project", "p", "--topic", "nowhere",
                              "--value", "x", cwd=tmp_path)
    assert "no topic projects/p/topics/nowhere" in _one_line_error(result, 2)


# -- Service Bus ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the SDK's lost sockets: tests/servicebus
async def test_servicebus_properties_and_session(servicebus_connection_string: str,
                                                 tmp_path: Path) -> None:
    aio: Any = pytest.importorskip("azure.servicebus.aio")
    common = ("send", "--broker", "servicebus", "--connection-string",
              servicebus_connection_string, *_values(), "--property", "region=eu")
    assert _ok(run_sharedstream(*common, "--queue", SB_QUEUE, cwd=tmp_path)) == (
        f"sent 3 messages to servicebus queue {SB_QUEUE}\n")
    assert _ok(run_sharedstream(*common, "--queue", SB_SESSION_QUEUE, "--session-id", "eu",
                                cwd=tmp_path)) == (
        f"sent 3 messages to servicebus queue {SB_SESSION_QUEUE}\n")
    async with aio.ServiceBusClient.from_connection_string(servicebus_connection_string) as sb:
        for queue, session in ((SB_QUEUE, None), (SB_SESSION_QUEUE, "eu")):
            async with sb.get_queue_receiver(queue_name=queue, session_id=session,
                                             max_wait_time=5, keep_alive=None) as receiver:
                received: list[Any] = []
                async with asyncio.timeout(20):
                    while len(received) < 3:
                        batch = await receiver.receive_messages(max_message_count=10,
                                                                max_wait_time=2)
                        for message in batch:
                            await receiver.complete_message(message)
                        received += batch
            assert [b"".join(m.body).decode() for m in received] == BODIES
            assert [m.application_properties for m in received] == [{b"region": b"eu"}] * 3
            assert {m.session_id for m in received} == {session}


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the SDK's lost sockets: tests/servicebus
def test_servicebus_missing_queue_is_one_line_saying_not_found(servicebus_connection_string: str,
                                                               tmp_path: Path) -> None:
    """Service Bus refuses the token for a missing queue with 404: said as "not found"."""
    result = run_sharedstream("send", "--broker", "servicebus", "--connection-string",
                              servicebus_connection_string, "--queue", "nowhere", "--value", "x",
                              cwd=tmp_path)
    line = _one_line_error(result, 2)
    assert "servicebus queue nowhere: not found (status 404" in line, line


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the SDK's lost sockets: tests/servicebus
async def test_servicebus_send_without_a_session_id_to_a_session_queue_says_so(
        servicebus_connection_string: str) -> None:
    """No session id for a queue with sessions: refused (as Azure does), with the hint."""
    pytest.importorskip("azure.servicebus")
    from sharedstream.brokerkit.sending import OutgoingMessage, SendFailed  # noqa: PLC0415
    from sharedstream.producers._servicebus_send import ServiceBusSender  # noqa: PLC0415

    sender = ServiceBusSender.from_options(
        {"queue": SB_SESSION_QUEUE, "connection_string": servicebus_connection_string})
    sender.send_timeout = 1.0
    await sender.open()
    try:
        with pytest.raises(SendFailed, match="needs --session-id"):
            await sender.send([OutgoingMessage(b"{}")])
    finally:
        await sender.close()
