"""What a broker module provides to run the producer conformance suite against itself.

A broker package's test module subclasses
:class:`~sharedstream.testing.conformance.ProducerConformance` and gives it a
``harness`` fixture: an object satisfying :class:`BrokerHarness`, one per
test, over a running broker. The harness says what the broker promises in
its :class:`Features`; the suite skips the tests of what it does not. The
suite checks the broker's state only through the harness's own, separate
reader (``committed``, ``dead_letters``), never through the producer under
test.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sharedstream.engine.trigger import BaseEventTrigger

__all__ = ["BrokerHarness", "DeadLetter", "Features", "Stream", "opened"]


@dataclass(frozen=True)
class Features:
    """What a broker module promises; the suite skips the tests of what it does not."""

    ordered_lanes: bool = True
    """Commits are cumulative per lane: a held message blocks every later commit of it."""
    supports_dlq: bool = True
    """Rejected messages can go to a dead-letter destination, with their origin attached."""
    redelivers_in_session: bool = True
    """A failed message is delivered again without restarting the consumer."""
    dead_letters_poison: bool = True
    """A message that keeps failing is dead-lettered after ``max_redeliveries``."""
    names_raw_events: bool = True
    """``raw_event_name`` is stable across redeliveries."""
    refuses_lossy_settings: bool = True
    """A setting that would acknowledge too early (auto-commit) is refused up front."""
    ordered_delivery: bool = True
    """Messages of one lane reach each subscriber in the order they were produced."""
    redelivers_to_failed_only: bool = False
    """A redelivery in the session reaches only the triggers that did not ack the message."""


@dataclass
class Stream:
    """One test's stream: where messages go, where dead letters go, the consumer group."""

    name: str
    dead_letter: str | None
    group: str


@dataclass(frozen=True)
class DeadLetter:
    """One message found in a stream's dead-letter destination, as the harness reads it."""

    value: bytes | None
    source: str
    """The raw event name of the message it came from (as ``raw_event_name`` names it)."""
    reason: str
    """``"rejected"`` or ``"max_redeliveries"``."""
    triggers: str = ""
    """The trigger ids that rejected it or kept failing on it, comma-separated."""


class BrokerHarness(Protocol):
    """A running broker plus the helpers the suite needs (one instance per test).

    Every method may be called many times per test; the async ones run on
    the test's event loop. Nothing here may go through the producer under
    test: the suite compares what the producer did with what the broker saw.
    """

    features: Features

    async def create_stream(self, *, dead_letter: bool = True) -> Stream:
        """A new, empty stream (topic, queue) unique to this test, with a DLQ unless told not."""

    async def produce(self, stream: Stream, values: Sequence[bytes]) -> None:
        """Append ``values`` in order to one lane (e.g. one partition, one FIFO group)."""

    def trigger(
        self, stream: Stream, *, script: str, max_redeliveries: int = 5,
    ) -> BaseEventTrigger:
        """A trigger of the module under test whose filter follows :func:`~.scripts.act`."""

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:
        """Build a trigger with a lossy consumer setting (must raise ``ValueError``)."""

    async def committed(self, stream: Stream) -> int:
        """How many messages of the lane are settled (committed, deleted) by the broker's count."""

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        """Everything in the stream's dead-letter destination so far, in arrival order."""

    def producers_created(self, stream: Stream) -> int:
        """How many producers (broker consumers) the module built for the stream."""

    async def consumers_in_group(self, stream: Stream) -> int | None:
        """Members the broker sees in the stream's consumer group (``None``: cannot tell)."""

    def raw_event_name(self, stream: Stream, index: int) -> str:
        """The expected name of the ``index``-th message produced to the stream."""


class _Opens(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


H = TypeVar("H", bound=_Opens)


@contextlib.asynccontextmanager
async def opened(harness: H) -> AsyncIterator[H]:
    """``await harness.start()``, yield it, ``await harness.close()`` however the block ends.

    What a harness fixture does: ``async with opened(MyHarness(...)) as harness:
    yield harness``.
    """
    await harness.start()
    try:
        yield harness
    finally:
        await harness.close()
