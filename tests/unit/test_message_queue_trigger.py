"""``MessageQueueTrigger``'s two spellings of ``queue``, its schemes and its one-line refusals.

Pure construction: nothing connects (the connections are read when a stream
opens in the triggerer; see tests/airflow/test_message_queue_trigger.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sharedstream.airflow.providers.common.messaging.triggers._kafka import (
    KafkaMessageQueueTrigger,
)
from sharedstream.airflow.providers.common.messaging.triggers._sqs import SqsMessageQueueTrigger
from sharedstream.airflow.providers.common.messaging.triggers.msg_queue import (
    MessageQueueTrigger,
)
from sharedstream.producers.kafka import KafkaMessage

SQS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


def test_the_scheme_picks_the_brokers_trigger_and_serializes_it_under_34s_spelling() -> None:
    trigger = MessageQueueTrigger(scheme="kafka", topics=["b", "a"], queue="team-a")
    assert isinstance(trigger, KafkaMessageQueueTrigger)
    assert isinstance(trigger, MessageQueueTrigger)
    assert trigger.queue == "team-a"
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("._kafka.KafkaMessageQueueTrigger")
    assert kwargs["scheme"] == "kafka"
    assert kwargs["queue"] == "team-a"
    assert kwargs["topics"] == ["a", "b"]
    rebuilt = KafkaMessageQueueTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.shared_stream_key() == ("kafka-message-queue", ("a", "b"), "kafka_default")


def test_common_messaging_21s_broker_uri_and_trigger_queue_still_work() -> None:
    kafka = MessageQueueTrigger(queue="kafka://broker:9092/orders,refunds")
    assert isinstance(kafka, KafkaMessageQueueTrigger)
    assert kafka.kwargs["topics"] == ["orders", "refunds"]
    assert kafka.queue is None
    sqs = MessageQueueTrigger(queue=SQS_URL, trigger_queue="team-b")
    assert isinstance(sqs, SqsMessageQueueTrigger)
    assert sqs.kwargs["sqs_queue"] == SQS_URL
    assert sqs.queue == "team-b"
    same = MessageQueueTrigger(scheme="sqs", sqs_queue=SQS_URL, trigger_queue="team-b")
    assert same.serialize() == sqs.serialize()


@pytest.mark.parametrize(("arguments", "error", "says"), [
    ({}, ValueError, "give scheme="),
    ({"queue": "team-a"}, ValueError, "queue= is the trigger queue; give scheme="),
    ({"scheme": "kafka", "queue": "kafka://b/orders"}, ValueError, "not a broker URI"),
    ({"scheme": "kafka", "topics": ["o"], "queue": "a", "trigger_queue": "b"}, ValueError,
     "both name the trigger queue"),
    ({"queue": "redis+pubsub://h/c"}, ValueError, "not a broker URI served here"),
    ({"scheme": "google+pubsub"}, ValueError, "use sharedstream.triggers.pubsub"),
    ({"scheme": "azure+servicebus"}, ValueError, "ServiceBusSharedStreamTrigger"),
    ({"scheme": "nats"}, ValueError, "unknown scheme 'nats'"),
    ({"scheme": "kafka"}, TypeError, "AwaitMessageTrigger needs topics"),
    ({"scheme": "kafka", "topics": ["o"], "group_id": "g"}, TypeError, "no argument group_id"),
    ({"scheme": "kafka", "topics": ["o"], "commit_offset": False}, ValueError, "commit_offset"),
    ({"scheme": "kafka", "topics": ["o"], "apply_function": len}, ValueError, "dotted path"),
    ({"scheme": "sqs"}, TypeError, "SqsSensorTrigger needs sqs_queue"),
    ({"scheme": "sqs", "sqs_queue": SQS_URL, "max_messages": 50}, Exception, "max_messages"),
    ({"scheme": "sqs", "sqs_queue": SQS_URL, "message_filtering": "jsonpath"}, ValueError,
     "not supported here"),
    ({"scheme": "sqs", "sqs_queue": SQS_URL, "delete_message_on_reception": False},
     ValueError, "delete_message_on_reception"),
])
def test_arguments_that_cannot_work_are_refused_in_one_line(
    arguments: dict[str, Any], error: type[Exception], says: str,
) -> None:
    with pytest.raises(error) as raised:
        MessageQueueTrigger(**arguments)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def record(value: bytes | None, offset: int = 0) -> KafkaMessage:
    return KafkaMessage("orders", 0, offset, b"k", value, (("h", b"v"),), 1700000000000)


async def fired(trigger: MessageQueueTrigger, items: list[Any]) -> list[Any]:
    async def stream() -> AsyncIterator[Any]:
        for item in items:
            yield item
    return [event.payload async for event in trigger.filter_shared_stream(stream())]


def confluent_view(prefix: str, message: Any, *, suffix: str) -> Any:
    """An ``apply_function``: what confluent-kafka's ``Message`` methods give, when non-empty."""
    if not message.value():
        return None
    return [prefix, message.value().decode(), message.key(), message.topic(),
            message.partition(), message.offset(), message.headers(), message.timestamp(),
            message.error(), len(message), suffix]


def test_kafka_apply_function_sees_confluents_message_methods_and_fires_truthy_results() -> None:
    trigger = MessageQueueTrigger(
        scheme="kafka", topics=["orders"],
        apply_function=f"{__name__}.confluent_view", apply_function_args=["p"],
        apply_function_kwargs={"suffix": "s"})
    payloads = asyncio.run(fired(trigger, [record(b"one"), record(None, 1), record(b"", 2)]))
    assert payloads == [["p", "one", b"k", "orders", 0, 0, [("h", b"v")],
                         (1, 1700000000000), None, 3, "s"]]


def test_kafka_without_apply_function_fires_each_non_empty_value_as_text() -> None:
    trigger = MessageQueueTrigger(scheme="kafka", topics=["orders"])
    assert asyncio.run(fired(trigger, [record(b"one"), record(None, 1), record(b"", 2)])) == [
        "one"]
