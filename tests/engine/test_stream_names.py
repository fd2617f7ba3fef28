"""Stream names: the invariants of :mod:`sharedstream.engine.names`, and each broker's base name."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given
from hypothesis import strategies as st

from sharedstream.engine.names import StreamNames, stream_digest
from sharedstream.testing.memory import MemorySharedStreamTrigger
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from sharedstream.triggers.sqs import SqsSharedStreamTrigger

A, B, C = ("kafka", "east:9092", "orders"), ("kafka", "west:9092", "orders"), ("sqs", "refunds")


def test_a_name_is_kept_and_a_second_key_with_the_same_base_gets_its_digest() -> None:
    names = StreamNames()
    assert names.name(A, "kafka orders (group g)") == "kafka orders (group g)"
    assert names.name(B, "kafka orders (group g)") == f"kafka orders (group g) [{stream_digest(B)}]"
    # Invariant 1: asked again (even with another base), the name is the one given.
    assert names.name(A, "something else") == "kafka orders (group g)"
    assert names.get(A) == "kafka orders (group g)"
    assert names.name(C, "sqs refunds") == "sqs refunds"


def test_a_key_without_a_base_name_is_named_by_its_broker_and_digest() -> None:
    names = StreamNames()
    assert names.get(A) == f"kafka [{stream_digest(A)}]"  # not named yet: nothing kept
    assert names.name(A, None) == f"kafka [{stream_digest(A)}]"
    assert names.name(("x",) * 0, None).startswith("stream [")


def test_naming_a_batch_gives_every_key_of_a_shared_base_its_digest_in_any_order() -> None:
    batch: list[tuple[Hashable, str | None]] = [
        (A, "kafka orders (group g)"), (C, "sqs refunds"), (B, "kafka orders (group g)")]
    first, second = StreamNames(), StreamNames()
    first.name_all(batch)
    second.name_all(reversed(batch))
    assert [first.get(k) for k in (A, B, C)] == [second.get(k) for k in (A, B, C)] == [
        f"kafka orders (group g) [{stream_digest(A)}]",
        f"kafka orders (group g) [{stream_digest(B)}]",
        "sqs refunds",
    ]


def test_a_batch_keeps_names_already_given_and_does_not_reuse_them() -> None:
    names = StreamNames()
    assert names.name(A, "kafka orders (group g)") == "kafka orders (group g)"
    names.name_all([(A, "kafka orders (group g)"), (B, "kafka orders (group g)")])
    assert names.get(A) == "kafka orders (group g)"
    assert names.get(B) == f"kafka orders (group g) [{stream_digest(B)}]"


@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["a", "b", "c"])), max_size=12),
       st.booleans())
def test_no_two_keys_share_a_name(streams: list[tuple[int, str]], batch: bool) -> None:
    names = StreamNames()
    by_key = dict(streams)  # one base per key, as a trigger gives
    if batch:
        names.name_all(by_key.items())
    given_names = {key: names.name(key, base) for key, base in by_key.items()}
    assert len(set(given_names.values())) == len(given_names)


def test_each_broker_names_its_stream_in_its_own_words_and_never_with_secrets() -> None:
    kafka = KafkaSharedStreamTrigger(
        bootstrap_servers="b1:9092", topics=["orders", "refunds"], group_id="sharedstream-orders",
        security={"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                  "sasl_plain_username": "u", "sasl_plain_password": "hunter2"})
    assert kafka.shared_stream_name() == "kafka orders,refunds (group sharedstream-orders)"
    assert KafkaSharedStreamTrigger(topics=["orders"], conn_id="kafka_prod").shared_stream_name() \
        == "kafka orders (connection kafka_prod)"
    sqs = SqsSharedStreamTrigger(
        queue="https://sqs.eu-west-1.amazonaws.com/123456789012/orders-queue",
        region_name="eu-west-1", credentials={"aws_access_key_id": "AKIA",
                                              "aws_secret_access_key": "hunter2"})
    assert sqs.shared_stream_name() == "sqs orders-queue"
    pubsub = PubSubSharedStreamTrigger(project="p", subscription="projects/p/subscriptions/s")
    assert pubsub.shared_stream_name() == "pubsub s (project p)"
    assert PubSubSharedStreamTrigger(project="shop", subscription="orders-sub"
                                     ).shared_stream_name() == "pubsub orders-sub (project shop)"
    connection = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=hunter2"
    assert ServiceBusSharedStreamTrigger(connection_string=connection, topic="orders",
                                         subscription="s").shared_stream_name() == \
        "servicebus orders/subscriptions/s"
    assert ServiceBusSharedStreamTrigger(connection_string=connection, queue="orders"
                                         ).shared_stream_name() == "servicebus orders"
    assert MemorySharedStreamTrigger(stream="orders", broker="x").shared_stream_name() == \
        "memory orders"


def test_the_same_topic_on_two_clusters_gets_two_names_without_a_host_in_either() -> None:
    east, west = (KafkaSharedStreamTrigger(bootstrap_servers=servers, topics=["orders"],
                                           group_id="g")
                  for servers in ("east.example:9092", "west.example:9092"))
    names = StreamNames()
    names.name_all((t.shared_stream_key(), t.shared_stream_name()) for t in (east, west))
    found = {names.get(t.shared_stream_key()) for t in (east, west)}
    assert len(found) == 2
    assert all(name.startswith("kafka orders (group g) [") for name in found)
    assert not any("example" in name or "9092" in name for name in found)


def test_the_airflow_provider_shims_name_their_streams_too() -> None:
    from sharedstream.airflow.providers.amazon.aws.triggers.shared_stream import (  # noqa: PLC0415
        SqsSharedStreamTrigger as ProviderSqs,
    )
    from sharedstream.airflow.providers.apache.kafka.triggers.shared_stream import (  # noqa: PLC0415
        KafkaSharedStreamTrigger as ProviderKafka,
    )

    assert ProviderKafka(topics=["orders"]).shared_stream_name() == \
        "kafka orders (connection kafka_default)"
    assert ProviderSqs(sqs_queue="https://sqs.us-east-1.amazonaws.com/1/orders-queue"
                       ).shared_stream_name() == "sqs orders-queue"
