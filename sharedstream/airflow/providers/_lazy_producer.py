"""A producer that reads its Airflow connection when its stream opens, not when it is built.

The provider mirrors (``...apache.kafka...``, ``...amazon.aws...``) configure
our producers from an Airflow connection. The contract of
:class:`~sharedstream.engine.producer.SharedStreamProducer` is that building
one connects to nothing; Airflow's own producers also look their connection
up only when they connect. So :class:`LazyProducer` holds a ``build``
function and calls it in :meth:`open_stream` (or :meth:`resolve`): a
connection that is missing or refused then fails that poll, with the same
one-line error, like any broker error at connect time, and never the
construction in ``create_shared_stream_producer``.

It hands on what the provider's stream yields (:meth:`unwrap`: a record's
value, a message's body) with our producer's broker payload, and answers
every engine call from the producer it built. ``trace_carrier`` is asked
about the item just yielded (the engine asks before it pulls the next one),
so the carrier still comes from the whole message, not from the unwrapped
value.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from sharedstream.engine.producer import AdvanceItem, DeadLetter, SharedStreamProducer

__all__ = ["LazyProducer"]

P = TypeVar("P", bound=SharedStreamProducer)


class LazyProducer(SharedStreamProducer, Generic[P], abc.ABC):
    """Builds its producer (``build()``, which reads the connection) when the stream opens.

    ``attributes`` are the tracing attributes until then (the producer's own
    afterwards); ``together`` is the built producer's class's
    ``advances_lanes_together`` (the engine reads it before the stream opens).
    """

    def __init__(self, build: Callable[[], P], *, attributes: Mapping[str, str],
                 together: bool) -> None:
        self._build = build
        self._built: P | None = None
        self._attributes = dict(attributes)
        self._together = together
        self._current: tuple[Any, Any] | None = None  # (payload, message) just yielded

    @abc.abstractmethod
    def unwrap(self, message: Any) -> Any:
        """What the provider's stream hands on for one of the built producer's raw events."""

    def resolve(self) -> P:
        """The producer, built now if it was not (the connection is read then; its errors raise)."""
        if self._built is None:
            built = self._build()
            built.dead_letter_fallback = self.dead_letter_fallback
            built.failure_ledger = self.failure_ledger
            built.stream_name = self.stream_name
            self._built = built
        return self._built

    def _producer(self) -> P:
        if self._built is None:
            raise RuntimeError(f"{type(self).__qualname__}: the stream is not open")
        return self._built

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Build the producer (reading the connection), then hand on its stream unwrapped."""
        # Closing this generator closes the producer's at once, not when it is collected.
        stream = cast("AsyncGenerator[tuple[Any, Any], None]", self.resolve().open_stream())
        async with contextlib.aclosing(stream):
            async for message, payload in stream:
                self._current = (payload, message)
                yield self.unwrap(message), payload

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """The built producer's ``advance``."""
        await self._producer().advance(batch)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The built producer's lane of ``broker_payload``."""
        return self._producer().get_advance_lane(broker_payload)

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """The built producer's name of the raw event."""
        return self._producer().raw_event_name(broker_payload)

    def raw_event_fingerprint(self, broker_payload: Any) -> str | None:
        """The built producer's fingerprint of the raw event."""
        return self._producer().raw_event_fingerprint(broker_payload)

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The carrier of the whole message just yielded (``raw_event`` is its unwrapped form)."""
        current = self._current
        if current is None or current[0] is not broker_payload:
            return None
        return self._producer().trace_carrier(current[1], broker_payload)

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """The built producer's, or those given until it is built."""
        built = self._built
        return self._attributes if built is None else built.messaging_attributes

    @property
    def connected(self) -> bool | None:
        """The built producer's; ``None`` (cannot tell) before the stream opens."""
        return None if self._built is None else self._built.connected

    @property
    def dead_lettered(self) -> int:
        """What the built producer dead-lettered (0 before it is built)."""
        return 0 if self._built is None else self._built.dead_lettered

    @dead_lettered.setter
    def dead_lettered(self, value: int) -> None:
        raise AttributeError("dead_lettered is the built producer's count")

    @property
    def counts_deliveries(self) -> bool:
        """The built producer's (``False`` before it is built: nothing was advanced yet)."""
        return self._built is not None and self._built.counts_deliveries

    @counts_deliveries.setter
    def counts_deliveries(self, value: bool) -> None:
        raise AttributeError("counts_deliveries is the built producer's")

    @property
    def advances_lanes_together(self) -> bool:
        """The built producer's class's answer, known before it is built."""
        return self._together

    @advances_lanes_together.setter
    def advances_lanes_together(self, value: bool) -> None:
        raise AttributeError("advances_lanes_together is given to the constructor")

    async def republish(self, letters: Sequence[DeadLetter]) -> None:
        """The built producer's ``republish`` (built now if the stream never opened)."""
        await self.resolve().republish(letters)

    async def aclose(self) -> None:
        """Close the built producer, if one was built."""
        if self._built is not None:
            await self._built.aclose()
