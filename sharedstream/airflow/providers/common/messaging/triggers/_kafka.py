"""``MessageQueueTrigger(scheme="kafka")``: ``AwaitMessageTrigger``'s arguments on a shared stream.

Airflow's Kafka provider serves ``scheme="kafka"`` with ``AwaitMessageTrigger``,
one consumer per trigger, calling ``apply_function`` (a dotted path) on each
record and firing its result when truthy, else the value decoded as UTF-8.
:class:`KafkaMessageQueueTrigger` takes the same arguments and fires the
same events, on the Kafka provider mirror's producer (connection
``kafka_config_id`` read when the stream opens; commit floors, the
persistence gate). Every such trigger with the same topics and connection
shares one consumer; the records reach ``apply_function`` as
:class:`KafkaRecord`, which answers confluent-kafka ``Message``'s methods.

Invariants: a record is committed past only once every watcher of the
stream has resolved it and the events it fired are stored (a skipped record
is resolved); a value that is not UTF-8 is rejected (dead-lettered) by the
default filter, where Airflow's raises.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any

from sharedstream.airflow.providers.apache.kafka.triggers.shared_stream import (
    KafkaSharedStreamProducer,
)
from sharedstream.airflow.providers.common.messaging.triggers.msg_queue import (
    MessageQueueTrigger,
    check_arguments,
)
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.producers.kafka import KafkaMessage

__all__ = ["KafkaMessageQueueTrigger", "KafkaRecord"]

STREAM_KIND = "kafka-message-queue"
"""The first element of every shared-stream key of this trigger."""

OWNER = "AwaitMessageTrigger"

DEFAULTS: Mapping[str, Any] = {
    "topics": None, "apply_function": None, "kafka_config_id": "kafka_default",
    "apply_function_args": None, "apply_function_kwargs": None, "poll_timeout": 1,
    "poll_interval": 5, "commit_offset": True,
}
"""``AwaitMessageTrigger``'s arguments and defaults (Kafka provider 2.1)."""

TIMESTAMP_CREATE_TIME = 1
"""confluent-kafka's timestamp type of a producer-set timestamp."""


class KafkaRecord:
    """One record as ``apply_function`` sees it: confluent-kafka ``Message``'s read methods.

    ``value()``, ``key()``, ``topic()``, ``partition()``, ``offset()``,
    ``headers()`` (a list of ``(name, bytes)``, ``None`` when there are
    none), ``timestamp()`` (``(1, milliseconds)``), ``error()`` (always
    ``None``: errors never reach a filter here) and ``len()`` of the value.
    Read-only; shared by every watcher of the stream.
    """

    __slots__ = ("_record",)

    def __init__(self, record: KafkaMessage) -> None:
        self._record = record

    def value(self) -> bytes | None:
        """The record's value (``None``: a tombstone)."""
        return self._record.value

    def key(self) -> bytes | None:
        """The record's key."""
        return self._record.key

    def topic(self) -> str:
        """The topic it was read from."""
        return self._record.topic

    def partition(self) -> int:
        """Its partition."""
        return self._record.partition

    def offset(self) -> int:
        """Its offset in the partition."""
        return self._record.offset

    def headers(self) -> list[tuple[str, bytes]] | None:
        """Its headers in order, ``None`` when it has none (as confluent-kafka)."""
        return list(self._record.headers) or None

    def timestamp(self) -> tuple[int, int]:
        """``(TIMESTAMP_CREATE_TIME, milliseconds since the epoch)``."""
        return TIMESTAMP_CREATE_TIME, self._record.timestamp

    def error(self) -> None:
        """``None``: a record that reaches a filter has no error."""

    def __len__(self) -> int:
        return len(self._record.value or b"")


class _WholeRecords(KafkaSharedStreamProducer):
    """The Kafka provider mirror's producer, handing on whole records (not only values)."""

    def unwrap(self, message: Any) -> Any:
        return message


def _topics_of_uri(uri: str) -> list[str]:
    """The topics of a ``kafka://<host>/<topic>,<topic>`` URI (the path; the host is unused)."""
    path = uri.split("://", 1)[1].partition("/")[2]
    return [topic for topic in path.split(",") if topic]


def _import_function(path: str) -> Callable[..., Any]:
    """The callable at dotted ``path`` (``module.name``); ``ImportError`` naming it."""
    module, _, name = path.rpartition(".")
    try:
        function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImportError(f"apply_function {path!r} cannot be imported: {exc}") from exc
    return function


class KafkaMessageQueueTrigger(MessageQueueTrigger):
    """Fire for each record of ``topics`` that ``apply_function`` accepts (scheme ``kafka``).

    Arguments are ``AwaitMessageTrigger``'s: ``topics``, ``apply_function``
    (dotted path, called as ``f(*apply_function_args, record,
    **apply_function_kwargs)`` with a :class:`KafkaRecord`; a truthy result
    is the event's payload, anything else skips the record),
    ``kafka_config_id``, ``apply_function_args``, ``apply_function_kwargs``,
    ``poll_timeout`` (seconds a fetch waits). Without ``apply_function``
    each record's value, decoded as UTF-8, is the payload; a tombstone or an
    empty value is skipped. ``poll_interval`` is accepted and has no effect
    (the consumer never sleeps); ``commit_offset`` must stay true: offsets
    are committed once the events are stored.

    ``apply_function`` is imported when the stream opens in the triggerer,
    and called on the event loop: keep it fast. If it raises, the trigger
    fails (as in Airflow) and the record is redelivered.
    """

    scheme = "kafka"

    def broker_arguments(self, uri: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``AwaitMessageTrigger``'s arguments; a URI gives the topics when none are given."""
        given = dict(kwargs)
        if uri is not None and given.get("topics") is None:
            given["topics"] = _topics_of_uri(uri)
        merged = check_arguments(OWNER, given, DEFAULTS, required=("topics",))
        if merged["commit_offset"] is not True:
            raise ValueError("MessageQueueTrigger: commit_offset must be true here: offsets are "
                             "committed once the records' events are stored")
        if merged["apply_function"] is not None and not isinstance(merged["apply_function"], str):
            raise ValueError("MessageQueueTrigger: apply_function must be a dotted path "
                             "(\"module.function\"), as in Airflow")
        merged["apply_function_args"] = list(merged["apply_function_args"] or ())
        merged["apply_function_kwargs"] = dict(merged["apply_function_kwargs"] or {})
        # The provider mirror's producer checks topics and poll_timeout, reading nothing.
        self._producer(merged)
        merged["topics"] = sorted(merged["topics"])
        return merged

    @staticmethod
    def _producer(kwargs: Mapping[str, Any]) -> _WholeRecords:
        return _WholeRecords(topics=kwargs["topics"], kafka_config_id=kwargs["kafka_config_id"],
                             poll_timeout=kwargs["poll_timeout"])

    def shared_stream_key(self) -> Hashable:
        """``("kafka-message-queue", topics, kafka_config_id)``."""
        return (STREAM_KIND, tuple(self.kwargs["topics"]), self.kwargs["kafka_config_id"])

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs; reads nothing yet."""
        return cls._producer({**DEFAULTS, **kwargs})

    def _apply(self) -> Callable[[KafkaRecord], Any] | None:
        path = self.kwargs["apply_function"]
        if path is None:
            return None
        return functools.partial(_import_function(path), *self.kwargs["apply_function_args"],
                                 **self.kwargs["apply_function_kwargs"])

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Fire ``apply_function``'s truthy results, or each non-empty value as UTF-8."""
        apply = self._apply()
        async for record in shared_stream:
            if apply is not None:
                result = apply(KafkaRecord(record))
                if result:
                    yield TriggerEvent(result)
                continue
            if not record.value:
                continue
            try:
                text = record.value.decode("utf-8")
            except UnicodeDecodeError as exc:
                reject_shared_stream_event(f"the record's value is not UTF-8: {exc}")
                continue
            yield TriggerEvent(text)

