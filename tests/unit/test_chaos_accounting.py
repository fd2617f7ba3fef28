"""The chaos suites' accounting finds every kind of discrepancy it is there to find."""

from __future__ import annotations

import pytest

from tests.chaos_accounting import (
    IN_BROKER,
    IN_STORE,
    DeadLetterRecord,
    Expected,
    ExpectedDeadLetter,
    Reality,
    StoredEvent,
    assert_exact,
    compare,
    parse_idem_key,
)


def test_idempotency_keys_parse_for_kafka_and_sqs_names() -> None:
    assert parse_idem_key(3, "3/orders/0/17#0") == StoredEvent(3, "orders/0/17", 0)
    assert parse_idem_key(12, "12/a1b2-c3#4") == StoredEvent(12, "a1b2-c3", 4)
    assert parse_idem_key(1, None) == StoredEvent(1, None, 0)
    with pytest.raises(AssertionError, match="unexpected idempotency key"):
        parse_idem_key(2, "3/orders/0/17#0")


def expected() -> Expected:
    return Expected(
        events={1: {"t/0/0", "t/0/1", "t/0/2"}, 2: {"t/0/0", "t/0/2"}},
        dead_letters={"t/0/1": ExpectedDeadLetter("max_redeliveries", triggers=frozenset({2}),
                                                  detail="boom")},
    )


def exact() -> Reality:
    return Reality(
        events=[StoredEvent(1, "t/0/0", 0), StoredEvent(1, "t/0/1", 0),
                StoredEvent(1, "t/0/2", 0), StoredEvent(2, "t/0/0", 0),
                StoredEvent(2, "t/0/2", 0)],
        dead_letters=[DeadLetterRecord("t/0/1", "max_redeliveries", IN_BROKER,
                                       triggers=frozenset({2}), detail="RuntimeError: boom")],
    )


def test_an_exact_outcome_has_no_problems() -> None:
    assert compare(expected(), exact()) == []
    assert_exact(expected(), exact(), "ok")


def test_lost_duplicated_unexpected_and_unkeyed_events_are_named() -> None:
    reality = exact()
    reality.events.remove(StoredEvent(2, "t/0/2", 0))
    reality.events += [StoredEvent(1, "t/0/0", 0), StoredEvent(2, "t/0/1", 0),
                       StoredEvent(2, None, 0)]
    problems = "\n".join(compare(expected(), reality))
    assert "trigger 2: LOST 1 of 2 events (stored 1): t/0/2" in problems
    assert "trigger 1: 1 records stored more than once: t/0/0 x2" in problems
    assert "trigger 2: 1 unexpected events (records it must not store): t/0/1" in problems
    assert "trigger 2: 1 events without an idempotency key" in problems
    with pytest.raises(AssertionError, match=r"^case B: 7 events stored, 5 expected"):
        assert_exact(expected(), reality, "case B")


def test_dead_letters_are_counted_once_over_broker_and_store() -> None:
    reality = exact()
    reality.dead_letters += [
        DeadLetterRecord("t/0/1", "max_redeliveries; the DLQ refused it", IN_STORE),
        DeadLetterRecord("t/0/0", "rejected", IN_BROKER),
    ]
    problems = "\n".join(compare(expected(), reality))
    assert "t/0/1: dead-lettered 2 times" in problems
    assert "dead-lettered but should not be (1): t/0/0 (rejected, broker)" in problems

    reality = exact()
    reality.dead_letters = []
    assert compare(expected(), reality) == [
        "NOT dead-lettered (1 of 1): t/0/1 (max_redeliveries)"]


def test_a_dead_letter_must_be_where_and_what_was_intended() -> None:
    reality = exact()
    reality.dead_letters = [DeadLetterRecord("t/0/1", "rejected", IN_STORE,
                                             triggers=frozenset({1, 2}), detail="other")]
    problems = "\n".join(compare(expected(), reality))
    assert "t/0/1: dead-lettered in the store, expected in the broker" in problems
    assert "t/0/1: dead-letter reason 'rejected', expected 'max_redeliveries'" in problems
    assert "names triggers [1, 2], expected [2]" in problems
    assert "lacks 'boom'" in problems


def test_a_reason_may_carry_an_explanation() -> None:
    reality = exact()
    reality.dead_letters = [DeadLetterRecord(
        "t/0/1", "max_redeliveries; the topic refused it: too large", IN_BROKER,
        triggers=frozenset({2}), detail="boom")]
    assert compare(expected(), reality) == []
    reality.dead_letters = [DeadLetterRecord("t/0/1", "max_redeliveries_x", IN_BROKER,
                                             triggers=frozenset({2}), detail="boom")]
    assert compare(expected(), reality) != []
