"""Amazon SQS asset watchers: many triggers, one receiving client per queue.

:class:`SqsSharedStreamTrigger` runs in ack mode on
:class:`~sharedstream.producers.sqs.SqsSharedStreamProducer`: every trigger
of a queue with the same consumer settings shares one receiver, and a
message is deleted only once every trigger is done with it and the events
it fired are stored.

A trigger decodes each message body (``payload_format``), applies its
declarative ``match`` and fires one event per matching message::

    SqsSharedStreamTrigger(
        queue="https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
        region_name="eu-west-1", payload_format="json", dead_letter_queue="orders-dlq",
        match={"attributes": {"source": "web"}, "json": {"order.country": "NL"}},
    )

A body that does not decode is *rejected*: dead-lettered (or deleted with a
warning when no ``dead_letter_queue`` is set), never redelivered.

For logic a dict cannot express, subclass and override :meth:`matches`
(called with the decoded body and the raw
:class:`~sharedstream.producers.sqs.SqsMessage`) or
:meth:`filter_shared_stream`; the subclass keeps the shared-stream key, so
it shares the receiver with plain watchers of the queue.

Decoding, matching, the prefilter, the filter and vouching for payloads come
from :class:`~sharedstream.brokerkit.trigger.BrokerTrigger`; this module says
where an SQS message keeps its body and attributes, what an event's payload
is, and which settings make the shared receiver.

With ``conn_id="aws_default"`` the settings not given inline come from that
Airflow-style ``aws`` connection (see :mod:`sharedstream.connections`),
read in the triggerer when the producer is built:
:func:`sqs_settings_from_connection` maps it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from sharedstream.brokerkit.codecs import AS_HELD, BYTES, DECODERS, JSON, PayloadFormat
from sharedstream.brokerkit.fingerprints import secret_digest
from sharedstream.brokerkit.trigger import BrokerTrigger
from sharedstream.connections import Connection
from sharedstream.connections.settings import ConnectionReader, resolve_inline
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.sqs import (
    SqsConfigError,
    SqsMessage,
    SqsSettings,
    SqsSharedStreamProducer,
    queue_name,
)

__all__ = ["PAYLOAD_FORMATS", "SqsSharedStreamTrigger", "sqs_settings_from_connection"]

DEFAULT_REGION = "us-east-1"
"""The region when neither the trigger nor its connection names one."""

_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_IDENTITY = ("role_arn", "assume_role_method", "assume_role_kwargs",
             "assume_role_with_web_identity_federation",
             "assume_role_with_web_identity_token_file", "profile_name", "session_kwargs",
             "aws_iam_role", "external_id")  # they choose who the client is: refused
_AWS_SUPPORTED = ("region_name", "endpoint_url", "service_config", "verify", "config_kwargs",
                  "botocore_config", *_CREDENTIAL_KEYS)


def sqs_settings_from_connection(conn: Connection) -> dict[str, Any]:
    """The SQS trigger settings an Airflow ``aws`` connection gives (``docs/connections.md``).

    As in Airflow's Amazon provider: ``login`` is the access key id and
    ``password`` the secret key (or extra ``aws_access_key_id`` /
    ``aws_secret_access_key``), extra ``aws_session_token``,
    ``region_name``, ``endpoint_url`` (or ``service_config.sqs.endpoint_url``),
    ``verify`` and ``config_kwargs`` / ``botocore_config`` (botocore
    ``Config`` options). Assuming a role or naming a profile is refused:
    the trigger uses the keys given, or botocore's default chain. Other
    extras are ignored, with one warning.
    """
    read = ConnectionReader(conn, broker="the SQS trigger", conn_types=("aws",))
    read.refuse(_IDENTITY, "give keys, or none for botocore's default chain")
    read.refuse(("host",), "give extra endpoint_url")
    in_extra = {name: read.text(name) for name in _CREDENTIAL_KEYS}  # Airflow's older place
    given = {"aws_access_key_id": read.field("login"),
             "aws_secret_access_key": read.field("password"),
             "aws_session_token": None}
    credentials = {name: given[name] or in_extra[name] for name in _CREDENTIAL_KEYS
                   if (given[name] or in_extra[name]) is not None}
    found: dict[str, Any] = {"credentials": credentials, "region_name": read.text("region_name")}
    service = read.take("service_config") or {}
    endpoint = service.get("sqs", {}).get("endpoint_url") if isinstance(service, dict) else None
    found["endpoint_url"] = read.text("endpoint_url") or endpoint
    verify = read.take("verify")
    if verify is not None:
        if not isinstance(verify, bool | str):
            raise read.error("extra verify must be true, false or a CA bundle path", key="verify")
        found["verify"] = verify
    client_config = read.take("config_kwargs", "botocore_config")
    if client_config is not None:
        if not isinstance(client_config, dict):
            raise read.error("extra config_kwargs must be an object of botocore Config options",
                             key="config_kwargs")
        found["client_config"] = client_config
    read.finish(_AWS_SUPPORTED, refuse=lambda _: False)
    return found

_CONSUMER_SETTINGS = ("region_name", "endpoint_url", "wait_time_seconds", "max_messages",
                      "receive_concurrency", "visibility_timeout", "failure_visibility",
                      "dead_letter_queue", "max_redeliveries", "max_in_flight")


def _unpack_base64_msgpack(body: bytes) -> Any:
    try:
        packed = base64.b64decode(body, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from exc
    return DECODERS["msgpack"](packed)


PAYLOAD_FORMATS: Mapping[str, PayloadFormat] = {
    "text": AS_HELD,
    "bytes": BYTES,
    "json": JSON,
    # Not native: msgpack values may hold ext types.
    "msgpack": PayloadFormat(_unpack_base64_msgpack, native=False, document=True),
}
"""``payload_format`` -> how a message body is decoded (``text``: as is)."""


class SqsSharedStreamTrigger(BrokerTrigger):
    """Fire for each message of ``queue`` whose decoded body matches ``match``.

    :param queue: the queue URL, or its name (looked up with ``GetQueueUrl``).
        A queue named by URL and by name is the same queue: such triggers
        share one receiver.
    :param region_name: AWS region (``us-east-1`` unless given, or given
        by the connection). :param endpoint_url: for emulators or VPC
        endpoints. :param credentials: ``aws_access_key_id`` /
        ``aws_secret_access_key`` / ``aws_session_token`` (``None``: botocore's
        usual chain); only a digest enters the shared-stream key.
    :param conn_id: an Airflow-style ``aws`` connection supplying the
        settings not given inline (keys, region, endpoint...), resolved in
        the triggerer when the receiver is built; only the id is stored.
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
    :param payload_format: ``text`` (as is), ``bytes`` (UTF-8 encoded),
        ``json``, or ``msgpack`` (base64 text, as SQS bodies are text).
    :param match: ``{"attributes": {name: value}, "json": {"a.b": value}}``;
        every given condition must hold. ``json`` paths need ``json`` or
        ``msgpack`` bodies.

    The payload of each event is a dict: ``value`` (decoded body),
    ``message_id``, ``attributes`` (message attributes), ``receive_count``,
    ``group_id`` (FIFO queues, else ``None``) and ``sent_timestamp`` (ms).
    """

    payload_formats: ClassVar[Mapping[str, PayloadFormat]] = PAYLOAD_FORMATS
    queue: str  # the queue URL or name (not a trigger queue: see trigger_queue)
    match_named_field = "attributes"

    def __init__(
        self,
        *,
        queue: str,
        region_name: str | None = None,
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
        payload_format: str = "text",
        match: dict[str, Any] | None = None,
        conn_id: str | None = None,
    ) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.conn_id = conn_id
        self.queue = queue
        self.credentials = dict(credentials or {})
        # Without a connection the default is stored, as before; with one, None lets it choose.
        self.region_name = region_name if region_name or conn_id else DEFAULT_REGION
        self.endpoint_url = endpoint_url
        self.wait_time_seconds = wait_time_seconds
        self.max_messages = max_messages
        self.receive_concurrency = receive_concurrency
        self.visibility_timeout = visibility_timeout
        self.failure_visibility = failure_visibility
        self.dead_letter_queue = dead_letter_queue
        self.max_redeliveries = max_redeliveries
        self.max_in_flight = max_in_flight
        # Refuse unusable settings where the trigger is declared (the inline ones only,
        # with a connection: it is read in the triggerer).
        self._settings_from(self.consumer_kwargs())

    def trigger_queue(self) -> None:
        """None: ``queue`` is the SQS queue URL or name here, not a trigger queue."""

    def consumer_kwargs(self) -> dict[str, Any]:
        """The receiver's constructor kwargs (all but ``payload_format`` and ``match``)."""
        kwargs: dict[str, Any] = {"queue": self.queue, "credentials": self.credentials}
        kwargs.update({name: getattr(self, name) for name in _CONSUMER_SETTINGS})
        if self.conn_id is not None:
            kwargs["conn_id"] = self.conn_id
        return kwargs

    def settings(self) -> SqsSettings:
        """The shared receiver's settings (validated), the connection's included if any.

        With a ``conn_id`` this reads the connection (raises
        ``ConnectionNotFound`` if it is missing): call it in the triggerer.
        """
        return self._settings_from(_resolved(self.consumer_kwargs()))

    @staticmethod
    def _settings_from(kwargs: Mapping[str, Any]) -> SqsSettings:
        if "queue" not in kwargs:
            raise SqsConfigError("missing SQS trigger setting 'queue'")
        defaults = SqsSettings(queue=kwargs["queue"])
        chosen = {name: kwargs.get(name, getattr(defaults, name)) for name in _CONSUMER_SETTINGS}
        chosen["region_name"] = chosen["region_name"] or DEFAULT_REGION
        from_connection = {name: kwargs[name] for name in ("verify", "client_config")
                           if name in kwargs}
        settings = SqsSettings(
            queue=kwargs["queue"],
            credentials=dict(kwargs.get("credentials") or {}),
            **chosen, **from_connection,
        )
        settings.validate()
        return settings

    def shared_stream_name(self) -> str:
        """``sqs orders-queue``: the queue's name (of a URL, its last segment), nothing else."""
        return f"sqs {queue_name(self.queue)}"

    def shared_stream_key(self) -> Hashable:
        """The queue and every consumer setting; not the per-trigger decoding or matching.

        The queue enters by name, so a URL and a name of one queue agree.
        Credentials enter as a digest, never in clear. Triggers of one queue
        whose consumer settings differ get different keys, and the second
        receiver is refused when it opens (see the producer module).
        """
        rest = tuple(getattr(self, name) for name in _CONSUMER_SETTINGS[2:])
        if self.conn_id is not None:  # by id: the connection is never read here
            return ("sqs", self.region_name, self.endpoint_url, queue_name(self.queue),
                    secret_digest(self.credentials), *rest, ("conn_id", self.conn_id))
        settings = self.settings()
        return ("sqs", *settings.identity(), settings.credentials_digest(), *rest)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from the first subscriber's kwargs (no connection yet).

        A ``conn_id`` among them is resolved now, in the triggerer (see
        :func:`sqs_settings_from_connection`); ``ConnectionNotFound`` or
        ``InvalidConnection`` (broker configuration errors) if it cannot be.
        """
        return SqsSharedStreamProducer(cls._settings_from(_resolved(kwargs)))

    # -- what a message holds --------------------------------------------------------------

    def message_body(self, message: SqsMessage) -> str:
        """The message's body text."""
        return message.body

    def message_named_values(self, message: SqsMessage) -> Mapping[str, str | bytes]:
        """The message attributes by name (``String``/``Number`` as text, ``Binary`` as bytes)."""
        return message.attributes

    def message_fields_native(self, message: SqsMessage) -> bool:
        """Always: ids, counts and attributes are text, bytes and ints."""
        return True

    def describe_message(self, message: SqsMessage) -> str:
        """``message-id from queue-name``."""
        return f"{message.message_id} from {queue_name(message.queue)}"

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


def _resolved(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` completed by their connection, if they name one (inline settings win)."""
    return resolve_inline(kwargs, sqs_settings_from_connection, mappings=("credentials",))
