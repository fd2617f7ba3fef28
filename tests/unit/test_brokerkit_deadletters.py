"""The dead-letter desk: counts, the fallback's letter, discards, and a failing fallback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sharedstream.brokerkit.deadletters import (
    REASON_REJECTED,
    DeadLetterDesk,
    dead_letter_annotations,
)
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import AdvanceItem, DeadLetter, SharedStreamProducer, Verdict
from tests.log_lines import fields_of, text_of

VERDICTS = (Verdict(7, "rejected", "not json"), Verdict(9, "rejected", "not json"))


class Producer(SharedStreamProducer):
    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        yield 1, 1

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        return None


def desk() -> tuple[Producer, DeadLetterDesk]:
    producer = Producer()
    producer.stream_name = "kafka orders"  # as the engine sets it before open_stream
    return producer, DeadLetterDesk(producer, setting="dead_letter_topic",
                                    logger=key_value_logger("test"))


async def keep(letters: DeadLetterDesk, cause: str = "no dead_letter_topic configured") -> None:
    await letters.keep(source="orders/0/7", reason=REASON_REJECTED, cause=cause,
                       verdicts=VERDICTS, payload=b"{", headers=(("k", b"v"),),
                       history="received 1 time")


def test_annotations_leave_out_what_is_empty() -> None:
    assert dead_letter_annotations("rejected", VERDICTS) == {
        "sharedstream.reason": "rejected", "sharedstream.triggers": "7,9",
        "sharedstream.detail": "not json"}
    assert dead_letter_annotations("max_redeliveries", ()) == {
        "sharedstream.reason": "max_redeliveries"}


def test_a_copy_the_broker_took_is_counted() -> None:
    producer, letters = desk()
    letters.sent("orders/0/7", "orders.dlq", REASON_REJECTED, VERDICTS)
    assert (producer.dead_lettered, letters.discarded) == (1, 0)


async def test_without_a_fallback_the_message_is_discarded_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer, letters = desk()
    await keep(letters, letters.unconfigured())
    assert (producer.dead_lettered, letters.discarded) == (0, 1)
    [record] = caplog.records
    assert text_of(record) == "discarding a message: no dead-letter destination"
    assert fields_of(record) == {
        "source": "orders/0/7", "stream": "kafka orders", "reason": REASON_REJECTED,
        "history": "received 1 time", "detail": "not json",
        "cause": "no dead_letter_topic configured"}


async def test_the_fallback_gets_the_whole_letter() -> None:
    producer, letters = desk()
    kept: list[DeadLetter] = []

    async def fallback(letter: DeadLetter) -> None:
        kept.append(letter)

    producer.dead_letter_fallback = fallback
    await keep(letters, "the dead-letter topic refused it: too big")
    assert kept == [DeadLetter(
        stream="kafka orders", source="orders/0/7",
        reason="rejected; the dead-letter topic refused it: too big: not json",
        triggers=("7", "9"), payload=b"{", headers=(("k", b"v"),))]
    assert (producer.dead_lettered, letters.discarded) == (1, 0)


async def test_a_failing_fallback_counts_nothing_and_raises() -> None:
    producer, letters = desk()

    async def fallback(letter: DeadLetter) -> None:
        raise OSError("disk full")

    producer.dead_letter_fallback = fallback
    with pytest.raises(OSError, match="disk full"):
        await keep(letters)
    assert (producer.dead_lettered, letters.discarded) == (0, 0)
