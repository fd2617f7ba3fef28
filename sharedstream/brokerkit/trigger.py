"""The base class of broker triggers: decode each message, match it, fire or reject it.

A broker's trigger class (``KafkaSharedStreamTrigger``, ``SqsSharedStreamTrigger``)
subclasses :class:`BrokerTrigger` *directly* and says only what is specific to
its broker (the hooks marked "broker" below): which payload formats and
match fields it takes, where its message type keeps the body, key and named
values (headers, attributes), the payload of an event, the consumer's
kwargs, the shared-stream key and the producer. The base class holds the rest
once: checking ``payload_format`` and ``match`` at construction,
``serialize``, ``run`` (refused), ``decode``, ``matches``, the prefilter, the
filter loop and ``payload_is_native``.

Terms: the *broker class* is the direct subclass of :class:`BrokerTrigger`; a
*custom subclass* is a user's subclass of a broker class (one that overrides
``matches``, say). The raw events are the broker's message objects, shared
read-only by every filter of the stream; those decoded with a
:class:`~sharedstream.brokerkit.codecs.PayloadFormat` that has a decoder
must be :class:`~sharedstream.brokerkit.codecs.DecodeCache` instances.

Invariants (checked in ``tests/unit/test_broker_trigger.py``):

1. ``payload_format`` and ``match`` are checked in ``__init__``; a bad one
   raises ``ValueError`` with one line naming the option. ``match`` is
   compiled there, once: ``self.match`` keeps the declared dict for
   ``serialize``, and assigning to it later changes nothing.
2. A message whose body does not decode is *rejected*
   (``reject_shared_stream_event`` with the decoding error as the reason,
   so the producer dead-letters it), never matched, and never ends the filter.
3. ``shared_stream_prefilter`` declines a message only when the filter would
   neither fire nor reject for it: a custom ``filter_shared_stream`` gets no
   prefilter, a custom ``decode`` or ``matches`` gets one that calls them.
4. ``payload_is_native`` is true only for an event the base class's own
   filter just built with the broker class's own ``decode`` path and
   ``to_payload``, from a native format, for a message whose other payload
   fields the broker says are native, and, for a document, one with fewer
   than :data:`MAX_VOUCHED_BRACKETS` brackets.

Nothing here imports a broker SDK or the runtime.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import (
    MISSING,
    PayloadFormat,
    as_text,
    compile_match,
    decoding_prefilter,
    lookup,
    shared_prefilter,
)
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = ["MAX_VOUCHED_BRACKETS", "BrokerTrigger"]

MAX_VOUCHED_BRACKETS = 97
"""A document with fewer ``[`` and ``{`` than this surely nests shallowly enough to vouch for.

It is ``sharedstream.runtime.serde.MAX_DEPTH - 3``: the event payload and the
stored kwargs add two levels, and a vouched payload must nest fewer than
``MAX_DEPTH - 2`` deep. The kit may not import the runtime, so the number is
restated here; a unit test holds it to ``serde.MAX_DEPTH``.
"""


def _shallow(document: bytes | str | None) -> bool:
    """Whether a JSON document surely nests fewer than ``MAX_VOUCHED_BRACKETS`` deep."""
    if document is None or len(document) < MAX_VOUCHED_BRACKETS:
        return True
    if isinstance(document, str):
        return document.count("[") + document.count("{") < MAX_VOUCHED_BRACKETS
    return document.count(b"[") + document.count(b"{") < MAX_VOUCHED_BRACKETS


class BrokerTrigger(BaseEventTrigger):
    """A broker's asset watcher: decode each message, match it, fire or reject it.

    Every trigger of one shared stream receives the same message objects;
    each decodes the body per its ``payload_format`` (the decoding is
    cached in the message, so it runs once per format, not once per
    trigger), applies its ``match`` and yields one event per matching
    message. A body that does not decode is rejected.

    A broker class provides the class attributes :attr:`payload_formats`,
    :attr:`match_key_field` and :attr:`match_named_field`, and the methods
    :meth:`consumer_kwargs`, :meth:`message_body`, :meth:`message_key` (when
    it has a key field), :meth:`message_named_values` (when it has a named
    field), :meth:`message_fields_native`, :meth:`describe_message`,
    :meth:`to_payload`, :meth:`shared_stream_key` and
    :meth:`create_shared_stream_producer`. Its ``__init__`` takes the
    broker's settings plus ``payload_format`` (with the broker's default)
    and ``match``, calls ``super().__init__(payload_format=...,
    match=...)`` first, and then sets and validates its own settings.

    A custom subclass may override :meth:`matches` (custom logic; the
    prefilter then calls it), :meth:`decode` or :meth:`filter_shared_stream`
    itself; it keeps the shared-stream key, so it shares the consumer with
    plain watchers of the stream.
    """

    payload_formats: ClassVar[Mapping[str, PayloadFormat]]
    """Broker: the ``payload_format`` values it takes, in the order its docs list them."""
    match_key_field: ClassVar[str | None] = None
    """Broker: the ``match`` field naming a wanted message key (``"key"``), if it has keys."""
    match_named_field: ClassVar[str | None] = None
    """Broker: the ``match`` field of wanted named values (``"headers"``, ``"attributes"``)."""

    _broker_class: ClassVar[type[BrokerTrigger]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if BrokerTrigger in cls.__bases__:
            cls._broker_class = cls  # what "the broker's own to_payload" means for vouching

    def __init__(self, *, payload_format: str, match: Mapping[str, Any] | None) -> None:
        """Check and compile ``payload_format`` and ``match``; raise ``ValueError`` if bad.

        Called first by the broker class's ``__init__``. ``match`` holds the
        fields ``match_key_field`` (a key, text or bytes),
        ``match_named_field`` (``{name: text or bytes}``) and ``"json"``
        (``{"dotted.path": value}``, which needs a document format); every
        given condition must hold, and an empty match fires for every message.
        """
        super().__init__()
        formats = self.payload_formats
        if payload_format not in formats:
            raise ValueError(
                f"payload_format must be one of {tuple(formats)}, got {payload_format!r}")
        chosen = formats[payload_format]
        self._compiled = compile_match(
            match, key_field=self.match_key_field, named_field=self.match_named_field,
            document=chosen.document, payload_format=payload_format,
            document_formats=tuple(name for name, fmt in formats.items() if fmt.document),
        )
        self.payload_format = payload_format
        self.match: dict[str, Any] = dict(match or {})
        self._format = chosen
        self._native_event: TriggerEvent | None = None  # see payload_is_native

    # -- broker hooks ------------------------------------------------------------------------

    @abc.abstractmethod
    def consumer_kwargs(self) -> dict[str, Any]:
        """Broker: the constructor kwargs other than ``payload_format`` and ``match``.

        :meth:`serialize` stores them with those two; the result must be
        deterministic and rebuild the same trigger.
        """

    @abc.abstractmethod
    def message_body(self, message: Any) -> bytes | str | None:
        """Broker: the body as ``message`` holds it (Kafka: the value; SQS: the text).

        It is the value of an undecoded format (``AS_HELD``) and what a
        document's nesting is estimated from. Cheap and free of side effects:
        it runs in the poll's task too.
        """

    def message_key(self, message: Any) -> bytes | str | None:
        """Broker, with a ``match_key_field``: the message's key, compared as text."""
        raise NotImplementedError(f"{type(self).__qualname__} has no message key")

    def message_named_values(self, message: Any) -> Mapping[str, bytes | str | None]:
        """Broker, with a ``match_named_field``: the message's headers or attributes by name.

        Values are compared as text; for a name given twice, the mapping
        says which value counts. Cheap and free of side effects.
        """
        raise NotImplementedError(f"{type(self).__qualname__} has no named values")

    def message_fields_native(self, message: Any) -> bool:
        """Broker: whether :meth:`to_payload`'s fields other than ``value`` are native.

        Native: only ``None``, ``bool``, ``int``, ``float``, ``str``,
        ``bytes``, ``list`` and ``str``-keyed ``dict`` (exact types), a few
        levels deep. ``False`` (the default) never vouches.
        """
        return False

    @abc.abstractmethod
    def describe_message(self, message: Any) -> str:
        """Broker: where ``message`` is, for a log line (``orders/0/17``, a message id...)."""

    @abc.abstractmethod
    def to_payload(self, value: Any, message: Any) -> dict[str, Any]:
        """Broker: the event payload for a matching message, ``value`` being its decoded body.

        A custom subclass may override it; its payloads are then no longer
        vouched for (see :meth:`payload_is_native`).
        """

    @abc.abstractmethod
    def shared_stream_key(self) -> Hashable:
        """Broker: every setting that changes the shared consumer or producer, nothing else.

        ``payload_format`` and ``match`` stay out: each trigger decodes and
        filters on its own, so triggers that differ only there share one
        consumer. Secrets enter as a digest only.
        """

    @classmethod
    @abc.abstractmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """Broker: the group's producer, from the first subscriber's kwargs (no connection yet)."""

    # -- what the base class provides ----------------------------------------------------------

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``; rebuilt as ``cls(**kwargs)`` by the triggerer."""
        kwargs = {**self.consumer_kwargs(), "payload_format": self.payload_format,
                  "match": self.match}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: a broker trigger always runs on its shared stream."""
        raise NotImplementedError(f"{type(self).__qualname__} runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def decode(self, message: Any) -> Any:
        """The body decoded per ``payload_format``; raise ``ValueError`` if it does not decode.

        Decoding is cached in the message, once per format for every filter
        of the stream, failures included. Treat the result as read-only: the
        other triggers get the same object.
        """
        fmt = self._format
        if fmt.decode is None:
            return self.message_body(message)
        return message.decoded(self.payload_format, fmt.decode)

    def matches(self, value: Any, message: Any) -> bool:
        """Whether the message passes ``match``; override for custom filters.

        Called with the decoded body and the raw message, for every message
        that decodes (in the poll's task too, through the prefilter, so keep
        an override free of side effects).
        """
        key, named, paths = self._compiled
        if key is not MISSING and as_text(self.message_key(message)) != key:
            return False
        if named:
            values = self.message_named_values(message)
            for name, wanted in named:
                if (as_text(values[name]) if name in values else MISSING) != wanted:
                    return False
        if len(paths) == 1:  # the usual case, without a generator
            parts, wanted = paths[0]
            return bool(lookup(value, parts) == wanted)
        return all(lookup(value, parts) == wanted for parts, wanted in paths)

    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        """Skip, at fan-out, each message that decodes but does not match.

        An undecodable message still reaches the filter, which rejects it.
        ``None`` when a custom subclass overrides ``filter_shared_stream``
        (its logic is unknown) or when ``match`` is empty and neither
        ``decode`` nor ``matches`` is overridden (everything matches). An
        overridden ``decode`` or ``matches`` is called by the test, in the
        poll's task. The declarative match alone is a keyed test whose
        selection the fan-out computes once per message for all the
        triggers with the same shape of match.
        """
        cls = type(self)
        if cls.filter_shared_stream is not BrokerTrigger.filter_shared_stream:
            return None
        if cls.matches is not BrokerTrigger.matches or cls.decode is not BrokerTrigger.decode:
            return decoding_prefilter(self.decode, self.matches)
        return self._shared_prefilter() if self._compiled else None

    def _shared_prefilter(self) -> Callable[[Any], bool]:
        key, named, paths = self._compiled
        has_key = key is not MISSING
        names = tuple(name for name, _ in named)
        parts = tuple(path for path, _ in paths)
        decode = self.decode
        select: Callable[[Any], tuple[Any, ...]]
        if not has_key and not names and len(parts) == 1:
            (path,) = parts  # the usual watcher: one JSON field

            def select_one(message: Any) -> tuple[Any, ...]:
                return (lookup(decode(message), path),)

            select = select_one
        else:
            select = self._select_all(has_key, names, parts)
        wanted = (*((key,) if has_key else ()), *(w for _, w in named), *(w for _, w in paths))
        cls = type(self)
        # Everything the selection depends on: the format and the hooks that read messages.
        shape = (self.payload_format, self._format, cls.message_body, cls.message_key,
                 cls.message_named_values, has_key, names, parts)
        return shared_prefilter(shape, select, wanted)

    def _select_all(
        self, has_key: bool, names: tuple[str, ...], parts: tuple[tuple[str, ...], ...]
    ) -> Callable[[Any], tuple[Any, ...]]:
        decode, message_key, named_values = (self.decode, self.message_key,
                                             self.message_named_values)

        def select(message: Any) -> tuple[Any, ...]:
            value = decode(message)
            selected: list[Any] = [as_text(message_key(message))] if has_key else []
            if names:
                values = named_values(message)
                selected.extend(as_text(values[name]) if name in values else MISSING
                                for name in names)
            selected.extend(lookup(value, path) for path in parts)
            return tuple(selected)

        return select

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Decode, reject what does not decode, fire for what matches.

        One event per matching message, yielded before the next message is
        pulled. A message that does not decode is logged and rejected with
        the decoding error as the reason; the loop goes on.
        """
        decode, matches, to_payload = self.decode, self.matches, self.to_payload  # per message
        vouch = self._builds_native_payloads()
        document = self._format.document
        for_message = self.message_fields_native
        async for message in shared_stream:
            try:
                value = decode(message)
            except ValueError as exc:
                self.log.warning("rejecting a message that does not decode",
                                 source=self.describe_message(message), error=exc)
                reject_shared_stream_event(str(exc))
                continue
            if matches(value, message):
                event = TriggerEvent(to_payload(value, message))
                if vouch and for_message(message) and (
                        not document or _shallow(self.message_body(message))):
                    self._native_event = event
                yield event

    def payload_is_native(self, event: TriggerEvent) -> bool:
        """True for the event this trigger's filter just built from a native payload.

        Vouched: the base class's filter, decode path and the broker class's
        own ``to_payload`` and ``message_body``, a native format (not
        msgpack, whose values may hold ext types), a message whose other
        payload fields the broker says are native (a Kafka record without
        headers, say), and a document with fewer than
        :data:`MAX_VOUCHED_BRACKETS` brackets. Anything else is checked by
        the runtime as usual.
        """
        return event is self._native_event

    def _builds_native_payloads(self) -> bool:
        cls, broker = type(self), self._broker_class
        return (self._format.native
                and cls.decode is BrokerTrigger.decode
                and cls.filter_shared_stream is BrokerTrigger.filter_shared_stream
                and cls.to_payload is broker.to_payload
                and cls.message_body is broker.message_body)
