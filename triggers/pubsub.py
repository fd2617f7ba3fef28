"""Google Pub/Sub asset watchers: many triggers, one streaming pull per subscription.

:class:`PubSubSharedStreamTrigger` runs in ack mode on
:class:`~sharedstream.producers.pubsub.PubSubSharedStreamProducer`: every
trigger of a subscription with the same consumer settings shares one
streaming pull, and a message is acked only once every trigger is done with
it and the events it fired are stored::

    PubSubSharedStreamTrigger(
        project="my-project", subscription="orders-etl", payload_format="json",
        dead_letter_topic="orders-dlq",
        match={"attributes": {"source": "web"}, "json": {"order.country": "NL"}},
    )

A body that does not decode is *rejected*: published to the dead-letter
topic (or handed to the store's dead letters, or discarded with a warning,
when none is set), never redelivered.

Decoding, matching, the prefilter, the filter and vouching for payloads come
from :class:`~sharedstream.brokerkit.trigger.BrokerTrigger`; this module says
where a Pub/Sub message keeps its body and attributes, what an event's
payload is, and which settings make the shared stream.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, PayloadFormat
from sharedstream.brokerkit.fingerprints import fingerprint
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.pubsub import (
    PubSubConfigError,
    PubSubMessage,
    PubSubSettings,
    PubSubSharedStreamProducer,
)

__all__ = ["PAYLOAD_FORMATS", "PubSubSharedStreamTrigger"]

_CONSUMER_SETTINGS = ("dead_letter_topic", "max_redeliveries", "max_in_flight",
                      "max_in_flight_bytes", "ack_deadline", "max_lease_duration",
                      "emulator_host")

PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "bytes": AS_HELD, "utf-8": UTF8, "json": JSON, "msgpack": MSGPACK}
"""``payload_format`` -> how a message's data is decoded (``bytes``: as is)."""


class PubSubSharedStreamTrigger(BrokerTrigger):
    """Fire for each message of ``subscription`` whose decoded data matches ``match``.

    :param project: the Google Cloud project of the subscription and topic ids.
    :param subscription: a subscription id of ``project``, or a full
        ``projects/<p>/subscriptions/<s>`` path (both name the same one).
    :param dead_letter_topic: a topic id or path for rejected and poison
        messages; ``None`` hands them to the store's dead letters (or
        discards them with a warning outside the runtime).
    :param max_redeliveries: failed deliveries of one message tolerated
        before it is dead-lettered.
    :param max_in_flight: messages received and not yet advanced (the
        stream's ``max_outstanding_messages``). :param max_in_flight_bytes:
        the stream's ``max_outstanding_bytes``.
    :param ack_deadline: seconds of a lease (10..600), renewed while the
        message is outstanding. :param max_lease_duration: seconds after
        receipt past which it is no longer renewed.
    :param emulator_host: ``host:port`` of an emulator (else
        ``PUBSUB_EMULATOR_HOST``, else Google with Application Default
        Credentials).
    :param payload_format: ``bytes`` (as is), ``utf-8``, ``json`` or ``msgpack``.
    :param match: ``{"attributes": {name: value}, "json": {"a.b": value}}``;
        every given condition must hold.

    The payload of each event is a dict: ``value`` (decoded data),
    ``message_id``, ``attributes``, ``ordering_key`` (``""`` when none),
    ``publish_time`` (ISO 8601) and ``delivery_attempt`` (``None`` unless
    the subscription has a dead-letter policy).
    """

    payload_formats: ClassVar[Mapping[str, PayloadFormat]] = PAYLOAD_FORMATS
    match_named_field = "attributes"

    def __init__(
        self,
        *,
        project: str,
        subscription: str,
        dead_letter_topic: str | None = None,
        max_redeliveries: int = 5,
        max_in_flight: int = 1000,
        max_in_flight_bytes: int = 100 * 1024 * 1024,
        ack_deadline: int = 60,
        max_lease_duration: int = 3600,
        emulator_host: str | None = None,
        payload_format: str = "bytes",
        match: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.project = project
        self.subscription = subscription
        self.dead_letter_topic = dead_letter_topic
        self.max_redeliveries = max_redeliveries
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.ack_deadline = ack_deadline
        self.max_lease_duration = max_lease_duration
        self.emulator_host = emulator_host
        self.settings()  # refuse unusable settings where the trigger is declared

    def consumer_kwargs(self) -> dict[str, Any]:
        """The stream's constructor kwargs (all but ``payload_format`` and ``match``)."""
        kwargs: dict[str, Any] = {"project": self.project, "subscription": self.subscription}
        kwargs.update({name: getattr(self, name) for name in _CONSUMER_SETTINGS})
        return kwargs

    def settings(self) -> PubSubSettings:
        """The shared stream's settings (validated)."""
        return self._settings_from(self.consumer_kwargs())

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> PubSubSettings:
        for name in ("project", "subscription"):
            if name not in kwargs:
                raise PubSubConfigError(f"missing Pub/Sub trigger setting {name!r}")
        defaults = PubSubSettings(project=kwargs["project"], subscription=kwargs["subscription"])
        settings = PubSubSettings(
            project=kwargs["project"], subscription=kwargs["subscription"],
            **{name: kwargs.get(name, getattr(defaults, name)) for name in _CONSUMER_SETTINGS},
        )
        settings.validate()
        return settings

    def shared_stream_key(self) -> Hashable:
        """The subscription and a fingerprint of every consumer setting; no filter setting.

        The subscription enters as its full path, so an id and a path agree.
        Triggers of one subscription whose consumer settings differ get
        different keys, and the second stream is refused when it opens.
        """
        settings = self.settings()
        consumer = {name: getattr(settings, name) for name in _CONSUMER_SETTINGS}
        consumer["dead_letter_topic"] = settings.dead_letter_path
        return ("pubsub", *settings.identity(), fingerprint(consumer))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet)."""
        return PubSubSharedStreamProducer(cls._settings_from(kwargs))

    # -- what a message holds --------------------------------------------------------------

    def message_body(self, message: PubSubMessage) -> bytes:
        """The message's data."""
        return message.data

    def message_named_values(self, message: PubSubMessage) -> Mapping[str, str]:
        """The message attributes by name."""
        return message.attributes

    def message_fields_native(self, message: PubSubMessage) -> bool:
        """Always: ids, attributes, keys and times are text, and the attempt an int."""
        return True

    def describe_message(self, message: PubSubMessage) -> str:
        """``message-id from subscription-path``."""
        return f"{message.message_id} from {message.subscription}"

    def to_payload(self, value: Any, message: PubSubMessage) -> dict[str, Any]:
        """The event payload for a matching message."""
        return {
            "value": value,
            "message_id": message.message_id,
            "attributes": dict(message.attributes),
            "ordering_key": message.ordering_key,
            "publish_time": message.publish_time,
            "delivery_attempt": message.delivery_attempt,
        }
