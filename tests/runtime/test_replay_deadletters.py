"""The dead-letter replay source over a real SQLite store: plan, pages, gaps, resume, refusals.

The producer is a stub whose ``dead_letter_event`` hands back the letter
itself (what a broker's rebuild is, is tested per broker); everything else
is the source and the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sharedstream.engine.producer import AdvanceItem, DeadLetter, SharedStreamProducer
from sharedstream.engine.replay import ReplayError, ReplayItem, ReplayRequest
from sharedstream.runtime.replay_deadletters import (
    LANE,
    DeadLetterReplaySource,
    can_rebuild_dead_letters,
)
from sharedstream.store import SqliteStore
from sharedstream.store.base import DEAD_LETTER_PAYLOAD_LIMIT

DEAD_LETTERS = ReplayRequest(dead_letters=True)


class _Stub(SharedStreamProducer):
    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:  # pragma: no cover - not read
        raise NotImplementedError

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:  # pragma: no cover
        raise NotImplementedError


class Rebuilds(_Stub):
    """Rebuilds every letter but those whose source is ``"foreign"``."""

    def dead_letter_event(self, letter: DeadLetter) -> tuple[Any, Any] | None:
        return None if letter.source == "foreign" else (letter.payload, letter.source)


def letter(source: str, trigger: str, payload: bytes = b"{}") -> DeadLetter:
    return DeadLetter("sqs q", source, "rejected", (trigger,), payload)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "meta.db") as store:
        store.migrate()
        yield store


def source_on(store: SqliteStore, letters: Sequence[DeadLetter]) -> DeadLetterReplaySource:
    """Trigger 3's letters among ``letters`` (kept in order), read two to a page."""
    for one in letters:
        assert store.add_dead_letter(one)
    return DeadLetterReplaySource(trigger_id=3, store=lambda: store, db=in_thread,
                                  producer=Rebuilds(), page=2)


async def items(source: DeadLetterReplaySource, plan: dict[str, tuple[int, int]],
                positions: dict[str, int] | None = None) -> list[ReplayItem]:
    return [item async for item in source.read(plan, positions or {})]


async def test_a_watcher_s_letters_are_read_in_id_order_other_ids_counted_as_skipped(
    store: SqliteStore,
) -> None:
    source = source_on(store, [letter("a", "7"), letter("b", "3"), letter("c", "7"),
                                  letter("d", "7"), letter("e", "3"), letter("f", "3"),
                                  letter("g", "7")])
    plan = await source.plan(DEAD_LETTERS)
    assert plan == {LANE: (2, 7)}

    read = await items(source, plan)

    assert [(i.broker_payload, i.next_position, i.skipped) for i in read] == [
        ("b", 3, 0), ("e", 6, 2), ("f", 7, 0)]
    assert sum(1 + i.skipped for i in read) == 7 - 2  # done reaches the plan's total
    resumed = await items(source, plan, {LANE: 3})  # the row recorded position 3
    assert [(i.broker_payload, i.skipped) for i in resumed] == [("e", 2), ("f", 0)]


async def test_letters_kept_after_the_plan_are_not_the_replay_s(store: SqliteStore) -> None:
    source = source_on(store, [letter("a", "3")])
    plan = await source.plan(DEAD_LETTERS)
    await in_thread(store.add_dead_letter, letter("later", "3"))

    assert [i.broker_payload for i in await items(source, plan)] == ["a"]


async def test_no_letters_plan_nothing_and_read_nothing(store: SqliteStore) -> None:
    source = source_on(store, [letter("a", "13")])
    plan = await source.plan(DEAD_LETTERS)
    assert plan == {LANE: (0, 0)}
    assert await items(source, plan) == []


async def test_a_letter_kept_in_part_is_not_fed_and_counts_as_skipped(
    store: SqliteStore, caplog: pytest.LogCaptureFixture,
) -> None:
    big = b"x" * (DEAD_LETTER_PAYLOAD_LIMIT + 1)
    source = source_on(store, [letter("a", "3"), letter("big", "3", big), letter("c", "3")])
    read = await items(source, await source.plan(DEAD_LETTERS))
    assert [(i.broker_payload, i.skipped) for i in read] == [("a", 0), ("c", 1)]
    assert "a dead letter kept only in part is not replayed" in caplog.text


async def test_a_letter_the_producer_cannot_rebuild_fails_the_replay(store: SqliteStore) -> None:
    source = source_on(store, [letter("a", "3"), letter("foreign", "3")])
    with pytest.raises(ReplayError, match=r"^dead letter 2 \(sqs q, foreign\) cannot be rebuilt"):
        await items(source, await source.plan(DEAD_LETTERS))


def test_only_a_producer_with_the_hook_can_rebuild() -> None:
    assert can_rebuild_dead_letters(Rebuilds())
    assert not can_rebuild_dead_letters(_Stub())
    assert _Stub().dead_letter_event(letter("a", "3")) is None


def test_a_request_replays_dead_letters_or_starts_somewhere_never_both() -> None:
    with pytest.raises(ReplayError, match="exactly one"):
        ReplayRequest()
    with pytest.raises(ReplayError, match="exactly one"):
        ReplayRequest(offsets={"0": 1}, dead_letters=True)
    with pytest.raises(ReplayError, match="takes no end time"):
        ReplayRequest(dead_letters=True, until=datetime.now(UTC))
