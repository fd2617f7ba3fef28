"""The resolution book as a pure state machine: no event loop anywhere here."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from sharedstream import AckTimeout, AdvanceOutcome, SubscriberOverflow
from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.fanout import FanOut
from sharedstream.engine.resolution import ResolutionBook


def make_book(capacity: int = 8, ack_timeout: float = 10.0) -> ResolutionBook:
    return ResolutionBook(key=("k",), fanout=FanOut(capacity), ack_timeout=ack_timeout)


def outcomes(book: ResolutionBook, lane: Hashable = None) -> list[tuple[object, AdvanceOutcome]]:
    return [(item.broker_payload, item.outcome) for item in book.take_batch(lane)]


def pull(book: ResolutionBook, sub: AckSubscriber) -> object:
    record = book.next_record(sub)
    return None if record is None else record.raw


def test_event_resolves_when_every_snapshot_subscriber_moves_past_it() -> None:
    book = make_book()
    a, b = book.add_subscriber("a"), book.add_subscriber("b")
    book.broadcast("e0", 0, None, now=0.0)
    assert pull(book, a) == "e0"
    assert pull(book, b) == "e0"
    assert not book.ready  # both still hold their window open
    pull(book, a)
    assert not book.ready
    pull(book, b)
    assert outcomes(book) == [(0, AdvanceOutcome(acked=2, failed=0, rejected=0))]


def test_snapshot_is_frozen_at_fan_out() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    late = book.add_subscriber("late")
    pull(book, a)
    pull(book, a)
    assert outcomes(book) == [(0, AdvanceOutcome(1, 0, 0))]
    assert pull(book, late) is None  # never saw e0


def test_zero_subscriber_broadcast_is_advanced_but_not_clean() -> None:
    book = make_book()
    book.broadcast("e0", 0, None, now=0.0)
    [(payload, outcome)] = outcomes(book)
    assert payload == 0
    assert outcome == AdvanceOutcome(0, 0, 0)
    assert not outcome.is_clean


def test_persistence_gate_holds_ack_until_every_bound_seq_is_confirmed() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    s1, s2 = book.bind(a), book.bind(a)
    assert s1 is not None
    assert s2 is not None
    pull(book, a)  # moved past, but two events are unconfirmed
    assert not book.ready
    book.confirm(a, s1)
    assert not book.ready
    book.confirm(a, s2)
    assert outcomes(book) == [(0, AdvanceOutcome(1, 0, 0))]
    assert not book.router.unconfirmed()


def test_out_of_order_confirmations_hold_the_ack_until_the_last_one() -> None:
    """A confirmed seq trimmed off the front with a hole after it is still owed by its record."""
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    first, middle, last = book.bind(a), book.bind(a), book.bind(a)
    assert first is not None
    assert middle is not None
    assert last is not None
    book.confirm(a, middle)  # before moving past: a hole in the ledger
    pull(book, a)
    book.confirm(a, first)  # trims the front past the hole
    assert not book.ready, "the last event is not stored yet"
    book.confirm(a, last)
    assert outcomes(book) == [(0, AdvanceOutcome(1, 0, 0))]
    assert not book.router.unconfirmed()


def test_confirmation_before_moving_past_still_needs_the_move() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    seq = book.bind(a)
    assert seq is not None
    book.confirm(a, seq)
    assert not book.ready
    pull(book, a)
    assert outcomes(book) == [(0, AdvanceOutcome(1, 0, 0))]


def test_bind_without_open_window_gates_nothing() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    assert book.bind(a) is None


def test_reject_resolves_at_once_and_drops_bound_seqs() -> None:
    book = make_book()
    a, b = book.add_subscriber("a"), book.add_subscriber("b")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    pull(book, b)
    seq = book.bind(a)
    assert book.reject(a)
    assert seq not in book.router.unconfirmed()
    assert book.bind(a) is None  # the window is resolved
    assert not book.reject(a)  # a second reject has nothing to act on
    pull(book, b)
    assert outcomes(book) == [(0, AdvanceOutcome(acked=1, failed=0, rejected=1))]


def test_unsubscribe_fails_unpulled_events_and_acks_the_open_window() -> None:
    book = make_book()
    a, b = book.add_subscriber("a"), book.add_subscriber("b")
    for i in range(3):
        book.broadcast(f"e{i}", i, None, now=0.0)
    for _ in range(4):
        pull(book, b)  # b resolves all three
    pull(book, a)  # a is on e0; e1 and e2 are still queued for it
    book.remove_subscriber("a")
    assert outcomes(book) == [
        (0, AdvanceOutcome(2, 0, 0)),
        (1, AdvanceOutcome(1, 1, 0)),
        (2, AdvanceOutcome(1, 1, 0)),
    ]


def test_departed_subscriber_still_gates_on_its_unconfirmed_events() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    seq = book.bind(a)
    assert seq is not None
    book.remove_subscriber("a")
    assert not book.ready
    book.confirm(a, seq)
    assert outcomes(book) == [(0, AdvanceOutcome(1, 0, 0))]


def test_overflow_fails_only_the_full_subscriber_and_counts_the_event() -> None:
    book = make_book(capacity=2)
    slow, fast = book.add_subscriber("slow"), book.add_subscriber("fast")
    for i in range(2):
        book.broadcast(i, i, None, now=0.0)
        pull(book, fast)
    overflowed = book.broadcast(2, 2, None, now=0.0)
    assert overflowed == [slow]
    assert isinstance(slow.error, SubscriberOverflow)
    assert not slow.inbox
    pull(book, fast)
    pull(book, fast)
    assert [outcome for _, outcome in outcomes(book)] == [AdvanceOutcome(1, 1, 0)] * 3
    book.broadcast(3, 3, None, now=0.0)  # excluded from later snapshots
    pull(book, fast)
    pull(book, fast)
    assert [outcome for _, outcome in outcomes(book)] == [AdvanceOutcome(1, 0, 0)]


def test_lanes_advance_independently_in_fan_out_order() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("x0", "x0", "x", now=0.0)
    book.broadcast("y0", "y0", "y", now=0.0)
    book.broadcast("x1", "x1", "x", now=0.0)
    pull(book, a)  # on x0
    seq = book.bind(a)  # x0 is gated on persistence
    assert seq is not None
    pull(book, a)  # on y0
    pull(book, a)  # on x1, y0 resolved
    pull(book, a)  # x1 resolved; x0 still gated
    assert list(book.ready) == ["y"]
    assert outcomes(book, "y") == [("y0", AdvanceOutcome(1, 0, 0))]
    assert outcomes(book, "x") == []  # x1 waits behind x0
    book.confirm(a, seq)
    assert [p for p, _ in outcomes(book, "x")] == ["x0", "x1"]
    assert not book.lanes


def test_unhashable_lane_raises_before_changing_anything() -> None:
    book = make_book()
    book.add_subscriber("a")
    with pytest.raises(TypeError):
        book.broadcast("e0", 0, ["not", "hashable"], now=0.0)  # type: ignore[arg-type]
    assert not book.lanes
    assert book.outstanding() == 0


def test_ack_timeout_boundary_is_inclusive_and_fails_only_the_holder() -> None:
    book = make_book(ack_timeout=5.0)
    slow, quick = book.add_subscriber("slow"), book.add_subscriber("quick")
    book.broadcast("e0", 0, None, now=100.0)
    book.broadcast("e1", 1, None, now=101.0)
    for _ in range(3):
        pull(book, quick)
    pull(book, slow)  # slow sits on e0 and still has e1 queued
    assert book.next_deadline() == 105.0
    assert book.expire(104.999) == []
    expired = book.expire(105.0)
    assert [(sub.trigger_id, record.position) for sub, record in expired] == [("slow", 0)]
    assert isinstance(slow.error, AckTimeout)
    assert [o for _, o in outcomes(book)] == [AdvanceOutcome(1, 1, 0), AdvanceOutcome(1, 1, 0)]
    assert book.next_deadline() is None
    assert quick.error is None


def test_ack_timeout_covers_unconfirmed_persistence_of_departed_subscriber() -> None:
    book = make_book(ack_timeout=1.0)
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    seq = book.bind(a)
    book.remove_subscriber("a")
    assert [s.trigger_id for s, _ in book.expire(1.0)] == ["a"]
    assert seq not in book.router.unconfirmed()
    assert outcomes(book) == [(0, AdvanceOutcome(0, 1, 0))]


def test_terminate_hands_error_to_everyone_and_forgets_seqs() -> None:
    book = make_book()
    a = book.add_subscriber("a")
    book.broadcast("e0", 0, None, now=0.0)
    pull(book, a)
    book.bind(a)
    error = RuntimeError("broker gone")
    book.terminate(error)
    assert a.error is error
    assert not book.router.unconfirmed()
    assert book.next_record(a) is None
    assert not book.fanout.live


def test_failing_one_of_two_identical_inboxes_keeps_the_other_live() -> None:
    book = make_book()
    a, b = book.add_subscriber("a"), book.add_subscriber("b")
    book.broadcast("e0", 0, None, now=0.0)  # both inboxes now hold the same record
    book.fail(b, RuntimeError("forced"))
    assert book.fanout.live == [a]
    book.broadcast("e1", 1, None, now=0.0)
    assert [r.raw for r in a.inbox] == ["e0", "e1"]
    assert not b.inbox


def test_prefiltered_subscriber_does_not_owe_what_it_declined() -> None:
    book = make_book()
    picky = book.add_subscriber("picky", lambda raw: raw != "e1")
    other = book.add_subscriber("other")
    records = [book.broadcast(f"e{n}", n, n, now=0.0) for n in range(3)]
    assert records == [None, None, None]  # nobody overflowed
    assert [r.raw for r in picky.inbox] == ["e0", "e2"]
    e0, e1, e2 = list(other.inbox)
    assert picky.owes(e0)
    assert picky.owes(e2)
    assert not picky.owes(e1)  # a gap in its inbox: declined, acked at broadcast
    assert (e1.acked, e1.pending) == (1, 1)
    for _ in range(3):
        pull(book, other)  # past e0 and e1, window open on e2
    assert outcomes(book, 1) == [(1, AdvanceOutcome(2, 0, 0))]
    assert outcomes(book, 0) == []  # picky has not pulled e0 yet


def test_a_declined_record_still_fails_for_a_subscriber_that_overflows() -> None:
    book = make_book(capacity=1)
    picky = book.add_subscriber("picky", lambda raw: raw != "skip")
    assert book.broadcast("e0", 0, None, now=0.0) is None
    assert book.broadcast("skip", 1, None, now=0.0) is None  # declined: no overflow
    [overflowed] = book.broadcast("e2", 2, None, now=0.0) or []
    assert overflowed is picky
    assert isinstance(picky.error, SubscriberOverflow)


def test_failures_of_events_a_subscriber_never_pulled_are_unseen() -> None:
    book = make_book()
    dies = book.add_subscriber("dies")
    book.add_subscriber("left")
    for n in range(3):
        book.broadcast(f"e{n}", n, n, now=0.0)
    assert pull(book, dies) == "e0"  # its filter is on e0 when it raises
    book.fail(dies, RuntimeError("filter raised"))
    book.remove_subscriber("left")  # leaves with all three still queued
    [(_, first)] = outcomes(book, 0)
    assert first == AdvanceOutcome(0, 2, 0)
    assert first.unseen == 1  # "left" never had e0; "dies" failed on it
    for lane in (1, 2):
        [(_, later)] = outcomes(book, lane)
        assert later == AdvanceOutcome(0, 2, 0)
        assert later.unseen == 2  # nobody's filter had e1 or e2: not their fault
    assert "unseen=2" in repr(later)


def test_overflow_failures_are_unseen_and_clean_outcomes_have_none() -> None:
    book = make_book(capacity=1)
    slow = book.add_subscriber("slow")
    quick = book.add_subscriber("quick")
    book.broadcast("e0", 0, 0, now=0.0)
    pull(book, quick)  # quick keeps up; slow does not
    book.broadcast("e1", 1, 1, now=0.0)  # slow's inbox is full: it overflows on e1
    assert isinstance(slow.error, SubscriberOverflow)
    pull(book, quick)
    pull(book, quick)
    [(_, e1)] = outcomes(book, 1)
    assert (e1, e1.unseen) == (AdvanceOutcome(1, 1, 0), 1)
    clean = make_book()
    sub = clean.add_subscriber("s")
    clean.broadcast("e0", 0, None, now=0.0)
    pull(clean, sub)
    pull(clean, sub)
    [(_, outcome)] = outcomes(clean)
    assert (outcome.is_clean, outcome.unseen) == (True, 0)
