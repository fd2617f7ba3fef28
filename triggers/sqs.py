"""Amazon SQS asset watchers: many triggers, one receiving client per queue.

:class:`SqsSharedStreamTrigger` runs in ack mode on
:class:`~sharedstream.producers.sqs.SqsSharedStreamProducer`: every trigger
of a queue with the same consumer settings shares one receiver, and a
message is deleted only once every trigger is done with it and the events
it fired are stored.

A trigger decodes each message body (``body_format``), applies its
declarative ``match`` and fires one event per matching message::

    SqsSharedStreamTrigger(
        queue="https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
        region_name="eu-west-1", body_format="json", dead_letter_queue="orders-dlq",
        match={"attributes": {"source": "web"}, "json": {"order.country": "NL"}},
    )

A body that does not decode is *rejected*: dead-lettered (or deleted with a
warning when no ``dead_letter_queue`` is set), never redelivered.

For logic a dict cannot express, subclass and override :meth:`matches`
(called with the decoded body and the raw
:class:`~sharedstream.producers.sqs.SqsMessage`) or
:meth:`filter_shared_stream`; the subclass keeps the shared-stream key, so
it shares the receiver with plain watchers of the queue.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any

from sharedstream.brokerkit.codecs import (
    DECODERS,
    MISSING,
    as_text,
    lookup,
    match_prefilter,
    shared_prefilter,
)
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.producers.sqs import (
    SqsConfigError,
    SqsMessage,
    SqsSettings,
    SqsSharedStreamProducer,
    queue_name,
)

__all__ = ["BODY_FORMATS", "SqsSharedStreamTrigger"]

BODY_FORMATS = ("text", "bytes", "json", "msgpack")
_MATCH_FIELDS = frozenset({"attributes", "json"})
_CONSUMER_SETTINGS = ("region_name", "endpoint_url", "wait_time_seconds", "max_messages",
                      "receive_concurrency", "visibility_timeout", "failure_visibility",
                      "dead_letter_queue", "max_redeliveries", "max_in_flight")


def _from_base64(body: bytes) -> bytes:
    try:
        return base64.b64decode(body, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from exc


_BODY_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "json": DECODERS["json"],
    "msgpack": lambda body: DECODERS["msgpack"](_from_base64(body)),
}


class SqsSharedStreamTrigger(BaseEventTrigger):
    """Fire for each message of ``queue`` whose decoded body matches ``match``.

    :param queue: the queue URL, or its name (looked up with ``GetQueueUrl``).
        A queue named by URL and by name is the same queue: such triggers
        share one receiver.
    :param region_name: AWS region. :param endpoint_url: for emulators or VPC
        endpoints. :param credentials: ``aws_access_key_id`` /
        ``aws_secret_access_key`` / ``aws_session_token`` (``None``: botocore's
        usual chain); only a digest enters the shared-stream key.
    :param wait_time_seconds: long-poll wait per receive (0..20).
    :param max_messages: messages per receive (1..10).
    :param receive_concurrency: long-polling receives in flight at most.
    :param visibility_timeout: seconds a received message stays hidden; it
        is renewed while subscribers work on it.
    :param failure_visibility: seconds before a failed message is received
        again (doubled per earlier failure; 0: at once).
    :param dead_letter_queue: URL or name for rejected and poison messages;
        ``None`` deletes them with a warning.
    :param max_redeliveries: failed deliveries of one message tolerated
        before it is dead-lettered.
    :param max_in_flight: messages received and not yet advanced before
        receiving pauses.
    :param body_format: ``text`` (as is), ``bytes`` (UTF-8 encoded),
        ``json``, or ``msgpack`` (base64 text, as SQS bodies are text).
    :param match: ``{"attributes": {name: value}, "json": {"a.b": value}}``;
        every given condition must hold. ``json`` paths need ``json`` or
        ``msgpack`` bodies.

    The payload of each event is a dict: ``value`` (decoded body),
    ``message_id``, ``attributes`` (message attributes), ``receive_count``,
    ``group_id`` (FIFO queues, else ``None``) and ``sent_timestamp`` (ms).
    """

    def __init__(
        self,
        *,
        queue: str,
        region_name: str = "us-east-1",
        endpoint_url: str | None = None,
        credentials: dict[str, str] | None = None,
        wait_time_seconds: int = 20,
        max_messages: int = 10,
        receive_concurrency: int = 4,
        visibility_timeout: int = 30,
        failure_visibility: int = 0,
        dead_letter_queue: str | None = None,
        max_redeliveries: int = 5,
        max_in_flight: int = 500,
        body_format: str = "text",
        match: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if body_format not in BODY_FORMATS:
            raise ValueError(f"body_format must be one of {BODY_FORMATS}, got {body_format!r}")
        match = dict(match or {})
        unknown = set(match) - _MATCH_FIELDS
        if unknown:
            raise ValueError(f"unknown match fields {sorted(unknown)}; use {sorted(_MATCH_FIELDS)}")
        if "json" in match and body_format not in ("json", "msgpack"):
            raise ValueError("match['json'] needs body_format 'json' or 'msgpack'")
        self.queue = queue
        self.credentials = dict(credentials or {})
        self.region_name = region_name
        self.endpoint_url = endpoint_url
        self.wait_time_seconds = wait_time_seconds
        self.max_messages = max_messages
        self.receive_concurrency = receive_concurrency
        self.visibility_timeout = visibility_timeout
        self.failure_visibility = failure_visibility
        self.dead_letter_queue = dead_letter_queue
        self.max_redeliveries = max_redeliveries
        self.max_in_flight = max_in_flight
        self.body_format = body_format
        self.match = match
        self._json_paths = tuple((tuple(path.split(".")), wanted)
                                 for path, wanted in match.get("json", {}).items())
        self.settings()  # refuse unusable settings where the trigger is declared

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``; rebuilt as ``cls(**kwargs)`` by the triggerer."""
        kwargs = {**self._consumer_kwargs(), "body_format": self.body_format,
                  "match": self.match}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def _consumer_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"queue": self.queue, "credentials": self.credentials}
        kwargs.update({name: getattr(self, name) for name in _CONSUMER_SETTINGS})
        return kwargs

    def settings(self) -> SqsSettings:
        """The shared receiver's settings (validated)."""
        return self._settings_from(self._consumer_kwargs())

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> SqsSettings:
        if "queue" not in kwargs:
            raise SqsConfigError("missing SQS trigger setting 'queue'")
        defaults = SqsSettings(queue=kwargs["queue"])
        settings = SqsSettings(
            queue=kwargs["queue"],
            credentials=dict(kwargs.get("credentials") or {}),
            **{name: kwargs.get(name, getattr(defaults, name)) for name in _CONSUMER_SETTINGS},
        )
        settings.validate()
        return settings

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: this trigger always runs on its shared stream."""
        raise NotImplementedError("SqsSharedStreamTrigger runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def shared_stream_key(self) -> Hashable:
        """The queue and every consumer setting; not the per-trigger decoding or matching.

        The queue enters by name, so a URL and a name of one queue agree.
        Credentials enter as a digest, never in clear. Triggers of one queue
        whose consumer settings differ get different keys, and the second
        receiver is refused when it opens (see the producer module).
        """
        settings = self.settings()
        return ("sqs", *settings.identity(), settings.credentials_digest(),
                *(getattr(self, name) for name in _CONSUMER_SETTINGS[2:]))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet)."""
        return SqsSharedStreamProducer(cls._settings_from(kwargs))

    # -- filtering -----------------------------------------------------------------------

    def decode(self, message: SqsMessage) -> Any:
        """Decode the body per ``body_format``; raise ``ValueError`` if it cannot."""
        if self.body_format == "text":
            return message.body
        if self.body_format == "bytes":
            return message.body.encode()
        return message.decoded(self.body_format, _BODY_DECODERS[self.body_format])

    def matches(self, value: Any, message: SqsMessage) -> bool:
        """Whether the message passes ``match``; override for custom filters."""
        match = self.match
        if "attributes" in match:
            attributes = message.attributes
            for name, wanted in match["attributes"].items():
                if name not in attributes or as_text(attributes[name]) != as_text(wanted):
                    return False
        return all(lookup(value, parts) == wanted for parts, wanted in self._json_paths)

    def to_payload(self, value: Any, message: SqsMessage) -> dict[str, Any]:
        """The event payload for a matching message."""
        return {
            "value": value,
            "message_id": message.message_id,
            "attributes": dict(message.attributes),
            "receive_count": message.receive_count,
            "group_id": message.group_id,
            "sent_timestamp": message.sent_timestamp,
        }

    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        """Skip, at fan-out, each message that decodes but does not match.

        An undecodable message still reaches the filter, which rejects it; see
        :func:`~sharedstream.brokerkit.codecs.match_prefilter` for when there is no
        test. ``decode`` and ``matches`` then also run in the poll's task:
        keep them free of side effects.
        """
        return match_prefilter(self, SqsSharedStreamTrigger, declared=bool(self.match),
                               shared=self._shared_prefilter)

    def _shared_prefilter(self) -> Callable[[Any], bool]:
        # The declarative match alone: one selection per message for every trigger
        # whose match has the same shape (typically: the same JSON path).
        wanted_attributes = self.match.get("attributes", {})
        names = tuple(wanted_attributes)
        parts = tuple(path for path, _ in self._json_paths)
        decode = self.decode

        def select(message: SqsMessage) -> tuple[Any, ...]:
            value = decode(message)
            attributes = message.attributes
            selected = [as_text(attributes[name]) if name in attributes else MISSING
                        for name in names]
            selected.extend(lookup(value, path) for path in parts)
            return tuple(selected)

        wanted = (*(as_text(wanted_attributes[name]) for name in names),
                  *(w for _, w in self._json_paths))
        shape = ("sqs", self.body_format, names, parts)
        return shared_prefilter(shape, select, wanted)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Decode, reject what does not decode, fire for what matches."""
        async for message in shared_stream:
            try:
                value = self.decode(message)
            except ValueError as exc:
                self.log.warning("rejecting %s from %s: %s", message.message_id,
                                 queue_name(message.queue), exc)
                reject_shared_stream_event(str(exc))
                continue
            if self.matches(value, message):
                yield TriggerEvent(self.to_payload(value, message))
