"""The trigger contract: ``BaseTrigger`` and ``BaseEventTrigger``.

These mirror Apache Airflow's trigger API (3.3) name for name, so trigger
code written for Airflow ports by changing its imports only:

* ``serialize()`` returns ``(classpath, kwargs)``; the runtime rebuilds the
  trigger as ``cls(**kwargs)`` wherever it runs.
* ``run()`` is an async generator of :class:`TriggerEvent`; ``cleanup()``
  always runs after it, however it ended.
* A :class:`BaseEventTrigger` may declare a ``shared_stream_key()``; triggers
  whose keys compare equal share one upstream poll, and each receives the raw
  events through its own ``filter_shared_stream()``.
* Overriding ``create_shared_stream_producer()`` anywhere in the class
  hierarchy switches the group to *ack mode*: the broker is advanced only
  once every subscriber resolved an event and every trigger event derived
  from it was stored.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import AsyncIterator, Callable, Hashable
from typing import TYPE_CHECKING, Any

from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.keyvalue_log import KeyValueLogger, key_value_logger
from sharedstream.engine.payload_json import dumps

if TYPE_CHECKING:
    from sharedstream.engine.producer import SharedStreamProducer

__all__ = ["BaseEventTrigger", "BaseTrigger", "uses_ack_mode"]


class BaseTrigger(abc.ABC):
    """Base class of every trigger.

    A trigger is built twice: once where it is declared, then again from
    ``serialize()``'s output in the triggerer that runs it. Everything it
    needs must therefore come from its constructor keyword arguments.
    """

    queue: str | None = None
    """The trigger queue (Airflow 3.4's ``BaseTrigger.queue``): which triggerers run it.

    A triggerer runs the triggers of the queues its ``[triggerer] queues``
    names, or, when that is empty, those whose queue is ``None``. Read (through
    :meth:`trigger_queue`) where the trigger is declared and stored with it;
    not part of ``serialize()``.
    """

    def __init__(self, **kwargs: Any) -> None:
        # Set by the runtime before run(); None while the trigger is only declared.
        self.trigger_id: int | None = None

    @property
    def log(self) -> KeyValueLogger:
        """A logger named after the trigger's class (Airflow's ``self.log``).

        Takes structlog-style key-values as Airflow's does,
        ``self.log.info("matched", topic=topic)``, as well as everything a
        ``logging.Logger`` takes (see :mod:`sharedstream.engine.keyvalue_log`).
        """
        cls = type(self)
        return key_value_logger(f"{cls.__module__}.{cls.__qualname__}")

    def trigger_queue(self) -> str | None:
        """The trigger queue the runtime assigns the trigger by: :attr:`queue` by default.

        A trigger whose ``queue`` attribute means something else (the SQS and
        Service Bus triggers: the broker's queue) overrides it. Called once,
        where the trigger is declared.
        """
        return self.queue

    @abc.abstractmethod
    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return ``(classpath, kwargs)`` such that ``cls(**kwargs)`` rebuilds this trigger.

        Must be deterministic: identical triggers must serialize identically.
        """

    def identity(self) -> tuple[str, dict[str, Any]]:
        """Return ``(classpath, kwargs)`` that make two declarations one trigger (its fingerprint).

        ``serialize()`` by default. A trigger whose serialized form depends on
        when it was declared returns what does not (``TimeDeltaTrigger``: its
        ``delta``, where ``serialize()`` gives the moment computed from it);
        the runtime then keeps the serialized form of the *first* declaration
        for good, so a restart does not move it.
        """
        return self.serialize()

    @abc.abstractmethod
    def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the condition and yield :class:`TriggerEvent` instances.

        Implemented as an ``async def`` generator that never blocks the event
        loop. Returning before yielding anything is an error for a standalone
        trigger. Raising fails the trigger; the runtime records and restarts it.
        """

    async def cleanup(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release what ``run()`` or the filter acquired.

        Called once after the trigger stops, whether it finished, raised or
        was cancelled. Errors raised here are logged, never propagated.
        """

    def __repr__(self) -> str:
        classpath, kwargs = self.serialize()
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return f"<{classpath} {args}>"


class BaseEventTrigger(BaseTrigger):
    """A trigger that schedules work from external events (an asset watcher).

    Opt in to sharing one upstream poll by overriding:

    * :meth:`shared_stream_key` - a hashable key; equal keys share a poll.
    * :meth:`open_shared_stream` - the poll itself (fast path, no acks), or
      :meth:`create_shared_stream_producer` - a producer that owns a broker
      connection and is told when it may advance the broker (ack mode).
    * :meth:`filter_shared_stream` - turn the shared raw events into this
      trigger's own events. The same filter works in both modes.

    ``queue`` (keyword only, as in Airflow 3.4) sets :attr:`BaseTrigger.queue`.
    """

    def __init__(self, *, queue: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if queue is not None:
            self.queue = queue

    @staticmethod
    def hash(classpath: str, kwargs: dict[str, Any]) -> int:
        """A hash identifying the trigger built from ``classpath`` and ``kwargs`` (Airflow's).

        Airflow uses it to tell event-driven triggers apart: two watchers
        with the same classpath and kwargs are the same trigger. Unlike
        Python's ``hash()`` of text (salted per process), the value is the
        same in every process and on every machine: the first 8 bytes
        (signed) of a BLAKE2b digest of the classpath and the kwargs rendered
        as JSON with sorted keys (see :mod:`sharedstream.engine.payload_json`),
        so the order of the kwargs does not matter. Raises ``TypeError`` for
        a kwarg value that has no JSON form. Pure; safe from any thread.
        """
        text = f"{classpath}\0{dumps(kwargs, sort_keys=True)}".encode()
        digest = hashlib.blake2b(text, digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def shared_stream_key(self) -> Hashable | None:
        """Identify the upstream this trigger can share, or ``None`` to run ``run()`` alone.

        Read once when the trigger starts. Derive it only from configuration
        that decides *what* is consumed and *how* (topic, queue, credentials,
        consumer settings): every setting that changes the shared consumer
        must be in the key, because the group is built from the first
        subscriber's kwargs.
        """
        return None

    def shared_stream_name(self) -> str | None:
        """Optionally, the stream's name for people, in the broker's words (not Airflow's API).

        ``kafka orders (group sharedstream-orders)``, ``sqs orders-queue``:
        what is consumed, and by which group, never a connection string,
        credential or host (the runtime appends a digest of the key where two
        streams would otherwise share a name; see
        :mod:`sharedstream.engine.names`). Read once, when the stream is
        first named; log lines, metrics, the status and dead letters all use
        the name. ``None`` (the default): the broker word and that digest.
        Pure and cheap; it must not read connections.
        """
        return None

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """Poll the shared upstream and yield raw events (fast path).

        Called once per group with the first subscriber's serialized kwargs.
        Must yield for the lifetime of the group or raise; returning is
        reported to every subscriber as :class:`PollTerminated`. Not called
        in ack mode, where the producer's ``open_stream`` supplies events.
        """
        raise NotImplementedError(
            f"{cls.__qualname__} declares a shared_stream_key but implements neither "
            "open_shared_stream nor create_shared_stream_producer"
        )
        yield  # type: ignore[unreachable]  # makes this an async generator

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """Build the broker-side producer of this trigger's group (ack mode).

        Overriding this classmethod anywhere in the class hierarchy switches
        the group to ack mode. It is called once per group, with the first
        subscriber's kwargs; it must not connect to anything - the producer
        opens its connection lazily in ``open_stream``.
        """
        raise NotImplementedError(f"{cls.__qualname__} does not create a shared-stream producer")

    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        """Optionally, a quick test that lets the runtime skip raw events for this trigger.

        Returns ``None`` (the default: the filter sees every raw event) or a
        synchronous ``accept(raw_event) -> bool``. The runtime calls it once
        per raw event and subscriber, in the poll's task, when the event is
        fanned out. Returning ``False`` is a promise that
        :meth:`filter_shared_stream` would neither yield an event for that
        raw event nor reject it; the runtime then does not hand it over and
        it counts as processed by this trigger, with nothing derived (acked
        at once in ack mode). When in doubt (a value that does not decode,
        say), return ``True`` and let the filter decide. ``accept`` must be
        cheap and free of side effects; if it raises, a warning is logged and
        the test is dropped: the filter gets that raw event and every later one.

        Called once, when the trigger subscribes. The Kafka and SQS triggers
        return their declarative ``match`` here, so the usual "1 in N"
        watchers cost one test per raw event instead of a pass through
        their filters.
        """
        return None

    def payload_is_native(self, event: TriggerEvent) -> bool:
        """Optionally, vouch that ``event`` (just yielded) needs no type check to be stored.

        The runtime calls it for every event :meth:`filter_shared_stream`
        yields, before anything else runs. ``True`` promises that the payload
        holds only ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
        and ``list`` and ``str``-keyed ``dict`` of them (exact types),
        nested fewer than ``MAX_DEPTH - 2`` containers deep (see
        :mod:`sharedstream.runtime.serde`): the runtime then packs it directly, without
        walking it first. A value msgpack cannot pack as is (a tuple, a set,
        a ``datetime``, a subclass, an ``int`` past 64 bits) is still caught
        and packed the checked way; ``bytearray`` and ``memoryview`` are not
        (they would be stored as ``bytes``). The default, ``False``, checks
        every payload. Broker triggers built on the broker kit's
        ``BrokerTrigger`` vouch for the payloads their own filter builds from
        JSON, text and bytes values.
        """
        return False

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Turn the shared raw events into this trigger's events.

        Iterate ``shared_stream`` and yield a :class:`TriggerEvent` for each raw
        event that matters. Yield every event derived from a raw event before
        pulling the next one: that is how each event is tied to its raw
        event's acknowledgement. In ack mode, call
        :func:`reject_shared_stream_event` instead of yielding to have the
        broker dead-letter the raw event.
        """
        raise NotImplementedError(
            f"{type(self).__qualname__} declares a shared_stream_key but does not "
            "implement filter_shared_stream"
        )
        yield  # type: ignore[unreachable]  # makes this an async generator


def uses_ack_mode(trigger_class: type[BaseEventTrigger]) -> bool:
    """Tell whether ``trigger_class`` overrides ``create_shared_stream_producer``.

    The override may sit anywhere in the hierarchy above ``BaseEventTrigger``.
    """
    for klass in trigger_class.__mro__:
        if klass is BaseEventTrigger:
            return False
        if "create_shared_stream_producer" in vars(klass):
            return True
    return False
