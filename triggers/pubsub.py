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

With ``conn_id="google_cloud_default"`` the project (and an emulator host)
not given inline come from that Airflow-style ``google_cloud_platform``
connection (see :mod:`sharedstream.connections`), read in the triggerer
when the producer is built: :func:`pubsub_settings_from_connection` maps it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, PayloadFormat
from sharedstream.brokerkit.fingerprints import fingerprint
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.connections import Connection
from sharedstream.connections.settings import ConnectionReader, resolve_inline
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.pubsub import (
    PubSubConfigError,
    PubSubMessage,
    PubSubSettings,
    PubSubSharedStreamProducer,
)

__all__ = ["PAYLOAD_FORMATS", "PubSubSharedStreamTrigger", "pubsub_settings_from_connection"]

_GCP = "extra__google_cloud_platform__"  # the prefix of Airflow's older extra names
_GCP_CREDENTIALS = ("key_path", "keyfile_dict", "key_secret_name", "key_secret_project_id",
                    "credential_config_file", "impersonation_chain", "is_anonymous",
                    "idp_issuer_url", "idp_extra_parameters")


def pubsub_settings_from_connection(conn: Connection) -> dict[str, Any]:
    """The Pub/Sub trigger settings an Airflow ``google_cloud_platform`` connection gives.

    Extra ``project`` (or Airflow's older ``extra__google_cloud_platform__project``)
    ``emulator_host`` and ``tls_ca_file`` (sharedstream additions). ``num_retries`` is
    ignored (the trigger has its own retries), an empty ``scope`` too, and
    any other extra with one warning.
    Key files, key dicts and impersonation are refused: the trigger
    authenticates with Application Default Credentials
    (``GOOGLE_APPLICATION_CREDENTIALS``); see ``docs/connections.md``.
    """
    read = ConnectionReader(conn, broker="the Pub/Sub trigger",
                            conn_types=("google_cloud_platform",))
    read.refuse([*_GCP_CREDENTIALS, *(_GCP + name for name in _GCP_CREDENTIALS)],
                "it uses Application Default Credentials (set GOOGLE_APPLICATION_CREDENTIALS)")
    read.take("num_retries", _GCP + "num_retries")
    scope = read.take("scope", _GCP + "scope")
    if scope:
        raise read.error("scope is not supported by the Pub/Sub trigger: it uses the "
                         "default scopes of Application Default Credentials", key="scope")
    found = {"project": read.text("project", _GCP + "project"),
             "emulator_host": read.text("emulator_host")}
    if (ca_file := read.text("tls_ca_file")) is not None:
        found["tls_ca_file"] = ca_file
    read.finish(("project", "emulator_host", "tls_ca_file", "num_retries", "scope"),
                refuse=lambda _: False)
    return found

_CONSUMER_SETTINGS = ("dead_letter_topic", "max_redeliveries", "max_in_flight",
                      "max_in_flight_bytes", "ack_deadline", "max_lease_duration",
                      "emulator_host", "tls_ca_file")

PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "bytes": AS_HELD, "utf-8": UTF8, "json": JSON, "msgpack": MSGPACK}
"""``payload_format`` -> how a message's data is decoded (``bytes``: as is)."""


class PubSubSharedStreamTrigger(BrokerTrigger):
    """Fire for each message of ``subscription`` whose decoded data matches ``match``.

    :param project: the Google Cloud project of the subscription and topic ids
        (required unless the connection gives it).
    :param conn_id: an Airflow-style ``google_cloud_platform`` connection
        giving the project (and ``emulator_host``) when not given inline,
        read in the triggerer when the stream is built; only the id is stored.
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
    :param tls_ca_file: a PEM file of certificate authorities: the emulator
        host is then reached over TLS and its certificate verified against
        it (a test server or emulator behind TLS with a private CA).
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
        project: str | None = None,
        subscription: str,
        dead_letter_topic: str | None = None,
        max_redeliveries: int = 5,
        max_in_flight: int = 1000,
        max_in_flight_bytes: int = 100 * 1024 * 1024,
        ack_deadline: int = 60,
        max_lease_duration: int = 3600,
        emulator_host: str | None = None,
        tls_ca_file: str | None = None,
        payload_format: str = "bytes",
        match: dict[str, Any] | None = None,
        conn_id: str | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.conn_id = conn_id
        self.project = project
        self.subscription = subscription
        self.dead_letter_topic = dead_letter_topic
        self.max_redeliveries = max_redeliveries
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.ack_deadline = ack_deadline
        self.max_lease_duration = max_lease_duration
        self.emulator_host = emulator_host
        self.tls_ca_file = tls_ca_file
        # Refuse unusable settings where the trigger is declared; a project left to the
        # connection is checked when the stream is built.
        declared = self.consumer_kwargs()
        if conn_id is not None and project is None:
            declared["project"] = "-"
        self._settings_from(declared)

    def consumer_kwargs(self) -> dict[str, Any]:
        """The stream's constructor kwargs (all but ``payload_format`` and ``match``)."""
        kwargs: dict[str, Any] = {"project": self.project, "subscription": self.subscription}
        kwargs.update({name: getattr(self, name) for name in _CONSUMER_SETTINGS})
        if self.conn_id is not None:
            kwargs["conn_id"] = self.conn_id
        return kwargs

    def settings(self) -> PubSubSettings:
        """The shared stream's settings (validated), the connection's included if any.

        With a ``conn_id`` this reads the connection (raises
        ``ConnectionNotFound`` if it is missing): call it in the triggerer.
        """
        return self._settings_from(
            resolve_inline(self.consumer_kwargs(), pubsub_settings_from_connection))

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> PubSubSettings:
        for name in ("project", "subscription"):
            if kwargs.get(name) is None:
                via = f" (nor by connection {kwargs['conn_id']!r})" if kwargs.get("conn_id") else ""
                raise PubSubConfigError(f"missing Pub/Sub trigger setting {name!r}{via}")
        defaults = PubSubSettings(project=kwargs["project"], subscription=kwargs["subscription"])
        settings = PubSubSettings(
            project=kwargs["project"], subscription=kwargs["subscription"],
            **{name: kwargs.get(name, getattr(defaults, name)) for name in _CONSUMER_SETTINGS},
        )
        settings.validate()
        return settings

    def shared_stream_name(self) -> str:
        """``pubsub orders-sub (project shop)``: the subscription's id and its project."""
        project, subscription = self.project, self.subscription
        if subscription.startswith("projects/"):  # a full path: projects/<p>/subscriptions/<s>
            parts = subscription.split("/")
            project, subscription = parts[1], parts[-1]
        return f"pubsub {subscription}" + (f" (project {project})" if project else "")

    def shared_stream_key(self) -> Hashable:
        """The subscription and a fingerprint of every consumer setting; no filter setting.

        The subscription enters as its full path, so an id and a path agree.
        Triggers of one subscription whose consumer settings differ get
        different keys, and the second stream is refused when it opens.
        """
        if self.conn_id is not None:  # by id: the connection is never read here
            consumer = {name: getattr(self, name) for name in _CONSUMER_SETTINGS}
            return ("pubsub", self.emulator_host, self.project, self.subscription,
                    fingerprint(consumer), ("conn_id", self.conn_id))
        settings = self.settings()
        consumer = {name: getattr(settings, name) for name in _CONSUMER_SETTINGS}
        consumer["dead_letter_topic"] = settings.dead_letter_path
        return ("pubsub", *settings.identity(), fingerprint(consumer))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet).

        A ``conn_id`` among them is resolved now, in the triggerer (see
        :func:`pubsub_settings_from_connection`); ``ConnectionNotFound`` or
        ``InvalidConnection`` (broker configuration errors) if it cannot be.
        """
        return PubSubSharedStreamProducer(cls._settings_from(
            resolve_inline(kwargs, pubsub_settings_from_connection)))

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
