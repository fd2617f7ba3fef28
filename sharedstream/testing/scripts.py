"""Scripted filters: what a conformance trigger does with each message, by name.

A trigger is rebuilt from its serialized kwargs, so it can only carry the
*name* of its script; the scripts themselves live in :data:`SCRIPTS`. A
harness's conformance trigger (a :class:`ScriptedTrigger` subclass) calls
:func:`pace` and then :func:`act` with its script name and the raw value of
each message, and emits, skips, rejects (``reject_shared_stream_event()``)
or raises :class:`ScriptedFailure` as told. :func:`act` counts the failures it orders,
so a test can check how often a message was delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event

__all__ = ["SCRIPTS", "Script", "ScriptedFailure", "ScriptedTrigger", "act", "pace"]


@dataclass
class Script:
    """What a scripted filter does with each value; unknown values are emitted."""

    reject: set[bytes] = field(default_factory=set)
    skip: set[bytes] = field(default_factory=set)
    fail: dict[bytes, int] = field(default_factory=dict)
    """Value -> how many more times to raise on it (-1: always)."""
    failures: int = 0
    """How many failures :func:`act` ordered so far."""
    delay: float = 0.0
    """Seconds the filter spends on each message (a slow watcher)."""


SCRIPTS: dict[str, Script] = {}
"""Scripts by name (a test registers one, then builds triggers naming it)."""


class ScriptedFailure(RuntimeError):
    """Raised by a scripted filter told to fail on a value."""


async def pace(script: str) -> None:
    """Spend the script's ``delay`` on one message (call it first in a scripted filter)."""
    delay = SCRIPTS[script].delay
    if delay:
        await asyncio.sleep(delay)


def act(script: str, value: bytes | None) -> str:
    """``"emit"``, ``"skip"``, ``"reject"`` or ``"fail"`` for ``value`` under ``script``.

    A value with failures left is failed first (and its count lowered);
    ``None`` (a tombstone, an empty body) is always emitted.
    """
    rules = SCRIPTS[script]
    if value is None:
        return "emit"
    remaining = rules.fail.get(value, 0)
    if remaining:
        if remaining > 0:
            rules.fail[value] = remaining - 1
        rules.failures += 1
        return "fail"
    if value in rules.reject:
        return "reject"
    if value in rules.skip:
        return "skip"
    return "emit"


class ScriptedTrigger(BrokerTrigger):
    """A broker trigger whose filter follows the script it names: the conformance trigger.

    Put it first among the bases of a broker's trigger class and say which
    stream a producer's kwargs name::

        class ScriptedKafkaTrigger(ScriptedTrigger, KafkaSharedStreamTrigger):
            @classmethod
            def stream_of(cls, kwargs):
                return kwargs["group_id"]

    Each message's raw value (:meth:`scripted_value`) goes through
    :func:`pace` and :func:`act`; an emitted message's event payload is the
    broker trigger's own :meth:`to_payload`. Every such class counts the
    producers it built per stream (:attr:`producers`, the suite checks that
    triggers share one) and keeps the newest (:attr:`last`).
    """

    producers: ClassVar[dict[str, int]] = {}
    """Producers built so far, per stream (each broker's scripted class has its own,
    shared with its subclasses)."""
    last: ClassVar[dict[str, SharedStreamProducer]] = {}
    """The newest producer built, per stream (kept like :attr:`producers`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if ScriptedTrigger in cls.__bases__:  # a broker's scripted class; its subclasses share
            cls.producers, cls.last = {}, {}

    def __init__(self, *, script: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script = script

    @classmethod
    def stream_of(cls, kwargs: dict[str, Any]) -> str:
        """The stream a producer built from these trigger kwargs reads (the counters' key)."""
        raise NotImplementedError(f"{cls.__qualname__} must say which stream its kwargs name")

    def scripted_value(self, message: Any) -> bytes:
        """The raw value a script judges (default ``message.value``)."""
        return bytes(message.value)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The broker trigger's kwargs plus the script name."""
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "script": self.script}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The broker's producer, counted and kept as :attr:`last` for its stream."""
        stream = cls.stream_of(kwargs)
        cls.producers[stream] = cls.producers.get(stream, 0) + 1
        producer = super().create_shared_stream_producer(kwargs)
        cls.last[stream] = producer
        return producer

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any],
    ) -> AsyncIterator[TriggerEvent]:
        """Emit, skip, reject or raise on each message, as the script says."""
        async for message in shared_stream:
            await pace(self.script)
            value = self.scripted_value(message)
            action = act(self.script, value)
            if action == "fail":
                raise ScriptedFailure(f"scripted failure on {value!r}")
            if action == "reject":
                reject_shared_stream_event()
            elif action == "emit":
                yield TriggerEvent(self.to_payload(value, message))
