"""Definitions for ``test_no_loss``: two watchers of one topic through one shared consumer.

Both are Kafka triggers with the same settings (``value_format="json"``, a
dead-letter topic), so they share one consumer and every record goes to
both; neither has a ``match``, so each fires one event per record that
decodes. ``plain`` is the stock :class:`KafkaSharedStreamTrigger`;
``custom`` is :class:`ChaosWatcher`, a subclass that can be made slow
(``delay`` seconds per record) or poisoned (it raises on the record whose
``id`` is ``raise_on_id``), and otherwise behaves like the stock trigger.

Configured by environment: ``NOLOSS_BOOTSTRAP``, ``NOLOSS_TOPIC``,
``NOLOSS_GROUP``, ``NOLOSS_DELAY`` (seconds, default 0) and
``NOLOSS_RAISE_ON_ID`` (an integer, default none).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from sharedstream import TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.producers.kafka import KafkaMessage
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

POISON_TEXT = "poison record"
"""The text of the error :class:`ChaosWatcher` raises (the tests look for it in the DLQ)."""

_TOPIC = os.environ["NOLOSS_TOPIC"]
COMMON: dict[str, Any] = {
    "bootstrap_servers": os.environ["NOLOSS_BOOTSTRAP"],
    "topics": [_TOPIC],
    "group_id": os.environ["NOLOSS_GROUP"],
    "dead_letter_topic": f"{_TOPIC}.dlq",
    "value_format": "json",
    "consumer_overrides": {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400},
}


class ChaosWatcher(KafkaSharedStreamTrigger):
    """The stock Kafka trigger, made slow (``delay``) or poisoned (``raise_on_id``)."""

    def __init__(self, *, delay: float = 0.0, raise_on_id: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.raise_on_id = raise_on_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "delay": self.delay, "raise_on_id": self.raise_on_id}

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        # The stock filter (decoding, rejecting, matching) over a slowed or poisoned stream.
        async for event in super().filter_shared_stream(self._chaos(shared_stream)):
            yield event

    async def _chaos(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in shared_stream:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.raise_on_id is not None and self._record_id(message) == self.raise_on_id:
                raise RuntimeError(f"{POISON_TEXT}: id {self.raise_on_id}")
            yield message

    def _record_id(self, message: KafkaMessage) -> object:
        try:
            value = self.decode(message)
        except (ValueError, RecursionError):
            return None  # undecodable: the stock filter rejects it
        return value.get("id") if isinstance(value, dict) else None


_DELAY = float(os.environ.get("NOLOSS_DELAY", "0"))
_RAISE_ON = os.environ.get("NOLOSS_RAISE_ON_ID")

plain = Asset("plain", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(**COMMON))])
custom = Asset("custom", watchers=[AssetWatcher("all", trigger=ChaosWatcher(
    **COMMON, delay=_DELAY, raise_on_id=int(_RAISE_ON) if _RAISE_ON else None,
))])
