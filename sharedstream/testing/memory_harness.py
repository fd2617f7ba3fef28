"""The conformance harness of the in-memory reference broker: a model for a broker's own.

:class:`MemoryHarness` satisfies :class:`~sharedstream.testing.harness.BrokerHarness`
over a private :class:`~sharedstream.testing.memory.MemoryBroker` (one per
harness, forgotten on :meth:`MemoryHarness.close`), in either acknowledgement
mode; :class:`ScriptedMemoryTrigger` is the memory trigger with a filter that
follows :func:`~sharedstream.testing.scripts.act`. A broker module's harness
is the same shape with real clients: a separate reader for what the broker
committed and dead-lettered, never the producer under test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.testing.harness import DeadLetter, Features, Stream
from sharedstream.testing.memory import (
    HEADER_REASON,
    HEADER_SOURCE,
    HEADER_TRIGGERS,
    MemoryBroker,
    MemorySharedStreamTrigger,
)
from sharedstream.testing.scripts import ScriptedFailure, act, pace

__all__ = ["MemoryHarness", "ScriptedMemoryTrigger"]


class ScriptedMemoryTrigger(MemorySharedStreamTrigger):
    """The memory trigger whose filter follows the script it names (see :func:`act`)."""

    producers: ClassVar[dict[str, int]] = {}
    """Producers built so far, per stream (the suite checks that triggers share one)."""

    def __init__(self, *, script: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script = script

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The memory trigger's kwargs plus the script name."""
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "script": self.script}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The memory producer, counted."""
        cls.producers[kwargs["stream"]] = cls.producers.get(kwargs["stream"], 0) + 1
        return super().create_shared_stream_producer(kwargs)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any],
    ) -> AsyncIterator[TriggerEvent]:
        """Emit, skip, reject or raise on each record, as the script says (the value as is)."""
        async for record in shared_stream:
            await pace(self.script)
            action = act(self.script, record.value)
            if action == "fail":
                raise ScriptedFailure(f"scripted failure on {record.value!r}")
            if action == "reject":
                reject_shared_stream_event()
            elif action == "emit":
                yield TriggerEvent(self.to_payload(record.value, record))


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
