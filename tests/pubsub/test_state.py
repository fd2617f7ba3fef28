"""The Pub/Sub test server's state machine alone: no gRPC, no event loop, an injected clock.

Covers its public read-only view (:meth:`PubSubState.counts`) and its
lease test hook (:meth:`PubSubState.lapse`); the rest of the state is
driven through the real client in ``test_server.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from sharedstream.testing.pubsub.state import (
    Consumer,
    PubSubState,
    Refused,
    SubscriptionCounts,
    SubscriptionSettings,
)

TOPIC = "projects/p/topics/orders"
DEAD_LETTERS = "projects/p/topics/orders-dlq"
SUBSCRIPTION = "projects/p/subscriptions/etl"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state_with(clock: Clock, **settings: Any) -> PubSubState:
    state = PubSubState(clock=clock, wall=lambda: 1_700_000_000.0)
    state.create_topic(TOPIC, None)
    state.create_topic(DEAD_LETTERS, None)
    state.create_subscription(SUBSCRIPTION, SubscriptionSettings(topic=TOPIC, **settings), None)
    return state


def publish(state: PubSubState, *values: bytes, key: str = "") -> list[str]:
    return state.publish(TOPIC, [(value, {}, key) for value in values])


def test_counts_place_each_unacked_message_once_and_change_nothing() -> None:
    clock = Clock()
    state = state_with(clock, ordering=True, minimum_backoff=5.0, maximum_backoff=5.0)
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(0, 0, 0, 0)
    publish(state, b"a0", b"a1", b"a2", key="a")  # a0 ready, a1 and a2 behind it
    publish(state, b"free0", b"free1")
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=3, delayed=0, held=2, leased=0)

    taken = state.take(SUBSCRIPTION, Consumer(), 10, deadline=10)
    assert sorted(d.message.data for d in taken) == [b"a0", b"free0", b"free1"]
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=0, delayed=0, held=2, leased=3)
    assert state.counts(SUBSCRIPTION) == state.counts(SUBSCRIPTION)  # reading changes nothing

    by_data = {d.message.data: d.ack_id for d in taken}
    state.modify_deadline(SUBSCRIPTION, [by_data[b"free0"]], 0)  # nacked: backs off 5 s
    state.acknowledge(SUBSCRIPTION, [by_data[b"a0"], by_data[b"free1"]])  # a1 released
    counts = state.counts(SUBSCRIPTION)
    assert counts == SubscriptionCounts(ready=1, delayed=1, held=1, leased=0)
    assert counts.unacked == 3  # a1, a2, free0

    clock.now += 5
    state.expire()
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=2, delayed=0, held=1, leased=0)


def test_counts_of_a_missing_subscription_are_refused() -> None:
    with pytest.raises(Refused) as refused:
        state_with(Clock()).counts("projects/p/subscriptions/none")
    assert refused.value.status == "NOT_FOUND"


def test_lapse_ends_leases_as_an_expiry_does() -> None:
    """The ack ids go stale, the messages come again with new ones, attempts counted."""
    clock = Clock()
    state = state_with(clock)
    kept_id, lapsed_id = publish(state, b"kept", b"lapsed")
    consumer = Consumer(max_messages=2)
    first = {d.message.message_id: d for d in state.take(SUBSCRIPTION, consumer, 10, 60)}
    assert state.take(SUBSCRIPTION, consumer, 10, 60) == []  # the consumer is full

    stale = state.lapse(SUBSCRIPTION, [lapsed_id])
    assert stale == [first[lapsed_id].ack_id]
    assert consumer.messages == 1  # the lapsed lease no longer counts against the stream
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=1, delayed=0, held=0, leased=1)
    assert state.acknowledge(SUBSCRIPTION, stale) == stale  # stale: refused as unknown
    assert state.modify_deadline(SUBSCRIPTION, stale, 30) == stale

    [again] = state.take(SUBSCRIPTION, consumer, 10, 60)
    assert (again.message.message_id, again.attempt) == (lapsed_id, 2)
    assert again.ack_id != first[lapsed_id].ack_id
    assert state.acknowledge(SUBSCRIPTION, [first[kept_id].ack_id, again.ack_id]) == []
    assert state.counts(SUBSCRIPTION).unacked == 0


def test_lapse_on_the_last_allowed_attempt_dead_letters() -> None:
    clock = Clock()
    state = state_with(clock, max_delivery_attempts=5, dead_letter_topic=DEAD_LETTERS)
    letters = "projects/p/subscriptions/letters"
    state.create_subscription(letters, SubscriptionSettings(topic=DEAD_LETTERS), None)
    publish(state, b"poison")
    for attempt in range(1, 6):
        [delivery] = state.take(SUBSCRIPTION, None, 10, 60)
        assert delivery.attempt == attempt
        assert len(state.lapse(SUBSCRIPTION)) == 1  # every lease of the subscription
    assert state.counts(SUBSCRIPTION).unacked == 0
    [letter] = state.take(letters, None, 10, 60)
    assert letter.message.data == b"poison"
    assert letter.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"


def test_a_response_is_bounded_in_bytes_but_always_carries_one_message() -> None:
    state = state_with(Clock())
    publish(state, b"a" * 600, b"b" * 600, b"c" * 10)
    first = state.take(SUBSCRIPTION, None, 10, deadline=10, max_bytes=500)
    assert [d.message.data[:1] for d in first] == [b"a"]  # larger than the bound, alone
    rest = state.take(SUBSCRIPTION, None, 10, deadline=10, max_bytes=1000)
    assert [d.message.data[:1] for d in rest] == [b"b", b"c"]
