"""Azure Service Bus asset watchers: many triggers, one peek-lock receiver per entity.

:class:`ServiceBusSharedStreamTrigger` runs in ack mode on
:class:`~sharedstream.producers.servicebus.ServiceBusSharedStreamProducer`:
every trigger of a queue (or topic subscription) with the same consumer
settings shares one receiver, and a message is completed only once every
trigger is done with it and the events it fired are stored::

    ServiceBusSharedStreamTrigger(
        connection_string=os.environ["ORDERS_SERVICEBUS"], queue="orders",
        payload_format="json",
        match={"properties": {"source": "web"}, "json": {"order.country": "NL"}},
    )

A body that does not decode is *rejected*: dead-lettered into the entity's
dead-letter sub-queue with the reason ``sharedstream.rejected``, never
delivered again.

Decoding, matching, the prefilter, the filter and vouching for payloads come
from :class:`~sharedstream.brokerkit.trigger.BrokerTrigger`; this module says
where a Service Bus message keeps its body and properties, what an event's
payload is, and which settings make the shared receiver.

With ``conn_id="azure_service_bus_default"`` where to connect comes from that
Airflow-style ``azure_service_bus`` connection (see
:mod:`sharedstream.connections`) when the trigger gives none of
``connection_string``, ``namespace`` and ``credential``; it is read in the
triggerer when the producer is built: :func:`servicebus_settings_from_connection`
maps it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, PayloadFormat
from sharedstream.brokerkit.fingerprints import fingerprint, secret_digest
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.connections import Connection
from sharedstream.connections.settings import ConnectionReader, resolve_inline
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.servicebus import (
    ServiceBusMessage,
    ServiceBusSettings,
    ServiceBusSharedStreamProducer,
)

__all__ = ["PAYLOAD_FORMATS", "ServiceBusSharedStreamTrigger",
           "servicebus_settings_from_connection"]

_CONNECTION = ("connection_string", "namespace", "credential")
_ENTITY = ("queue", "topic", "subscription")
_CONSUMER_SETTINGS = ("sessions", "max_sessions", "max_messages", "max_wait_time",
                      "max_in_flight", "lock_duration", "max_lock_renewal", "max_redeliveries",
                      "settle_concurrency", "connection_verify", "custom_endpoint_address")

PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "bytes": AS_HELD, "utf-8": UTF8, "json": JSON, "msgpack": MSGPACK}
"""``payload_format`` -> how a message body is decoded (``bytes``: as is)."""

_PLACEHOLDER_NAMESPACE = "connection.servicebus.windows.net"  # checks before a connection is read
_SAS_KEYS = ("shared_access_key_name", "shared_access_key")


def servicebus_settings_from_connection(conn: Connection) -> dict[str, Any]:
    """Where to connect, from an Airflow ``azure_service_bus`` connection (``docs/connections.md``).

    As in Airflow's Azure provider: the connection string is the ``schema``
    field (the form's "Connection String"; extra ``connection_string`` is
    read too), else extra ``fully_qualified_namespace`` with azure-identity's
    ``DefaultAzureCredential``. sharedstream adds extra
    ``shared_access_key_name`` + ``shared_access_key``, or ``sas_token``, as
    the namespace's credential. ``managed_identity_client_id`` and
    ``workload_identity_tenant_id`` are refused: set ``AZURE_CLIENT_ID`` /
    ``AZURE_TENANT_ID`` for ``DefaultAzureCredential`` instead. Other
    extras are ignored, with one warning.
    """
    read = ConnectionReader(conn, broker="the Service Bus trigger",
                            conn_types=("azure_service_bus",))
    read.refuse(("managed_identity_client_id", "workload_identity_tenant_id"),
                "set AZURE_CLIENT_ID / AZURE_TENANT_ID for DefaultAzureCredential instead")
    found: dict[str, Any] = {
        "connection_string": read.field("schema") or read.text("connection_string"),
        "namespace": read.text("fully_qualified_namespace")}
    keys = {name: read.text(name) for name in (*_SAS_KEYS, "sas_token")}
    credential = {name: value for name, value in keys.items() if value is not None}
    if credential:
        found["credential"] = credential
    read.finish(("connection_string", "fully_qualified_namespace", "sas_token", *_SAS_KEYS),
                refuse=lambda _: False)
    return found


class ServiceBusSharedStreamTrigger(BrokerTrigger):
    """Fire for each message of a queue or subscription whose decoded body matches ``match``.

    :param connection_string: the namespace's connection string (kept
        encrypted with the trigger's kwargs; only its namespace and a digest
        enter the shared-stream key); or :param namespace: the fully qualified
        namespace with :param credential: ``{"shared_access_key_name": ...,
        "shared_access_key": ...}``, ``{"sas_token": ...}``, or ``None`` for
        Microsoft Entra ID (azure-identity's ``DefaultAzureCredential``).
    :param queue: a queue name; or :param topic: and :param subscription:
        a topic and one of its subscriptions.
    :param sessions: the entity requires sessions: each session is a lane
        (order kept), up to ``max_sessions`` received at once.
    :param max_messages: messages per receive call. :param max_wait_time:
        seconds a receive waits for a first message.
    :param max_in_flight: messages received and not yet advanced before
        receiving pauses.
    :param lock_duration: the entity's message lock in seconds (renewal is
        planned on it; a shorter lock seen on messages is used instead).
    :param max_lock_renewal: seconds after receipt past which a lock is no
        longer renewed.
    :param max_redeliveries: failed deliveries of one message tolerated
        before it is dead-lettered.
    :param settle_concurrency: abandons and dead-letterings in flight at
        once (completions go one at a time, in turns with receiving).
    :param connection_verify: a PEM file of the certificate authorities to
        trust for the namespace's TLS (a private CA; default: the SDK's own).
    :param custom_endpoint_address: ``sb://host:port`` to connect to over
        AMQP/TLS instead of the namespace's host (a gateway, a test server).
    :param payload_format: ``bytes`` (as is), ``utf-8``, ``json`` or ``msgpack``.
    :param match: ``{"properties": {name: value}, "json": {"a.b": value}}``
        (application properties; every given condition must hold).
    :param conn_id: an Airflow-style ``azure_service_bus`` connection saying
        where to connect when none of ``connection_string``, ``namespace``
        and ``credential`` is given; read in the triggerer when the receiver
        is built, only the id is stored.

    The payload of each event is a dict: ``value`` (decoded body),
    ``message_id``, ``sequence_number``, ``properties``, ``session_id``,
    ``delivery_count`` (earlier deliveries), ``enqueued_time`` (ISO 8601),
    ``correlation_id``, ``subject`` and ``content_type``.
    """

    payload_formats: ClassVar[Mapping[str, PayloadFormat]] = PAYLOAD_FORMATS
    match_named_field = "properties"

    def __init__(
        self,
        *,
        connection_string: str | None = None,
        namespace: str | None = None,
        credential: dict[str, str] | None = None,
        queue: str | None = None,
        topic: str | None = None,
        subscription: str | None = None,
        sessions: bool = False,
        max_sessions: int = 8,
        max_messages: int = 100,
        max_wait_time: float = 5.0,
        max_in_flight: int = 1000,
        lock_duration: int = 60,
        max_lock_renewal: int = 3600,
        max_redeliveries: int = 5,
        settle_concurrency: int = 32,
        connection_verify: str | None = None,
        custom_endpoint_address: str | None = None,
        payload_format: str = "bytes",
        match: dict[str, Any] | None = None,
        conn_id: str | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.conn_id = conn_id
        self.connection_string = connection_string
        self.namespace, self.credential = namespace, credential
        self.queue, self.topic, self.subscription = queue, topic, subscription
        self.sessions = sessions
        self.max_sessions = max_sessions
        self.max_messages = max_messages
        self.max_wait_time = max_wait_time
        self.max_in_flight = max_in_flight
        self.lock_duration = lock_duration
        self.max_lock_renewal = max_lock_renewal
        self.max_redeliveries = max_redeliveries
        self.settle_concurrency = settle_concurrency
        self.connection_verify = connection_verify
        self.custom_endpoint_address = custom_endpoint_address
        # Refuse unusable settings where the trigger is declared; where to connect, when
        # left to the connection, is checked when the receiver is built.
        declared = self.consumer_kwargs()
        if conn_id is not None and not self._connects_inline():
            declared["namespace"] = _PLACEHOLDER_NAMESPACE
        self._settings_from(declared)

    def _connects_inline(self) -> bool:
        return any(getattr(self, name) is not None for name in _CONNECTION)

    def trigger_queue(self) -> None:
        """None: ``queue`` is the Service Bus queue here, not a trigger queue."""

    def consumer_kwargs(self) -> dict[str, Any]:
        """The receiver's constructor kwargs (all but ``payload_format`` and ``match``)."""
        names = (*_CONNECTION, *_ENTITY, *_CONSUMER_SETTINGS)
        kwargs = {name: getattr(self, name) for name in names}
        if self.conn_id is not None:
            kwargs["conn_id"] = self.conn_id
        return kwargs

    def settings(self) -> ServiceBusSettings:
        """The shared receiver's settings (validated), the connection's included if any.

        With a ``conn_id`` this reads the connection (raises
        ``ConnectionNotFound`` if it is missing): call it in the triggerer.
        """
        return self._settings_from(_resolved(self.consumer_kwargs()))

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> ServiceBusSettings:
        defaults = ServiceBusSettings()
        chosen: dict[str, Any] = {name: kwargs.get(name) for name in (*_CONNECTION, *_ENTITY)}
        chosen.update({name: kwargs.get(name, getattr(defaults, name))
                       for name in _CONSUMER_SETTINGS})
        settings = ServiceBusSettings(**chosen)
        settings.validate()
        return settings

    def shared_stream_name(self) -> str:
        """``servicebus orders`` (a queue) or ``servicebus orders/subscriptions/audit``.

        The entity only: never the namespace or the connection string.
        """
        if self.queue is not None:
            return f"servicebus {self.queue}"
        return f"servicebus {self.topic}/subscriptions/{self.subscription}"

    def shared_stream_key(self) -> Hashable:
        """The namespace, the entity and a fingerprint of every consumer setting.

        The connection string enters as a digest only. Triggers of one entity
        whose consumer settings differ get different keys, and the second
        receiver is refused when it opens.
        """
        if self.conn_id is not None:  # by id: the connection is never read here
            consumer = {name: getattr(self, name) for name in _CONSUMER_SETTINGS}
            inline = secret_digest({name: getattr(self, name) for name in _CONNECTION})
            entity = tuple(getattr(self, name) for name in _ENTITY)
            return ("servicebus", *entity, inline, fingerprint(consumer),
                    ("conn_id", self.conn_id))
        settings = self.settings()
        consumer = {name: getattr(settings, name) for name in _CONSUMER_SETTINGS}
        return ("servicebus", *settings.identity(), settings.connection_digest(),
                fingerprint(consumer))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet).

        A ``conn_id`` among them is resolved now, in the triggerer (see
        :func:`servicebus_settings_from_connection`); ``ConnectionNotFound``
        or ``InvalidConnection`` (broker configuration errors) if it cannot be.
        """
        return ServiceBusSharedStreamProducer(cls._settings_from(_resolved(kwargs)))

    # -- what a message holds --------------------------------------------------------------

    def message_body(self, message: ServiceBusMessage) -> bytes:
        """The message body."""
        return message.body

    def message_named_values(self, message: ServiceBusMessage) -> Mapping[str, Any]:
        """The application properties by name."""
        return message.properties

    def message_fields_native(self, message: ServiceBusMessage) -> bool:
        """Always: ids, counts, times and properties are text, bytes, numbers and bools."""
        return True

    def describe_message(self, message: ServiceBusMessage) -> str:
        """``sequence-number from entity``."""
        return f"{message.sequence_number} from {message.entity}"

    def to_payload(self, value: Any, message: ServiceBusMessage) -> dict[str, Any]:
        """The event payload for a matching message."""
        return {
            "value": value,
            "message_id": message.message_id,
            "sequence_number": message.sequence_number,
            "properties": dict(message.properties),
            "session_id": message.session_id,
            "delivery_count": message.delivery_count,
            "enqueued_time": message.enqueued_time,
            "correlation_id": message.correlation_id,
            "subject": message.subject,
            "content_type": message.content_type,
        }


def _resolved(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` completed by their connection, if they name one.

    Where to connect is all or nothing: the connection gives it only when
    the trigger gives none of ``connection_string``, ``namespace`` and
    ``credential`` (the connection is still read, so a missing one is an
    error either way).
    """
    resolved = resolve_inline(kwargs, servicebus_settings_from_connection)
    if any(kwargs.get(name) is not None for name in _CONNECTION):
        resolved.update({name: kwargs.get(name) for name in _CONNECTION})
    return resolved
