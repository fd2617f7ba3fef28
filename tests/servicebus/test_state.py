"""The Service Bus test server's state alone: no AMQP, no SDK, a clock the test moves.

Each test names the invariant of :mod:`sharedstream.testing.servicebus.state`
it checks; the property test checks that no message is ever lost or held
twice, whatever receivers do.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream.testing.servicebus import config
from sharedstream.testing.servicebus.model import (
    MESSAGE_LOCK_LOST,
    MESSAGE_NOT_FOUND,
    NEXT_SESSION,
    NOT_ALLOWED,
    NOT_FOUND,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    CorrelationFilter,
    Delivery,
    EntitySettings,
    Message,
    MessageState,
    Outcome,
    Refused,
)
from sharedstream.testing.servicebus.state import (
    TTL_EXPIRED,
    Receiver,
    ServiceBusState,
    StoreCounts,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_state(clock: Clock | None = None) -> tuple[ServiceBusState, list[str]]:
    woken: list[str] = []
    clock = clock or Clock()
    state = ServiceBusState(clock=clock, wall=lambda: clock.now + 1_000_000,
                            on_available=woken.append)
    return state, woken


def msg(body: str, session: str | None = None, **properties: Any) -> Message:
    return Message(body.encode(), session, {}, properties)


def receive(state: ServiceBusState, receiver: Receiver) -> tuple[str, int, uuid.UUID | None]:
    delivery = state.receive(receiver)
    assert delivery is not None
    return delivery.message.encoded.decode(), delivery.delivery_count, delivery.lock_token


def locked_first(*bodies: str) -> tuple[ServiceBusState, Receiver, uuid.UUID]:
    """A state with queue ``q`` holding ``bodies``, the first received peek-lock: its lock token."""
    state, _ = make_state()
    state.create_queue("q")
    state.send("q", [msg(body) for body in bodies])
    receiver = state.open_receiver("q")
    assert receiver is not None
    _, _, token = receive(state, receiver)
    assert token is not None
    return state, receiver, token


def test_entries_are_delivered_in_sequence_order_and_completion_removes_them() -> None:
    state, woken = make_state()
    state.create_queue("q")
    assert state.send("q", [msg("a"), msg("b")]) == [1, 2]
    assert woken == ["q"]  # invariant 5
    receiver = state.open_receiver("q")
    assert receiver is not None
    a, b = state.receive(receiver), state.receive(receiver)
    assert a is not None
    assert b is not None
    assert (a.sequence_number, b.sequence_number, a.delivery_count) == (1, 2, 0)
    assert a.locked_until == 1_000_100 + 60  # wall clock + the default lock duration
    assert state.receive(receiver) is None
    assert state.counts("q").locked == 2
    assert a.lock_token is not None
    state.settle(a.lock_token, Outcome.COMPLETE)
    assert state.counts("Q").locked == 1  # paths are case-insensitive


def test_an_abandoned_entry_is_counted_and_comes_back_before_later_ones() -> None:
    state, receiver, token = locked_first("a", "b")
    state.settle(token, Outcome.ABANDON)
    assert receive(state, receiver)[:2] == ("a", 1)  # invariants 3 and 4
    with pytest.raises(Refused) as stale:
        state.settle(token, Outcome.COMPLETE)  # invariant 2
    assert stale.value.condition == MESSAGE_LOCK_LOST


def test_a_release_makes_the_entry_available_without_counting_it() -> None:
    state, receiver, token = locked_first("a")
    state.settle(token, Outcome.RELEASE)
    assert receive(state, receiver)[:2] == ("a", 0)


def test_an_expired_lock_returns_the_entry_counted_and_renewal_postpones_it() -> None:
    clock = Clock()
    state, woken = make_state(clock)
    state.create_queue("q", EntitySettings(lock_duration=5))
    state.send("q", [msg("a"), msg("b")])
    receiver = state.open_receiver("q")
    assert receiver is not None
    _, _, token_a = receive(state, receiver)
    _, _, token_b = receive(state, receiver)
    assert token_a is not None
    assert token_b is not None
    assert state.next_due() == 105
    clock.now = 104
    assert state.renew_lock(token_b) == 1_000_104 + 5
    clock.now = 105
    woken.clear()
    assert state.expire() == []
    assert woken == ["q"]
    assert receive(state, receiver)[:2] == ("a", 1)
    assert state.next_due() == 109  # b's renewed lock (a's new lock ends at 110)
    with pytest.raises(Refused):
        state.renew_lock(token_a)
    state.settle(token_b, Outcome.COMPLETE)


def test_renewing_many_locks_is_all_or_nothing_and_counted() -> None:
    """Invariant 2, for ``renew-lock`` with a list: one stale token (or one of another store)
    and no lock is renewed; the answer is one end per token, in order."""
    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q", EntitySettings(lock_duration=5))
    state.create_queue("other", EntitySettings(lock_duration=5))
    state.send("q", [msg("a"), msg("b"), msg("c")])
    state.send("other", [msg("x")])
    receiver, elsewhere = state.open_receiver("q"), state.open_receiver("other")
    assert receiver is not None
    assert elsewhere is not None
    tokens = [receive(state, receiver)[2] for _ in range(3)]
    [a, b, c] = [token for token in tokens if token is not None]
    foreign = receive(state, elsewhere)[2]
    assert foreign is not None
    clock.now = 103
    assert state.renew_locks([c, a], "q") == [1_000_103 + 5] * 2
    state.settle(b, Outcome.COMPLETE)
    clock.now = 104
    with pytest.raises(Refused) as stale:
        state.renew_locks([a, b, c], "q")
    assert stale.value.condition == MESSAGE_LOCK_LOST
    with pytest.raises(Refused) as not_ours:
        state.renew_locks([a, foreign], "q")
    assert not_ours.value.condition == MESSAGE_LOCK_LOST
    assert state.next_due() == 105  # x's lock; a and c still end at 108, not 109
    clock.now = 105
    state.expire()
    assert state.next_due() == 108
    counts = state.lock_counts("q")
    assert (counts.renew_requests, counts.renewed, counts.lapsed) == (1, 2, 0)
    assert state.lock_counts("other").lapsed == 1


def test_the_last_allowed_failure_dead_letters_with_max_delivery_count_exceeded() -> None:
    state, woken = make_state()
    state.create_queue("q", EntitySettings(max_delivery_count=2))
    state.send("q", [msg("poison")])
    receiver = state.open_receiver("q")
    assert receiver is not None
    for _ in range(2):
        _, _, token = receive(state, receiver)
        assert token is not None
        state.settle(token, Outcome.ABANDON)
    assert state.receive(receiver) is None
    assert woken[-1] == "q/$DeadLetterQueue"
    dead = state.open_receiver("q/$deadletterqueue")
    assert dead is not None
    letter = state.receive(dead)
    assert letter is not None
    assert letter.extra_properties["DeadLetterReason"] == "MaxDeliveryCountExceeded"
    assert (letter.sequence_number, letter.delivery_count) == (1, 0)


def test_dead_lettering_keeps_the_sequence_number_and_adds_reason_and_description() -> None:
    state, _ = make_state()
    state.create_topic("t")
    state.create_subscription("t", "s")
    state.send("t", [msg("x")])
    receiver = state.open_receiver("t/subscriptions/s")
    assert receiver is not None
    _, _, token = receive(state, receiver)
    assert token is not None
    state.settle(token, Outcome.DEAD_LETTER, reason="bad", description="very bad")
    [letter] = state.peek("t/Subscriptions/s/$DeadLetterQueue", 1, 10)
    assert dict(letter.extra_properties) == {"DeadLetterReason": "bad",
                                             "DeadLetterErrorDescription": "very bad"}


def test_a_deferred_entry_is_kept_but_never_received_again() -> None:
    state, receiver, token = locked_first("later")
    state.settle(token, Outcome.DEFER)
    assert state.receive(receiver) is None
    assert state.counts("q").deferred == 1
    assert [d.sequence_number for d in state.peek("q", 1, 5)] == [1]


def test_1_a_deferred_entry_is_locked_by_its_number_and_deferred_again_when_the_lock_ends(
        ) -> None:
    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q", EntitySettings(lock_duration=5))
    state.send("q", [msg("a"), msg("b")])
    receiver = state.open_receiver("q")
    assert receiver is not None
    for _ in range(2):
        _, _, token = receive(state, receiver)
        assert token is not None
        state.settle(token, Outcome.DEFER)
    assert [d.state for d in state.peek("q", 0, 5)] == [MessageState.DEFERRED] * 2
    with pytest.raises(Refused) as refused:
        state.receive_deferred("q", [1, 3])  # all or nothing: 3 was never sent
    assert refused.value.condition == MESSAGE_NOT_FOUND
    [first] = state.receive_deferred("q", [1, 1])  # listed twice, handed out once
    assert (first.state, first.locked_until) == (MessageState.DEFERRED, 1_000_100 + 5)
    assert state.counts("q") == StoreCounts(available=0, locked=1, deferred=1)
    with pytest.raises(Refused):
        state.receive_deferred("q", [1])  # locked: not deferred now
    clock.now += 5
    state.expire()
    assert state.receive(receiver) is None  # the lapsed lock left it deferred, counted
    [again] = state.receive_deferred("q", [1])
    assert again.delivery_count == 1
    assert again.lock_token is not None
    state.settle(again.lock_token, Outcome.COMPLETE)
    [taken] = state.receive_deferred("q", [2], receive_and_delete=True)
    assert (taken.lock_token, state.peek("q", 0, 5)) == (None, [])


def test_8_a_deferred_entry_locked_when_saved_comes_back_deferred_and_counted() -> None:
    state, _, token = locked_first("a")
    state.settle(token, Outcome.DEFER)
    state.receive_deferred("q", [1])
    restored, _ = make_state()
    restored.restore(state.snapshot())
    assert restored.counts("q") == StoreCounts(available=0, locked=0, deferred=1)
    [again] = restored.receive_deferred("q", [1])
    assert again.delivery_count == 1


def test_1_a_session_s_deferred_entries_go_to_its_session_lock_holder_only() -> None:
    state, _ = make_state()
    state.create_queue("q", EntitySettings(requires_session=True))
    state.send("q", [msg("a", "s1"), msg("b", "s2")])
    for session in ("s1", "s2"):
        receiver = state.open_receiver("q", session=session)
        assert receiver is not None
        _, _, token = receive(state, receiver)
        assert token is not None
        state.settle(token, Outcome.DEFER)
        state.close_receiver(receiver)
    with pytest.raises(Refused) as refused:
        state.receive_deferred("q", [1], session_id="s1")
    assert refused.value.condition == SESSION_LOCK_LOST  # nobody holds s1
    holder = state.open_receiver("q", session="s1")
    assert holder is not None
    with pytest.raises(Refused):
        state.receive_deferred("q", [2], session_id="s1")
    [mine] = state.receive_deferred("q", [1], session_id="s1")
    assert mine.locked_until is None  # under the session's lock
    state.close_receiver(holder)
    assert state.counts("q").deferred == 2  # the session ended: deferred again


def test_6_a_scheduled_message_can_be_cancelled_until_its_time_comes() -> None:
    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q")
    wall = clock.now + 1_000_000
    numbers = state.send("q", [Message(b"x", scheduled_enqueue_time=wall + 30),
                               Message(b"y", scheduled_enqueue_time=wall + 30), msg("now")])
    assert [d.state for d in state.peek("q", 0, 5)] == [
        MessageState.SCHEDULED, MessageState.SCHEDULED, MessageState.ACTIVE]
    with pytest.raises(Refused) as refused:
        state.cancel_scheduled("q", [numbers[0], numbers[2]])  # 3 is not waiting
    assert refused.value.condition == MESSAGE_NOT_FOUND
    state.cancel_scheduled("q", [numbers[0]])
    clock.now += 30
    state.expire()
    receiver = state.open_receiver("q")
    assert receiver is not None
    assert [receive(state, receiver)[0] for _ in range(2)] == ["y", "now"]
    with pytest.raises(Refused):
        state.cancel_scheduled("q", [numbers[1]])  # enqueued: too late


def test_listing_sessions_gives_those_with_messages_or_state_or_updated_since() -> None:
    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q", EntitySettings(requires_session=True))
    state.create_queue("plain")
    state.send("q", [msg("a", "s-b"), msg("b", "s-a")])
    state.set_session_state("q", "s-c", b"kept")
    clock.now += 1
    state.set_session_state("q", "s-d", None)  # cleared: an update, but no state kept
    assert state.list_sessions("q") == ["s-a", "s-b", "s-c"]
    assert state.list_sessions("q", skip=1, top=1) == ["s-b"]
    assert state.list_sessions("q", updated_after=clock.now + 1_000_000 - 0.5) == ["s-d"]
    assert state.list_sessions("plain") == []


def test_receive_and_delete_removes_on_delivery_without_a_lock() -> None:
    state, _ = make_state()
    state.create_queue("q")
    state.send("q", [msg("a")])
    receiver = state.open_receiver("q", receive_and_delete=True)
    assert receiver is not None
    delivery = state.receive(receiver)
    assert delivery is not None
    assert (delivery.lock_token, delivery.locked_until) == (None, None)
    assert state.peek("q", 1, 10) == []


def test_a_session_has_one_receiver_and_next_session_takes_the_oldest_free_one() -> None:
    clock = Clock()
    state, woken = make_state(clock)
    state.create_queue("s", EntitySettings(requires_session=True, lock_duration=10))
    state.send("s", [msg("b1", "b"), msg("a1", "a"), msg("b2", "b")])
    first = state.open_receiver("s", session=NEXT_SESSION)
    assert first is not None
    assert first.session_id == "b"  # its head is the oldest
    with pytest.raises(Refused) as taken:
        state.open_receiver("s", session="b")
    assert taken.value.condition == SESSION_CANNOT_BE_LOCKED  # invariant 3
    second = state.open_receiver("s", session=NEXT_SESSION)
    assert second is not None
    assert second.session_id == "a"
    assert state.open_receiver("s", session=NEXT_SESSION) is None
    assert receive(state, first)[0] == "b1"
    assert receive(state, second)[0] == "a1"
    assert receive(state, first)[0] == "b2"
    woken.clear()
    state.close_receiver(first)  # its two locked entries come back, counted
    assert set(woken) == {"s"}
    again = state.open_receiver("s", session=NEXT_SESSION)
    assert again is not None
    assert [receive(state, again)[:2] for _ in range(2)] == [("b1", 1), ("b2", 1)]
    clock.now += 10
    assert state.expire() == [second, again]  # session locks end without renewal
    with pytest.raises(Refused):
        state.renew_session_lock(second)


def test_a_topic_copies_messages_to_the_subscriptions_whose_filter_they_pass() -> None:
    state, woken = make_state()
    state.create_topic("t")
    state.create_subscription("t", "all")
    state.create_subscription("t", "red", filters=[CorrelationFilter(properties={"c": "red"}),
                                                   CorrelationFilter(subject="urgent")])
    state.create_subscription("t", "none", filters=[])
    sent = [Message(b"1", properties={"subject": "urgent"}), msg("2", c="red"), msg("3")]
    assert state.send("t", sent) == [1, 2, 3]
    assert woken == ["t/Subscriptions/all", "t/Subscriptions/red"]
    assert [d.sequence_number for d in state.peek("t/Subscriptions/red", 0, 9)] == [1, 2]
    assert len(state.peek("t/Subscriptions/all", 0, 9)) == 3
    assert state.peek("t/Subscriptions/none", 0, 9) == []


def test_sending_is_refused_where_service_bus_refuses_it() -> None:
    state, _ = make_state()
    state.create_queue("s", EntitySettings(requires_session=True))
    state.create_topic("t")
    state.create_subscription("t", "x")
    refusals = {}
    for path, message in (("nope", msg("a")), ("t/Subscriptions/x", msg("a")),
                          ("s/$DeadLetterQueue", msg("a")), ("s", msg("no session"))):
        with pytest.raises(Refused) as refused:
            state.send(path, [message])
        refusals[path] = refused.value.condition
    assert refusals == {"nope": NOT_FOUND, "t/Subscriptions/x": NOT_ALLOWED,
                        "s/$DeadLetterQueue": NOT_ALLOWED, "s": NOT_ALLOWED}
    with pytest.raises(Refused):
        state.create_queue("S")  # names are case-insensitive
    with pytest.raises(Refused):
        state.open_receiver("s")  # a session entity needs a session receiver


def test_the_entities_document_of_the_command_line_creates_what_it_says() -> None:
    document = config.document_from_specs(
        queues=["orders:lock_duration=5,max_delivery_count=3", "jobs:sessions"],
        topics=["events"],
        subscriptions=["events/urgent:subject=urgent,property.region=eu", "other/all"])
    state, _ = make_state()
    config.apply(state, document)
    assert state.settings("orders") == EntitySettings(lock_duration=5, max_delivery_count=3)
    assert state.settings("jobs").requires_session
    state.send("events", [Message(b"u", properties={"subject": "urgent"},
                                  application_properties={"region": "eu"}),
                          Message(b"n", properties={"subject": "urgent"})])
    assert len(state.peek("events/Subscriptions/urgent", 0, 9)) == 1
    state.send("other", [msg("x")])
    assert len(state.peek("other/Subscriptions/all", 0, 9)) == 1
    for bad in (["q:colour=red"], [":lock_duration=1"]):
        with pytest.raises(ValueError, match=r"unknown option|no entity name"):
            config.document_from_specs(queues=bad)
    with pytest.raises(ValueError, match="TOPIC/NAME"):
        config.document_from_specs(subscriptions=["lonely"])


OPERATIONS = st.lists(st.tuples(
    st.sampled_from(["send", "receive", "complete", "abandon", "release", "dead-letter",
                     "defer", "deferred", "tick", "close"]),
    st.integers(0, 3)), max_size=60)


OUTCOMES = {"complete": Outcome.COMPLETE, "abandon": Outcome.ABANDON, "release": Outcome.RELEASE,
            "dead-letter": Outcome.DEAD_LETTER, "defer": Outcome.DEFER}


class Run:
    """One property-test run: a queue, its receivers, and what the test holds and settled."""

    def __init__(self, sessions: bool) -> None:
        self.clock = Clock()
        self.state, _ = make_state(self.clock)
        self.state.create_queue("q", EntitySettings(lock_duration=3, max_delivery_count=3,
                                                    requires_session=sessions))
        self.sessions = sessions
        self.receivers: list[Receiver] = []
        self.held: dict[uuid.UUID, Receiver] = {}
        self.sent = self.completed = 0

    def do(self, name: str, n: int) -> None:
        if name == "send":
            self.state.send("q", [msg(f"m{self.sent}", f"s{n % 2}" if self.sessions else None)])
            self.sent += 1
        elif name == "receive":
            self.receive(n)
        elif name == "deferred":
            self.receive_deferred(n)
        elif name == "tick":
            self.clock.now += n
            for lost in self.state.expire():
                self.receivers.remove(lost)
        elif name == "close" and self.receivers:
            self.state.close_receiver(self.receivers.pop(n % len(self.receivers)))
        elif name in OUTCOMES and self.held:
            self.settle(sorted(self.held)[n % len(self.held)], OUTCOMES[name])

    def receive(self, n: int) -> None:
        if len(self.receivers) <= n:
            receiver = self.state.open_receiver("q", session=NEXT_SESSION if self.sessions
                                                else None)
            if receiver is None:
                return
            self.receivers.append(receiver)
        receiver = self.receivers[min(n, len(self.receivers) - 1)]
        delivery = self.state.receive(receiver)
        if delivery is not None:
            assert delivery.lock_token is not None
            assert delivery.lock_token not in self.held  # invariant 2: one token, one delivery
            if self.sessions:
                assert delivery.message.session_id == receiver.session_id  # invariant 3
            self.held[delivery.lock_token] = receiver

    def receive_deferred(self, n: int) -> None:
        """A receiver takes the first deferred entry (of its session) by its number."""
        if not self.receivers:
            return
        receiver = self.receivers[n % len(self.receivers)]
        deferred = [d for d in self.state.peek("q", 0, 10_000, receiver.session_id)
                    if d.state is MessageState.DEFERRED]
        if not deferred:
            return
        try:
            [delivery] = self.state.receive_deferred(
                "q", [deferred[0].sequence_number], session_id=receiver.session_id)
        except Refused as refused:
            if refused.condition != MESSAGE_NOT_FOUND:  # else locked already: not deferred now
                raise
            return
        assert delivery.lock_token is not None
        assert delivery.lock_token not in self.held  # invariant 2
        self.held[delivery.lock_token] = receiver

    def settle(self, token: uuid.UUID, outcome: Outcome) -> None:
        del self.held[token]
        try:
            self.state.settle(token, outcome)
        except Refused:
            return  # its lock ended first (expiry, a closed session): stale, as it should be
        self.completed += outcome is Outcome.COMPLETE

    def check(self) -> None:
        counts = self.state.counts("q")
        letters = len(self.state.peek("q/$DeadLetterQueue", 0, 10_000))
        assert (counts.available + counts.locked + counts.deferred + letters + self.completed
                == self.sent)  # invariant 1: each message in one place, none lost
        numbers = [d.sequence_number for d in self.state.peek("q", 0, 10_000)]
        assert len(numbers) == len(set(numbers))


@settings(max_examples=150, deadline=None)
@given(OPERATIONS, st.booleans())
def test_no_message_is_lost_or_held_twice(operations: list[tuple[str, int]],
                                          sessions: bool) -> None:
    """Invariants 1, 2 and 3 under any mix of receives, settlements, expiries and closes."""
    run = Run(sessions)
    for name, n in operations:
        run.do(name, n)
        run.check()


def test_a_batch_is_unpacked_and_a_delivery_keeps_what_was_sent() -> None:
    proton = pytest.importorskip("proton")
    from sharedstream.testing.servicebus import wire  # noqa: PLC0415 - needs proton

    inner = [bytes(proton.Message(body=f"m{i}".encode(), properties={"i": i},
                                  group_id="s").encode()) for i in range(3)]
    data = proton.Data()
    for payload in inner:
        data.put_object(proton.Described(proton.ulong(0x75), payload))
    batch = bytes(data.encode())
    assert wire.unpack(batch) == inner
    single = bytes(proton.Message(body=b"plain").encode())
    assert wire.unpack(single) == [single]
    facts = wire.message_facts(inner[1])
    assert (facts.session_id, facts.application_properties) == ("s", {"i": 1})
    delivery = Delivery(facts, 7, 1.5, 2, uuid.uuid4(), 61.5, {"DeadLetterReason": "r"})
    out = proton.Message()
    out.decode(wire.delivery_bytes(delivery))
    assert (bytes(out.body), out.group_id, out.delivery_count) == (b"m1", "s", 2)
    assert out.properties == {"i": 1, "DeadLetterReason": "r"}
    assert out.annotations == {"x-opt-sequence-number": 7, "x-opt-enqueued-time": 1500,
                               "x-opt-locked-until": 61500}


def test_delivery_annotations_written_last_are_carried_and_go_out_second() -> None:
    """azure-servicebus writes delivery annotations after the body: a batch of such messages
    is still a batch, and a delivery carries the sender's annotations (binaries intact) with
    the lock token, in second place."""
    proton = pytest.importorskip("proton")
    from sharedstream.testing.servicebus import wire  # noqa: PLC0415 - needs proton

    def section(code: int, value: Any) -> bytes:
        data = proton.Data()
        data.put_object(proton.Described(proton.ulong(code), value))
        return bytes(data.encode())

    annotations = {proton.symbol("trace"): b"\x00abc", proton.symbol("n"): 3}
    message = section(0x75, b"body") + section(0x71, annotations)
    batch = section(0x75, message) + section(0x75, message)
    assert wire.unpack(batch) == [message, message]
    token = uuid.uuid4()
    out = wire.delivery_bytes(Delivery(wire.message_facts(message), 1, 1.5, 0, token, 61.5))
    assert [code for code, _, _ in wire.sections(out)] == [0x70, 0x71, 0x72, 0x75]
    received = proton.Message()
    received.decode(out)
    assert received.instructions == {**annotations, "x-opt-lock-token": token}
    unlocked = wire.delivery_bytes(Delivery(wire.message_facts(message), 1, 1.5, 0, None, None))
    assert wire.sections(unlocked)[1] == wire.sections(message)[1]


def test_a_message_without_delivery_annotations_goes_out_with_an_empty_section() -> None:
    """Service Bus always sends delivery annotations: an empty map in receive-and-delete
    (azure-servicebus's own live test reads ``{}`` there, not ``None``)."""
    proton = pytest.importorskip("proton")
    from sharedstream.testing.servicebus import wire  # noqa: PLC0415 - needs proton

    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(0x75), b"body"))
    message = bytes(data.encode())
    out = wire.delivery_bytes(Delivery(wire.message_facts(message), 1, 1.5, 0, None, None))
    assert [(code, value) for code, value, _ in wire.sections(out)][:2] == [
        (0x70, [None, None, None, None, 0]), (0x71, {})]
    received = proton.Message()
    received.decode(out)
    assert received.instructions == {}
    assert received.body == b"body"


def test_a_value_body_nested_thousands_deep_is_carried_byte_for_byte() -> None:
    """The server delimits a value body, never reads it: any depth arrives as it was sent.

    Proton's reader recurses once per level: a body 5,000 deep raised
    ``RecursionError`` in the server's handler and stopped the server.
    """
    proton = pytest.importorskip("proton")
    from sharedstream.testing.servicebus import wire  # noqa: PLC0415 - needs proton

    value = bytes([0x54, 1])  # smallint 1, in 5,000 one-item list32s
    for _ in range(5000):
        value = bytes([0xD0]) + (len(value) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") \
            + value
    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(0x74), {"region": "eu"}))
    body = bytes([0x00, 0x53, 0x77]) + value  # amqp-value
    sent = bytes(data.encode()) + body
    assert wire.unpack(sent) == [sent]
    facts = wire.message_facts(sent)
    assert facts.application_properties == {"region": "eu"}
    out = wire.delivery_bytes(Delivery(facts, 3, 1.5, 0, uuid.uuid4(), 61.5))
    assert out.endswith(body)


def test_the_management_node_answers_renew_lock_per_token_with_one_status() -> None:
    """The wire of ``com.microsoft:renew-lock``: ``lock-tokens`` an array of uuids in,
    ``expirations`` an array of timestamps out (one per token, in order); 410
    ``message-lock-lost`` for a stale token, 400 for an empty list."""
    proton = pytest.importorskip("proton")
    from sharedstream.testing.servicebus.management import Management  # noqa: PLC0415

    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q", EntitySettings(lock_duration=5))
    state.send("q", [msg("a"), msg("b")])
    receiver = state.open_receiver("q")
    assert receiver is not None
    a, b = receive(state, receiver)[2], receive(state, receiver)[2]
    assert a is not None
    assert b is not None
    node = Management(state)

    def renew(*tokens: uuid.UUID) -> Any:
        request = proton.Message(
            properties={"operation": "com.microsoft:renew-lock"},
            body={"lock-tokens": proton.Array(proton.UNDESCRIBED, proton.Data.UUID, *tokens)})
        answer = proton.Message()
        answer.decode(node.answer("q", request).encode())  # as it goes on the wire
        return answer

    clock.now = 102
    answer = renew(b, a)
    assert answer.properties["statusCode"] == 200
    expirations = answer.body["expirations"]
    assert isinstance(expirations, proton.Array)
    assert expirations.type == proton.Data.TIMESTAMP
    assert list(expirations.elements) == [(1_000_102 + 5) * 1000] * 2
    state.settle(a, Outcome.COMPLETE)
    lost = renew(b, a)
    assert (lost.properties["statusCode"], lost.properties["errorCondition"]) == (
        410, "com.microsoft:message-lock-lost")
    empty = renew()
    assert (empty.properties["statusCode"], empty.properties["errorCondition"]) == (
        400, "com.microsoft:argument-error")


# -- scheduled messages, time to live, duplicate detection (invariants 6 and 7) ---------------


def test_6_a_scheduled_message_waits_for_its_time_then_is_delivered() -> None:
    clock = Clock()
    state, woken = make_state(clock)
    state.create_queue("q")
    wall = clock.now + 1_000_000
    later = Message(b"later", scheduled_enqueue_time=wall + 30)
    assert state.send("q", [later, msg("now")]) == [1, 2]
    receiver = state.open_receiver("q")
    assert receiver is not None
    assert receive(state, receiver)[0] == "now"
    assert state.receive(receiver) is None
    assert [d.sequence_number for d in state.peek("q", 0, 10)] == [1, 2]
    assert state.next_due() == pytest.approx(clock.now + 30)
    clock.now += 29.9
    state.expire()
    assert state.receive(receiver) is None
    clock.now += 0.1
    woken.clear()
    state.expire()
    assert woken == ["q"]
    delivery = state.receive(receiver)
    assert delivery is not None
    assert (delivery.message.encoded, delivery.enqueued_time) == (b"later", wall + 30)


@pytest.mark.parametrize("dead_letter", [False, True])
def test_6_an_expired_message_is_never_delivered_and_dead_lettered_if_asked(
        dead_letter: bool) -> None:
    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q", EntitySettings(dead_lettering_on_message_expiration=dead_letter))
    state.send("q", [Message(b"short", time_to_live=5), Message(b"long", time_to_live=60)])
    clock.now += 5
    receiver = state.open_receiver("q")
    assert receiver is not None
    assert receive(state, receiver)[0] == "long"
    letters = state.open_receiver("q/$DeadLetterQueue")
    assert letters is not None
    clock.now += 3600  # a dead letter does not expire
    letter = state.receive(letters)
    if not dead_letter:
        assert letter is None
        return
    assert letter is not None
    assert letter.message.encoded == b"short"
    assert letter.extra_properties["DeadLetterReason"] == TTL_EXPIRED


def test_7_a_queue_drops_a_message_id_it_accepted_within_its_window() -> None:
    clock = Clock()
    state, _ = make_state(clock)
    state.create_queue("q", EntitySettings(duplicate_detection_window=60))
    state.create_queue("plain")

    def with_id(body: str, message_id: str) -> Message:
        return Message(body.encode(), None, {"message_id": message_id})

    assert state.send("q", [with_id("a", "1"), with_id("again", "1"), with_id("b", "2")]) == [1, 2]
    clock.now += 59
    assert state.send("q", [with_id("late", "1")]) == []
    clock.now += 1
    assert state.send("q", [with_id("past the window", "1")]) == [3]
    assert state.send("plain", [with_id("a", "1"), with_id("a", "1")]) == [1, 2]
    assert [d.message.encoded for d in state.peek("q", 0, 10)] == [b"a", b"b", b"past the window"]


def test_the_command_line_specs_take_the_expiry_and_duplicate_settings() -> None:
    document = config.document_from_specs(
        ["once:duplicate_detection_window=600,dead_lettering_on_message_expiration"])
    state = ServiceBusState()
    config.apply(state, document)
    assert state.settings("once") == EntitySettings(dead_lettering_on_message_expiration=True,
                                                    duplicate_detection_window=600)
    with pytest.raises(ValueError, match="duplicate detection is a queue's setting"):
        config.apply(ServiceBusState(), {"topics": [{"name": "t", "subscriptions": [
            {"name": "s", "duplicate_detection_window": 60}]}]})
