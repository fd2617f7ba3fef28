"""The conformance harness of the in-memory reference broker: a model for a broker's own.

:class:`MemoryHarness` satisfies :class:`~sharedstream.testing.harness.BrokerHarness`
over a private :class:`~sharedstream.testing.memory_broker.MemoryBroker` (one per
harness, forgotten on :meth:`MemoryHarness.close`), in either acknowledgement
mode; :class:`ScriptedMemoryTrigger` is the memory trigger with a filter that
follows :func:`~sharedstream.testing.scripts.act`. A broker module's harness
is the same shape with real clients: a separate reader for what the broker
committed and dead-lettered, never the producer under test.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.testing.harness import DeadLetter, Features, Stream
from sharedstream.testing.memory import (
    HEADER_REASON,
    HEADER_SOURCE,
    HEADER_TRIGGERS,
    MemorySharedStreamTrigger,
)
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.scripts import ScriptedTrigger

__all__ = ["MemoryHarness", "ScriptedMemoryTrigger"]


class ScriptedMemoryTrigger(ScriptedTrigger, MemorySharedStreamTrigger):
    """The memory trigger whose filter follows the script it names (see :func:`act`)."""

    @classmethod
    def stream_of(cls, kwargs: dict[str, Any]) -> str:
        """The memory stream's name."""
        return str(kwargs["stream"])


class MemoryHarness:
    """The conformance harness over a private memory broker: one stream (one lane) per test.

    ``acks="cumulative"`` promises every feature; ``acks="per-message"``
    promises neither cumulative lanes nor ordered delivery (a failed record
    comes again after those behind it), like SQS standard queues.
    """

    def __init__(self, *, acks: str = "cumulative") -> None:
        self.acks = acks
        cumulative = acks == "cumulative"
        self.features = Features(ordered_lanes=cumulative, ordered_delivery=cumulative)
        self.broker_name = f"conformance-{uuid.uuid4().hex[:10]}"
        self.broker = MemoryBroker.named(self.broker_name)

    async def close(self) -> None:
        """Forget the broker (its producers were closed by the session)."""
        MemoryBroker.forget(self.broker_name)

    async def create_stream(self, *, dead_letter: bool = True) -> Stream:
        """A new stream name, with a dead-letter stream unless told not."""
        name = f"s-{uuid.uuid4().hex[:10]}"
        return Stream(name=name, dead_letter=f"{name}.dlq" if dead_letter else None, group="")

    async def produce(self, stream: Stream, values: Sequence[bytes]) -> None:
        """Append to lane ``"0"``."""
        self.broker.produce(stream.name, values)

    def trigger_kwargs(self, stream: Stream, **overrides: Any) -> dict[str, Any]:
        """Kwargs of a memory trigger on ``stream`` (short polls keep tests quick)."""
        return {"stream": stream.name, "broker": self.broker_name, "acks": self.acks,
                "dead_letter": stream.dead_letter, "poll_timeout": 0.2, **overrides}

    def trigger(
        self, stream: Stream, *, script: str, max_redeliveries: int = 5, **overrides: Any,
    ) -> BaseEventTrigger:
        """A scripted memory trigger on ``stream`` (``overrides``: other memory settings)."""
        return ScriptedMemoryTrigger(script=script, **self.trigger_kwargs(
            stream, max_redeliveries=max_redeliveries, **overrides))

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:
        """A trigger that would settle on receipt: refused with ``ValueError``."""
        return MemorySharedStreamTrigger(**self.trigger_kwargs(stream, ack_on_receive=True))

    async def committed(self, stream: Stream) -> int:
        """Records the broker will not deliver again (committed past or deleted)."""
        return self.broker.settled(stream.name)

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        """The dead-letter stream's records, read back from their headers."""
        assert stream.dead_letter is not None  # noqa: S101 - the suite asks only when it made one
        return [
            DeadLetter(record.value, record.headers[HEADER_SOURCE],
                       record.headers[HEADER_REASON], record.headers.get(HEADER_TRIGGERS, ""))
            for record in self.broker.records(stream.dead_letter)
        ]

    def producers_created(self, stream: Stream) -> int:
        """Producers the trigger class built for ``stream``."""
        return ScriptedMemoryTrigger.producers.get(stream.name, 0)

    async def consumers_in_group(self, stream: Stream) -> int | None:
        """Producers with ``stream`` open, as the broker counts them."""
        return self.broker.consumers(stream.name)

    def raw_event_name(self, stream: Stream, index: int) -> str:
        """``stream/0/index``."""
        return f"{stream.name}/0/{index}"
