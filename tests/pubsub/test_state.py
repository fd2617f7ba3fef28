"""The Pub/Sub test server's state machine alone: no gRPC, no event loop, an injected clock.

Covers its public read-only view (:meth:`PubSubState.counts`) and its
lease test hook (:meth:`PubSubState.lapse`); the rest of the state is
driven through the real client in ``test_server.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from sharedstream.testing.pubsub.rules import Refused
from sharedstream.testing.pubsub.state import (
    Consumer,
    PubSubState,
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
    publish(state, b"a0", b"a1", b"a2", b"a3", key="a")  # a0 ready, the rest behind it
    publish(state, b"free0", b"free1")
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=3, delayed=0, held=3, leased=0)

    taken = state.take(SUBSCRIPTION, Consumer(max_messages=3), 10, deadline=10)
    assert sorted(d.message.data for d in taken) == [b"a0", b"free0", b"free1"]
    # a1 is ready the moment a0 is out; a2 and a3 wait behind it.
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=1, delayed=0, held=2, leased=3)
    assert state.counts(SUBSCRIPTION) == state.counts(SUBSCRIPTION)  # reading changes nothing

    by_data = {d.message.data: d.ack_id for d in taken}
    state.modify_deadline(SUBSCRIPTION, [by_data[b"free0"]], 0)  # nacked: backs off 5 s
    state.acknowledge(SUBSCRIPTION, [by_data[b"a0"], by_data[b"free1"]])
    counts = state.counts(SUBSCRIPTION)
    assert counts == SubscriptionCounts(ready=1, delayed=1, held=2, leased=0)
    assert counts.unacked == 4  # a1, a2, a3, free0

    clock.now += 5
    state.expire()
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=2, delayed=0, held=2, leased=0)


# -- ordering keys: several out at once, a failure replays the key from there ------------


def data(deliveries: list[Any]) -> list[bytes]:
    return [d.message.data for d in deliveries]


def test_a_key_s_messages_are_out_together_in_order() -> None:
    state = state_with(Clock(), ordering=True)
    publish(state, b"a0", b"a1", b"a2", key="a")
    publish(state, b"b0", b"b1", key="b")
    taken = state.take(SUBSCRIPTION, Consumer(), 10, deadline=10)
    assert [v for v in data(taken) if v.startswith(b"a")] == [b"a0", b"a1", b"a2"]
    assert [v for v in data(taken) if v.startswith(b"b")] == [b"b0", b"b1"]
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=0, delayed=0, held=0, leased=5)


def test_a_nack_redelivers_the_message_and_every_later_one_of_its_key() -> None:
    """The followers' leases are revoked (stale ack ids), an acked follower comes again too,
    the earlier message keeps its lease, and other keys are not touched."""
    state = state_with(Clock(), ordering=True)
    publish(state, b"a0", b"a1", b"a2", b"a3", key="a")
    publish(state, b"b0", key="b")
    stream = Consumer()
    first = {d.message.data: d for d in state.take(SUBSCRIPTION, stream, 10, deadline=10)}
    assert state.acknowledge(SUBSCRIPTION, [first[b"a3"].ack_id]) == []  # acked out of order

    assert state.modify_deadline(SUBSCRIPTION, [first[b"a1"].ack_id], 0) == []
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=1, delayed=0, held=2, leased=2)
    revoked = [first[b"a2"].ack_id]
    assert state.acknowledge(SUBSCRIPTION, revoked) == revoked  # stale: ignored
    assert state.modify_deadline(SUBSCRIPTION, revoked, 30) == revoked

    again = state.take(SUBSCRIPTION, stream, 10, deadline=10)
    assert data(again) == [b"a1", b"a2", b"a3"]
    assert [d.attempt for d in again] == [2, 2, 2]
    assert {d.ack_id for d in again}.isdisjoint(d.ack_id for d in first.values())
    live = [first[b"a0"].ack_id, first[b"b0"].ack_id, *(d.ack_id for d in again)]
    assert state.acknowledge(SUBSCRIPTION, live) == []
    assert state.counts(SUBSCRIPTION).unacked == 0
    assert state.take(SUBSCRIPTION, stream, 10, deadline=10) == []


def test_an_expired_head_replays_the_key_after_its_backoff() -> None:
    clock = Clock()
    state = state_with(clock, ordering=True, minimum_backoff=5.0, maximum_backoff=5.0)
    publish(state, b"a0", b"a1", key="a")
    state.take(SUBSCRIPTION, Consumer(), 10, deadline=10)
    clock.now += 10
    state.expire()
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=0, delayed=1, held=1, leased=0)
    assert state.take(SUBSCRIPTION, Consumer(), 10, deadline=10) == []  # a1 waits for a0
    clock.now += 5
    state.expire()
    assert data(state.take(SUBSCRIPTION, Consumer(), 10, deadline=10)) == [b"a0", b"a1"]


def test_on_an_exactly_once_subscription_an_acked_follower_never_comes_again() -> None:
    state = state_with(Clock(), ordering=True, exactly_once=True)
    publish(state, b"a0", b"a1", b"a2", key="a")
    first = {d.message.data: d for d in state.take(SUBSCRIPTION, Consumer(), 10, deadline=10)}
    state.acknowledge(SUBSCRIPTION, [first[b"a1"].ack_id])
    state.modify_deadline(SUBSCRIPTION, [first[b"a0"].ack_id], 0)
    assert data(state.take(SUBSCRIPTION, Consumer(), 10, deadline=10)) == [b"a0", b"a2"]


def test_a_dead_lettered_message_lets_its_key_go_on() -> None:
    state = state_with(Clock(), ordering=True, max_delivery_attempts=5,
                       dead_letter_topic=DEAD_LETTERS)
    publish(state, b"a0", b"a1", key="a")
    stream = Consumer()
    for _ in range(5):
        a0, a1 = state.take(SUBSCRIPTION, stream, 10, deadline=10)
        state.modify_deadline(SUBSCRIPTION, [a0.ack_id], 0)  # a0 fails, a1 is revoked...
    # ... but not the fifth time: a0 went to the dead-letter topic, a1 keeps its lease.
    assert (a1.message.data, a1.attempt) == (b"a1", 5)  # each replay was a delivery
    assert state.counts(SUBSCRIPTION) == SubscriptionCounts(ready=0, delayed=0, held=0, leased=1)
    assert state.acknowledge(SUBSCRIPTION, [a1.ack_id]) == []
    assert state.counts(SUBSCRIPTION).unacked == 0


def test_a_key_out_on_one_stream_is_not_handed_to_another_until_its_leases_end() -> None:
    state = state_with(Clock(), ordering=True)
    one, other = Consumer(max_messages=1), Consumer()
    publish(state, b"a0", b"a1", key="a")
    publish(state, b"b0", key="b")
    [a0] = state.take(SUBSCRIPTION, one, 10, deadline=10)
    assert data(state.take(SUBSCRIPTION, other, 10, deadline=10)) == [b"b0"]  # not a1
    assert state.take(SUBSCRIPTION, None, 10, deadline=10) == []  # nor to a unary Pull
    state.acknowledge(SUBSCRIPTION, [a0.ack_id])
    assert data(state.take(SUBSCRIPTION, other, 10, deadline=10)) == [b"a1"]

    publish(state, b"c0", b"c1", key="c")
    [c0] = state.take(SUBSCRIPTION, one, 10, deadline=10)
    state.close_consumer(SUBSCRIPTION, one)  # a stream that ends frees its keys at once
    assert data(state.take(SUBSCRIPTION, other, 10, deadline=10)) == [b"c1"]
    assert c0.message.data == b"c0"


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
