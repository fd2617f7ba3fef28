"""Dead letters kept by every store backend: round trip, truncation, idempotency, order,
migration from schema version 1."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import count

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sharedstream.engine.producer import DeadLetter
from sharedstream.store import (
    StoreError,
    StoreWriteError,
)
from sharedstream.store._rows import storable_text
from sharedstream.store.base import DEAD_LETTER_PAYLOAD_LIMIT, DeadLetterRow, MetadataStore
from tests.store.conftest import ALL_VERSIONS, LATEST, Backend

_REFUSE = {
    "sqlite": ("CREATE TRIGGER refuse BEFORE INSERT ON dead_letters"
               " BEGIN SELECT RAISE(ABORT, 'disk is full'); END",),
    "postgres": ("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql"
                 " AS $$ BEGIN RAISE EXCEPTION 'disk is full'; END $$",
                 "CREATE TRIGGER refuse BEFORE INSERT ON dead_letters"
                 " FOR EACH ROW EXECUTE FUNCTION refuse()"),
}


def letter(
    source: str = "orders/0/42",
    *,
    stream: str = "kafka orders",
    reason: str = "rejected; dead-letter topic refused it: MessageSizeTooLargeError",
    payload: bytes = b'{"id": 42}',
    triggers: tuple[str, ...] = ("3", "7"),
    headers: tuple[tuple[str, bytes], ...] = (),
) -> DeadLetter:
    return DeadLetter(stream, source, reason, triggers, payload, headers)


def test_a_letter_round_trips(store: MetadataStore) -> None:
    typed: MetadataStore = store
    headers = (("trace-id", b"\x00\xff\x10"), ("retry", b"1"), ("retry", b"2"), ("empty", b""))
    before = datetime.now(UTC)
    assert typed.add_dead_letter(letter(headers=headers)) is True
    after = datetime.now(UTC)
    [row] = typed.dead_letters(10)
    assert row == DeadLetterRow(
        id=1,
        created_at=row.created_at,
        stream="kafka orders",
        source="orders/0/42",
        reason="rejected; dead-letter topic refused it: MessageSizeTooLargeError",
        triggers=("3", "7"),
        payload=b'{"id": 42}',
        payload_size=10,
        headers=headers,
    )
    assert row.created_at.tzinfo is not None
    assert before <= row.created_at <= after
    assert not row.truncated


def test_a_payload_over_the_limit_is_cut_and_its_size_kept(store: MetadataStore) -> None:
    assert DEAD_LETTER_PAYLOAD_LIMIT == 256 * 1024
    big = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # a 3 MiB record
    store.add_dead_letter(letter("big", payload=big))
    store.add_dead_letter(letter("exact", payload=big[:DEAD_LETTER_PAYLOAD_LIMIT]))
    store.add_dead_letter(letter("empty", payload=b""))
    empty, exact, cut = store.dead_letters(10)
    assert cut.payload == big[:DEAD_LETTER_PAYLOAD_LIMIT]
    assert (cut.payload_size, cut.truncated) == (len(big), True)
    assert exact.payload == big[:DEAD_LETTER_PAYLOAD_LIMIT]
    assert (exact.payload_size, exact.truncated) == (DEAD_LETTER_PAYLOAD_LIMIT, False)
    assert (empty.payload, empty.payload_size, empty.truncated) == (b"", 0, False)


def test_the_same_stream_source_and_reason_are_kept_once(store: MetadataStore) -> None:
    assert store.add_dead_letter(letter(payload=b"first", triggers=("3",))) is True
    # a redelivery after a crash: the same letter again, even with other details
    assert store.add_dead_letter(letter(payload=b"second", triggers=("3", "9"))) is False
    [row] = store.dead_letters(10)
    assert (row.payload, row.triggers) == (b"first", ("3",))
    # any part of the identity that differs makes a new letter
    assert store.add_dead_letter(letter(reason="poison: 5 failed deliveries")) is True
    assert store.add_dead_letter(letter(stream="kafka refunds")) is True
    assert store.add_dead_letter(letter(source="orders/0/43")) is True
    assert len(store.dead_letters(10)) == 4


def test_newest_first_limited_and_filtered_by_stream(store: MetadataStore) -> None:
    for offset in range(5):
        stream = "kafka orders" if offset % 2 == 0 else "sqs refunds"
        store.add_dead_letter(letter(f"m{offset}", stream=stream))
    assert [r.source for r in store.dead_letters(10)] == ["m4", "m3", "m2", "m1", "m0"]
    assert [r.source for r in store.dead_letters(2)] == ["m4", "m3"]
    assert [r.source for r in store.dead_letters(10, stream="kafka orders")] == ["m4", "m2", "m0"]
    assert [r.source for r in store.dead_letters(1, stream="sqs refunds")] == ["m3"]
    assert store.dead_letters(10, stream="kafka nothing") == []
    assert store.dead_letters(0) == []
    rows = store.dead_letters(10)
    assert [r.id for r in rows] == sorted((r.id for r in rows), reverse=True)
    assert [r.created_at for r in rows] == sorted((r.created_at for r in rows), reverse=True)
    with pytest.raises(ValueError, match="limit"):
        store.dead_letters(-1)


def test_a_failed_write_keeps_nothing_and_is_retryable(
    store: MetadataStore, backend: Backend
) -> None:
    for statement in _REFUSE[backend.name]:
        backend.execute(statement)
    with pytest.raises(StoreWriteError, match="disk is full") as info:
        store.add_dead_letter(letter())
    assert info.value.retryable
    assert isinstance(info.value.__cause__, backend.driver_error)
    assert store.dead_letters(10) == []
    backend.execute("DROP TRIGGER refuse" + (" ON dead_letters" if backend.name == "postgres"
                                             else ""))
    assert store.add_dead_letter(letter()) is True  # the retry succeeds


def test_a_closed_store_refuses_dead_letters(backend: Backend) -> None:
    s = backend.open()
    s.migrate()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.add_dead_letter(letter())
    with pytest.raises(StoreError, match="closed"):
        s.dead_letters(10)


def test_a_database_at_schema_version_1_is_upgraded(backend: Backend) -> None:
    with backend.at_version(1) as old:
        trigger_id = backend.insert_old_trigger()
        backend.insert_old_event(trigger_id, "k")
        with pytest.raises(StoreError):  # no dead_letters table yet
            old.dead_letters(10)
    with backend.open() as new:
        assert new.schema_status().current == 1
        assert new.migrate() == LATEST
        assert new.counts()["trigger_events"] == 1  # what version 1 held is still there
        assert new.dead_letters(10) == []
        assert new.add_dead_letter(letter()) is True
        assert new.add_dead_letter(letter()) is False
        assert [r.source for r in new.dead_letters(10)] == ["orders/0/42"]
    assert backend.query("SELECT version FROM schema_version ORDER BY version") == ALL_VERSIONS


# Any text at all, NUL and lone surrogates included: stream, source and reason keep it
# but those (storable_text); JSON-encoded fields keep everything.
_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)


def test_any_letter_round_trips(backend: Backend) -> None:
    sources = count()
    headers_st = st.lists(st.tuples(_TEXT, st.binary(max_size=64)), max_size=5)
    with backend.open() as store:
        store.migrate()

        @settings(max_examples=60, deadline=None)
        @given(
            stream=_TEXT,
            reason=_TEXT,
            triggers=st.lists(_TEXT, max_size=4).map(tuple),
            payload=st.binary(max_size=2048),
            headers=headers_st.map(tuple),
        )
        @example(stream="orders\x00", reason="bad \ud800 text", triggers=("\udfff",),
                 payload=b"", headers=(("h\ud800", b"v"),))
        def check(
            stream: str,
            reason: str,
            triggers: tuple[str, ...],
            payload: bytes,
            headers: tuple[tuple[str, bytes], ...],
        ) -> None:
            source = f"m{next(sources)}\ud800"
            sent = DeadLetter(stream, source, reason, triggers, payload, headers)
            assert store.add_dead_letter(sent) is True
            [row] = store.dead_letters(1)
            assert (row.stream, row.source, row.reason) == (
                storable_text(stream), storable_text(source), storable_text(reason))
            assert (row.triggers, row.payload, row.headers) == (triggers, payload, headers)
            assert row.payload_size == len(payload)

        check()


def test_redrives_are_recorded_and_letters_found_by_id(store: MetadataStore) -> None:
    for n in range(3):
        store.add_dead_letter(DeadLetter(stream="kafka orders", source=f"orders/0/{n}",
                                         reason="too big", triggers=("1",), payload=b"x"))
    first, _, third = sorted(row.id for row in store.dead_letters(10))
    assert [r.id for r in store.dead_letters(10, ids=[third, first])] == [third, first]
    assert store.mark_redriven([first, third, 999]) == 2
    store.mark_redriven([first])
    rows = {r.id: r for r in store.dead_letters(10)}
    assert (rows[first].redrives, rows[third].redrives) == (2, 1)
    assert rows[first].redriven_at is not None
    assert [r.redrives for r in store.dead_letters(10, stream="kafka orders", ids=[third])] == [1]


def test_the_letters_a_trigger_caused_are_read_by_id_in_pages(store: MetadataStore) -> None:
    typed: MetadataStore = store
    kept = [letter("m1", triggers=("3",)), letter("m2", triggers=("13",)),
            letter("m3", triggers=("7", "3")), letter("m4", triggers=("30", "31")),
            letter("m5", triggers=("3",))]
    assert all(typed.add_dead_letter(one) for one in kept)

    assert typed.dead_letter_span(3) == (1, 5)
    assert typed.dead_letter_span(13) == (2, 2)
    assert typed.dead_letter_span(1) is None  # "13" and "31" do not name trigger 1
    assert [row.source for row in typed.dead_letters_of(3, 10)] == ["m1", "m3", "m5"]
    first = typed.dead_letters_of(3, 2)
    assert [(row.id, row.source, row.triggers) for row in first] == [
        (1, "m1", ("3",)), (3, "m3", ("7", "3"))]
    assert [row.source for row in typed.dead_letters_of(3, 2, after=first[-1].id)] == ["m5"]
    assert [row.source for row in typed.dead_letters_of(3, 10, after=1, before=5)] == ["m3"]
    assert typed.dead_letters_of(3, 10, after=5) == []
    assert typed.dead_letters_of(0, 10) == []
    assert typed.dead_letters_of(3, 0) == []
    with pytest.raises(ValueError, match="limit must be >= 0"):
        typed.dead_letters_of(3, -1)
