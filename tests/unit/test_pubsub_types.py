"""The Pub/Sub message's fields, read from the client's own protobuf classes."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from sharedstream.producers._pubsub_types import PubSubMessage, iso_utc, raw_request

types = pytest.importorskip("google.pubsub_v1.types")


@pytest.mark.parametrize(("seconds", "nanos", "expected"), [
    (0, 0, "1970-01-01T00:00:00+00:00"),
    (1_764_000_000, 999, "2025-11-24T16:00:00+00:00"),  # under a microsecond: none shown
    (1_764_000_000, 1_000, "2025-11-24T16:00:00.000001+00:00"),
    (1_764_000_059, 999_999_999, "2025-11-24T16:00:59.999999+00:00"),  # truncated, not rounded
    (951_782_400, 5_000_000, "2000-02-29T00:00:00.005000+00:00"),
])
def test_publish_times_read_as_iso_8601_utc(seconds: int, nanos: int, expected: str) -> None:
    assert iso_utc(seconds, nanos) == expected


def test_publish_times_agree_with_datetime_across_many_seconds() -> None:
    draw = random.Random(14)
    for _ in range(5_000):
        seconds = draw.randrange(0, 4_000_000_000)
        nanos = draw.choice([0, draw.randrange(1_000_000_000), 1_000 * draw.randrange(1_000_000)])
        expected = datetime.fromtimestamp(seconds, tz=UTC) + timedelta(microseconds=nanos // 1000)
        assert iso_utc(seconds, nanos) == expected.isoformat()
        assert datetime.fromisoformat(iso_utc(seconds, nanos)) == expected


def test_a_message_copies_what_filters_read() -> None:
    stamp = datetime(2026, 11, 24, 1, 2, 3, 456_789, tzinfo=UTC)
    received = types.ReceivedMessage.pb(types.ReceivedMessage(
        ack_id="a-1", delivery_attempt=3, message=types.PubsubMessage(
            data=b'{"n": 1}', message_id="42", ordering_key="k",
            attributes={"tenant": "t1"}, publish_time=stamp)))
    message = PubSubMessage("projects/p/subscriptions/s", received)
    assert (message.message_id, message.data, message.ordering_key) == ("42", b'{"n": 1}', "k")
    assert message.attributes == {"tenant": "t1"}
    assert type(message.attributes) is dict
    assert message.publish_time == stamp.isoformat()
    assert message.delivery_attempt == 3


def test_a_message_without_attributes_or_attempt() -> None:
    received = types.ReceivedMessage.pb(types.ReceivedMessage(
        ack_id="a-2", message=types.PubsubMessage(data=b"x", message_id="43")))
    message = PubSubMessage("projects/p/subscriptions/s", received)
    assert message.attributes == {}
    assert message.delivery_attempt is None
    assert message.publish_time == "1970-01-01T00:00:00+00:00"
    message.attributes["mine"] = "1"  # each message has its own dict
    assert PubSubMessage("s", received).attributes == {}


async def test_a_nacked_message_is_no_longer_renewed() -> None:
    """A message nacked straight from the stream (a dead letter not kept) stops renewing.

    Renewal would otherwise keep extending a lease Pub/Sub was told to end,
    until ``max_lease_duration``.
    """
    from sharedstream.producers.pubsub import (  # noqa: PLC0415 - needs the SDK
        PubSubPayload,
        PubSubSettings,
        PubSubSharedStreamProducer,
    )

    producer = PubSubSharedStreamProducer(PubSubSettings(project="p", subscription="s"))
    changed: list[tuple[list[str], int]] = []

    async def modify(ack_ids: list[str], seconds: int) -> list[str]:
        changed.append((ack_ids, seconds))
        return ack_ids

    producer._modify = modify  # type: ignore[method-assign]  # the call to Pub/Sub only
    received = types.ReceivedMessage.pb(types.ReceivedMessage(
        ack_id="a-1", message=types.PubsubMessage(data=b"x", message_id="1")))
    payload = PubSubPayload("a-1", ("message", "1"), PubSubMessage(producer.subscription, received))
    producer._leases.hold("a-1", producer._leases.now() + 60)
    await producer._nack([payload])
    assert changed == [(["a-1"], 0)]
    assert producer._leases.held() == {}


@pytest.mark.parametrize(("request_type", "fields"), [
    ("AcknowledgeRequest", {"subscription": "projects/p/subscriptions/s",
                            "ack_ids": [f"ack-{n}" for n in range(300)]}),
    ("ModifyAckDeadlineRequest", {"subscription": "projects/p/subscriptions/s",
                                  "ack_ids": ["a", "b"], "ack_deadline_seconds": 0}),
])
def test_raw_requests_are_the_requests_the_client_builds(request_type: str,
                                                         fields: dict[str, object]) -> None:
    kind = getattr(types, request_type)
    built = raw_request(kind, **fields)
    assert isinstance(built, kind)  # the GAPIC client takes it as is, without copying
    assert kind.serialize(built) == kind.serialize(kind(**fields))
    assert list(built.ack_ids) == fields["ack_ids"]



async def test_the_pubsub_backlog_is_not_available_and_says_where_it_is() -> None:
    from sharedstream.engine.errors import BacklogUnavailable  # noqa: PLC0415
    from sharedstream.producers.pubsub import (  # noqa: PLC0415
        PubSubSettings,
        PubSubSharedStreamProducer,
    )

    producer = PubSubSharedStreamProducer(PubSubSettings(project="p", subscription="s"))
    with pytest.raises(BacklogUnavailable, match="subscription/num_undelivered_messages"):
        await producer.broker_backlog()  # never asks the service: its API has no such count
