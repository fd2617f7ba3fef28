"""A watcher's "skipped" count: the raw events its prefilter declined, and only those.

Pure bookkeeping (no event loop): a resolution book and its fan-out, read
through the status views' ``watcher_counts``.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import SimpleNamespace
from typing import Any

from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.fanout import PASS_ALL, FanOut, KeyedPrefilter
from sharedstream.engine.resolution import ResolutionBook
from sharedstream.runtime.ops_view import watcher_counts


def make_book(capacity: int = 64) -> ResolutionBook:
    return ResolutionBook(key=("k",), fanout=FanOut(capacity), ack_timeout=10.0)


def parity(raw: Any) -> Any:
    return PASS_ALL if raw is None else raw % 2


def keyed(wanted: int) -> KeyedPrefilter:
    return KeyedPrefilter("parity", parity, wanted)


def feed(book: ResolutionBook, raws: list[Any]) -> None:
    for index, raw in enumerate(raws):
        book.broadcast(raw, index, None, now=0.0)


def drain(book: ResolutionBook, sub: AckSubscriber) -> list[Any]:
    """Pull everything queued for ``sub``: what reached its filter."""
    got = []
    while (record := book.next_record(sub)) is not None:
        got.append(record.raw)
    return got


def counts(book: ResolutionBook, trigger_id: Hashable) -> tuple[int, int]:
    found = watcher_counts(SimpleNamespace(book=book), trigger_id)
    return found["seen"], found["skipped"]


def test_a_keyed_prefilter_counts_what_it_declines_and_not_what_it_delivers() -> None:
    book = make_book()
    even, odd = book.add_subscriber("even", keyed(0)), book.add_subscriber("odd", keyed(1))
    everything = book.add_subscriber("everything")
    feed(book, [0, 1, 2, 3, 4, None, 6])  # None: undecodable, passed to every filter
    assert drain(book, even) == [0, 2, 4, None, 6]
    assert drain(book, odd) == [1, 3, None]
    assert len(drain(book, everything)) == 7
    assert counts(book, "even") == (7, 2)
    assert counts(book, "odd") == (7, 4)
    assert counts(book, "everything") == (7, 0)


def test_skipped_counts_only_since_joining_and_only_while_tests_are_asked() -> None:
    book = make_book()
    book.add_subscriber("plain")
    feed(book, [1, 3])  # no test anywhere: the fast path, nothing declined
    book.add_subscriber("even", keyed(0))
    feed(book, [5, 6, 7])
    assert counts(book, "plain") == (5, 0)
    assert counts(book, "even") == (3, 2)


def test_one_test_among_other_shapes_and_plain_tests_counts_the_same() -> None:
    book = make_book()
    book.add_subscriber("even", keyed(0))
    book.add_subscriber("small", lambda raw: raw < 3)  # a plain test: the general path
    book.add_subscriber("ends_in_5", KeyedPrefilter("last digit", lambda raw: raw % 10, 5))
    feed(book, list(range(10)))
    assert counts(book, "even") == (10, 5)
    assert counts(book, "small") == (10, 7)
    assert counts(book, "ends_in_5") == (10, 9)


def test_a_prefilter_that_raises_declines_nothing_from_then_on() -> None:
    book = make_book()

    def picky(raw: int) -> bool:
        if raw == 2:
            raise ValueError("cannot tell")
        return raw == 0

    sub = book.add_subscriber("picky", picky)
    feed(book, [0, 1, 2, 3, 4])
    assert drain(book, sub) == [0, 2, 3, 4]  # switched off at 2: it gets everything
    assert counts(book, "picky") == (5, 1)


def test_a_dropped_subscriber_stops_counting() -> None:
    book = make_book()
    sub = book.add_subscriber("even", keyed(0))
    book.add_subscriber("other", keyed(1))
    feed(book, [1, 3])
    book.fanout.drop(sub)  # no longer live (as when it fails): nothing more is declined
    feed(book, [5, 7])
    assert book.fanout.declined(sub) == 2
