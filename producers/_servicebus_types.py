"""The Service Bus module's types: errors, settings, the message filters receive.

azure-servicebus's errors are mapped onto this module's errors here
(:func:`sdk_error`, :func:`transient`). The SDK's received message is read
into the :class:`ServiceBusMessage` filters get by
:mod:`sharedstream.producers._servicebus_received`.

Everything public here is re-exported by
:mod:`sharedstream.producers.servicebus`; import it from there. Nothing here
imports azure-servicebus: the SDK's modules are passed in by the caller.
"""

from __future__ import annotations

import importlib
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from sharedstream.brokerkit.codecs import DecodeCache
from sharedstream.brokerkit.deadletters import (
    ANNOTATION_DETAIL,
    ANNOTATION_TRIGGERS,
    dead_letter_annotations,
)
from sharedstream.brokerkit.errors import BrokerConfigError, BrokerError, BrokerRequestError
from sharedstream.brokerkit.fingerprints import fingerprint, secret_digest
from sharedstream.brokerkit.retry import RetryPolicy
from sharedstream.brokerkit.settings import check_settings
from sharedstream.engine.producer import Verdict

__all__ = [
    "ServiceBusConfigError",
    "ServiceBusMessage",
    "ServiceBusPayload",
    "ServiceBusProducerError",
    "ServiceBusRequestError",
    "ServiceBusSettings",
    "credential_of",
    "dead_letter_details",
    "first_line",
    "namespace_credential",
    "namespace_of",
    "open_client",
    "receiver_options",
    "sdk_error",
    "transient",
]

_MAX_DETAIL = 1024
"""Characters kept of a dead-letter reason or description."""


class ServiceBusProducerError(BrokerError):
    """Base class of the errors the Service Bus producer raises."""


class ServiceBusConfigError(ServiceBusProducerError, BrokerConfigError):
    """The settings are unusable: a bad option, no such entity, no permission."""


class ServiceBusRequestError(ServiceBusProducerError, BrokerRequestError):
    """A Service Bus call failed after the SDK's retries and ours; the poll ends and restarts."""


_TRANSIENT = ("ServiceBusConnectionError", "ServiceBusCommunicationError", "OperationTimeoutError",
              "ServiceBusServerBusyError", "SessionCannotBeLockedError",
              "MessagingEntityDisabledError")
_REFUSED = ("ServiceBusAuthenticationError", "ServiceBusAuthorizationError")


def transient(exc: BaseException) -> bool:
    """Whether retrying the call that raised the SDK's ``exc`` can help."""
    return any(kind.__name__ in _TRANSIENT for kind in type(exc).__mro__)


def sdk_error(what: str, exc: BaseException) -> ServiceBusProducerError:
    """What the SDK's ``exc`` means: this module's error, to raise ``from exc``.

    A missing entity and a refused token are configuration errors
    (retrying cannot help: the poll ends with one line); a token refused
    with 404 (Service Bus's answer to a ``put-token`` for an entity that
    does not exist) is a missing entity. Anything else is a request error.
    """
    names = {kind.__name__ for kind in type(exc).__mro__}
    if "MessagingEntityNotFoundError" in names:
        return ServiceBusConfigError(f"{what}: not found ({first_line(exc)})")
    if names.intersection(_REFUSED):
        status, reason = _refusal(exc)
        # Service Bus answers the put-token for a missing entity with 404: the
        # SDK raises that as an authentication error, but the entity is missing.
        verdict = "not found" if status == _ENTITY_NOT_FOUND else "not authorized"
        return ServiceBusConfigError(f"{what}: {verdict} ({reason})")
    return ServiceBusRequestError(f"{what} failed: {first_line(exc)}")


_ENTITY_NOT_FOUND = 404
"""The ``put-token`` status of an audience naming no entity of the namespace."""


def _refusal(exc: BaseException) -> tuple[int | None, str]:
    """Why the service refused a token: the CBS status the SDK keeps on its AMQP error, and text.

    The SDK's own message for a refused ``put-token`` is only "Error
    condition: amqp:client-error"; the status and its description (an
    invalid signature, an expired token, a missing entity) are on its
    inner exception. The status is ``None`` when it has none.
    """
    cause = getattr(exc, "inner_exception", None)
    status, description = (getattr(cause, "status_code", None),
                           getattr(cause, "status_description", None))
    if status is None or description is None:
        return None, first_line(exc)
    text = description.decode(errors="replace") if isinstance(description, bytes) \
        else str(description)
    return (status if isinstance(status, int) else None,
            f"status {status}: {text.splitlines()[0][:300] if text else 'no description'}")


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message (its type's name when it has none), cut at ``limit``."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:limit]


def namespace_of(connection_string: str) -> str:
    """The namespace host (``Endpoint=sb://<host>/``) of a connection string.

    Raises :class:`ServiceBusConfigError` when there is none; never shows the
    string (it holds a key).
    """
    for part in connection_string.split(";"):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "endpoint" and value:
            host = value.strip().split("://", 1)[-1].rstrip("/")
            if host:
                return host.lower()
    raise ServiceBusConfigError("connection_string has no Endpoint=sb://<namespace>/ part")


@dataclass(frozen=True)
class ServiceBusSettings:
    """Everything the shared receiver needs; built from a trigger's kwargs."""

    connection_string: str | None = None
    """``Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...`` (a secret:
    only its namespace and a digest are ever shown or put in a key); or:"""
    namespace: str | None = None
    """The fully qualified namespace (``orders.servicebus.windows.net``), with ``credential``."""
    credential: Mapping[str, str] | None = None
    """With ``namespace``: ``{"shared_access_key_name": ..., "shared_access_key": ...}``,
    ``{"sas_token": ...}``, or ``None`` for Microsoft Entra ID through azure-identity's
    ``DefaultAzureCredential`` (managed identity, workload identity, the Azure CLI...)."""
    queue: str | None = None
    topic: str | None = None
    subscription: str | None = None
    """A queue, or a topic and one of its subscriptions."""
    sessions: bool = False
    """Whether the entity requires sessions (then each session is a lane, in order)."""
    max_sessions: int = 8
    """Sessions received at once (``sessions`` only), each by a receiver of its own."""
    max_messages: int = 100
    """Messages asked for per receive call."""
    max_wait_time: float = 5.0
    """Seconds a receive call waits for its first message."""
    max_in_flight: int = 1000
    """Messages received and not yet advanced before receiving pauses."""
    lock_duration: int = 60
    """Seconds of the entity's message lock (its ``LockDuration``; renewal is planned on it,
    and on a shorter lock when the messages show one)."""
    max_lock_renewal: int = 3600
    """Seconds after receipt past which a lock is no longer renewed."""
    max_redeliveries: int = 5
    settle_concurrency: int = 32
    """Abandons and dead-letterings in flight at once (completions go one at a time in turns
    of the link, lock renewals many to a request: see the producer)."""
    retries: int = 3
    retry_backoff: float = 0.2
    connection_verify: str | None = None
    """A PEM file of the certificate authorities to trust for the namespace's TLS (the SDK's
    ``connection_verify``); ``None``: the SDK's own bundle (certifi's). A connection string
    with ``UseDevelopmentEmulator=true`` is plain AMQP: nothing to verify."""
    custom_endpoint_address: str | None = None
    """``sb://host:port`` to connect to (AMQP over TLS) instead of the namespace's host on
    5671, e.g. a gateway or a test server; the namespace still names what tokens are for."""

    @property
    def entity_path(self) -> str:
        """``queue``, or ``topic/Subscriptions/subscription``."""
        if self.queue is not None:
            return self.queue
        return f"{self.topic}/Subscriptions/{self.subscription}"

    @property
    def namespace_host(self) -> str:
        """The namespace host: of the connection string, or ``namespace``."""
        if self.connection_string is not None:
            return namespace_of(self.connection_string)
        return str(self.namespace).strip().lower().split("://", 1)[-1].rstrip("/")

    def validate(self) -> None:
        """Raise :class:`ServiceBusConfigError` for settings that cannot work."""
        where = f"entity {self.entity_path!r}"
        check_settings(
            self, error=ServiceBusConfigError, where=where,
            ints=("max_sessions", "max_messages", "max_in_flight", "lock_duration",
                  "max_lock_renewal",
                  "max_redeliveries", "settle_concurrency", "retries"),
            texts=("connection_string", "namespace", "queue", "topic", "subscription",
                   "connection_verify", "custom_endpoint_address"),
            numbers=("max_wait_time", "retry_backoff"),
            rules=lambda: [
                ((self.connection_string is None) != (self.namespace is None),
                 "give either connection_string or namespace (with credential), not both"),
                (self.connection_string is None or bool(self.connection_string),
                 "connection_string is empty"),
                (self.credential is None or self.namespace is not None,
                 "credential goes with namespace (a connection string holds its own key)"),
                (self.credential is None or _credential_kind(self.credential) is not None,
                 "credential must be {'shared_access_key_name': ..., 'shared_access_key': ...} "
                 "or {'sas_token': ...} (or None: DefaultAzureCredential)"),
                ((self.queue is None) != (self.topic is None),
                 "give either queue or topic (with subscription), not both"),
                ((self.topic is None) == (self.subscription is None),
                 "topic and subscription go together"),
                (all(name is None or (name and "/" not in name.strip("/")) for name in
                     (self.queue, self.topic, self.subscription)),
                 "queue, topic and subscription are names, without '/'"),
                (type(self.sessions) is bool, "sessions must be True or False"),
                (1 <= self.max_sessions <= 256, "max_sessions must be within 1..256"),
                (1 <= self.max_messages <= 5000, "max_messages must be within 1..5000"),
                (0 < self.max_wait_time <= 300, "max_wait_time must be within (0, 300] s"),
                (self.max_in_flight >= self.max_messages,
                 "max_in_flight must be at least max_messages"),
                (5 <= self.lock_duration <= 300, "lock_duration must be within 5..300"),
                (self.max_lock_renewal >= self.lock_duration,
                 "max_lock_renewal must be at least lock_duration"),
                (self.max_redeliveries >= 0, "max_redeliveries must be >= 0"),
                (self.settle_concurrency >= 1, "settle_concurrency must be >= 1"),
                (self.retries >= 0 and self.retry_backoff >= 0,
                 "retries and retry_backoff must be >= 0"),
            ])
        self.namespace_host  # noqa: B018 - raises when the connection string names none

    def identity(self) -> tuple[str, str]:
        """Which entity this is: the namespace host and the entity path (case-insensitive)."""
        return (self.namespace_host, self.entity_path.lower())

    def connection_digest(self) -> str:
        """A short digest of the connection string, safe to log and to put in a key."""
        return secret_digest({"connection_string": self.connection_string or "",
                              **dict(self.credential or {})})

    def fingerprint(self) -> str:
        """A digest of every setting (the connection string included, never shown)."""
        return fingerprint(asdict(self))

    def retry_policy(self) -> RetryPolicy:
        """``retries`` and ``retry_backoff`` as the kit's policy."""
        return RetryPolicy(self.retries, self.retry_backoff)


def _credential_kind(credential: Mapping[str, str]) -> str | None:
    """``"named_key"``, ``"sas"``, or ``None`` when ``credential`` is neither shape."""
    if not isinstance(credential, Mapping) or not all(
            type(value) is str and value for value in credential.values()):
        return None
    keys = set(credential)
    if keys == {"shared_access_key_name", "shared_access_key"}:
        return "named_key"
    if keys == {"sas_token"}:
        return "sas"
    return None


def credential_of(settings: ServiceBusSettings, core_credentials: Any) -> Any:
    """The SDK credential for ``settings.namespace``, or ``None`` for DefaultAzureCredential.

    ``core_credentials`` is ``azure.core.credentials``.
    """
    credential = settings.credential
    if credential is None:
        return None
    if _credential_kind(credential) == "sas":
        return core_credentials.AzureSasCredential(credential["sas_token"])
    return core_credentials.AzureNamedKeyCredential(credential["shared_access_key_name"],
                                                    credential["shared_access_key"])


def namespace_credential(settings: ServiceBusSettings, core_credentials: Any) -> tuple[Any, Any]:
    """The credential for ``settings.namespace``, and the Entra ID one to close (or ``None``).

    The given key or SAS token (:func:`credential_of`), or else azure-identity's
    ``DefaultAzureCredential`` (returned twice: the caller closes it).
    Raises :class:`ServiceBusConfigError` when Entra ID is needed but
    azure-identity is not installed.
    """
    credential = credential_of(settings, core_credentials)
    if credential is not None:
        return credential, None
    try:
        identity_aio = importlib.import_module("azure.identity.aio")
    except ImportError:
        raise ServiceBusConfigError(
            f"namespace {settings.namespace!r} without a credential signs in with "
            "Microsoft Entra ID, which needs azure-identity: pip install "
            "azure-identity (or give a credential)") from None
    identity = identity_aio.DefaultAzureCredential()
    return identity, identity


Property = str | bytes | int | float | bool | None


def open_client(settings: ServiceBusSettings, aio: Any, core_credentials: Any) -> tuple[Any, Any]:
    """The SDK's ``ServiceBusClient`` for ``settings`` (no I/O yet), and a credential to close.

    From the connection string; or for ``namespace`` with the given key or
    SAS token, or else Microsoft Entra ID (azure-identity's
    ``DefaultAzureCredential``, returned second: the caller closes it with
    the client; ``None`` otherwise). ``aio`` is ``azure.servicebus.aio`` and
    ``core_credentials`` ``azure.core.credentials``. Raises
    :class:`ServiceBusConfigError` for a connection string the SDK refuses
    (never showing the string) and when Entra ID is needed but
    azure-identity is not installed.
    """
    s = settings
    retry = {"retry_total": s.retries, "retry_backoff_factor": s.retry_backoff,
             **_tls_options(s)}
    if s.connection_string is None:
        credential, identity = namespace_credential(s, core_credentials)
        client = aio.ServiceBusClient(fully_qualified_namespace=s.namespace_host,
                                      credential=credential, **retry)
        return client, identity
    try:
        return aio.ServiceBusClient.from_connection_string(s.connection_string, **retry), None
    except ValueError as exc:  # the SDK's own check of the string; never show the string
        raise ServiceBusConfigError(
            f"connection_string for {s.entity_path!r} is not usable: "
            f"{first_line(exc, 200)}") from None


def _tls_options(settings: ServiceBusSettings) -> dict[str, Any]:
    """The client's keyword arguments for ``connection_verify`` and ``custom_endpoint_address``.

    A custom endpoint keeps AMQP over TLS (the SDK would switch to WebSockets,
    which the producer does not use). Raises :class:`ServiceBusConfigError`
    when ``connection_verify`` is not a readable file.
    """
    options: dict[str, Any] = {}
    if settings.connection_verify is not None:
        try:
            Path(settings.connection_verify).read_bytes()
        except OSError as exc:
            raise ServiceBusConfigError(
                f"connection_verify {settings.connection_verify!r} cannot be read: "
                f"{exc.strerror or exc}") from exc
        options["connection_verify"] = settings.connection_verify
    if settings.custom_endpoint_address is not None:
        options["custom_endpoint_address"] = settings.custom_endpoint_address
        options["transport_type"] = importlib.import_module("azure.servicebus").TransportType.Amqp
    return options


def receiver_options(settings: ServiceBusSettings, servicebus: Any, *,
                     session: bool) -> dict[str, Any]:
    """The keyword arguments of a peek-lock receiver (``servicebus``: ``azure.servicebus``).

    No prefetch (the producer's ``max_in_flight`` is the read-ahead) and no
    keep-alive pings: the receive loop is never idle for longer than
    ``max_wait_time`` (each receive call is link traffic), and the pinging
    task makes closing wait for it. With ``session``, the next free session.
    """
    kwargs: dict[str, Any] = {"receive_mode": servicebus.ServiceBusReceiveMode.PEEK_LOCK,
                              "prefetch_count": 0, "keep_alive": None}
    if session:
        kwargs.update(session_id=servicebus.NEXT_AVAILABLE_SESSION,
                      max_wait_time=settings.max_wait_time)
    return kwargs


class ServiceBusMessage(DecodeCache):
    """The raw event every filter of a Service Bus shared stream receives (read-only, shared).

    ``body`` is the message body as bytes (a data body joined; a value body
    that is text or binary as is, any other value, and a sequence body's
    items, as JSON: see :mod:`~sharedstream.producers._servicebus_received`); ``properties``
    its application properties with text keys (text values as ``str``,
    binary ones as ``bytes``, times as ISO 8601 text, ids as text);
    ``delivery_count`` counts the earlier deliveries (0 on the first);
    ``enqueued_time`` is ISO 8601 UTC (or ``None``); ``session_id``,
    ``correlation_id``, ``subject`` and ``content_type`` are ``None`` when
    not set.
    """

    __slots__ = ("body", "content_type", "correlation_id", "delivery_count", "enqueued_time",
                 "entity", "message_id", "properties", "sequence_number", "session_id",
                 "subject")

    def __init__(self, entity: str, *, sequence_number: int, body: bytes,
                 message_id: str | None = None, properties: Mapping[str, Property] | None = None,
                 delivery_count: int = 0, session_id: str | None = None,
                 enqueued_time: str | None = None, correlation_id: str | None = None,
                 subject: str | None = None, content_type: str | None = None) -> None:
        super().__init__()
        self.entity = entity
        self.sequence_number = sequence_number
        self.body = body
        self.message_id = message_id
        self.properties: dict[str, Property] = dict(properties or {})
        self.delivery_count = delivery_count
        self.session_id = session_id
        self.enqueued_time = enqueued_time
        self.correlation_id = correlation_id
        self.subject = subject
        self.content_type = content_type

    def raw_bytes(self) -> bytes:
        """The body: what :meth:`decoded` decodes."""
        return self.body

    def __repr__(self) -> str:
        return (f"ServiceBusMessage({self.entity!r}, {self.sequence_number}, "
                f"body={self.body[:40]!r})")


class ServiceBusPayload(NamedTuple):
    """The broker payload: the message's lane, the filters' message, the SDK's message."""

    lane: tuple[str, Hashable]
    """``("session", session id)`` or ``("message", sequence number)``."""
    message: ServiceBusMessage
    received: Any
    """The SDK's ``ServiceBusReceivedMessage``: settled through the receiver it came from."""
    receiver: Any

    @property
    def key(self) -> str:
        """Its lock token (the lease keeper's key)."""
        return str(self.received.lock_token)


def dead_letter_details(reason: str, verdicts: Sequence[Verdict],
                        detail: str = "") -> tuple[str, str]:
    """``(reason, description)`` of a dead-lettered message, within Service Bus's limits.

    The reason is ``sharedstream.rejected`` or ``sharedstream.max_redeliveries``;
    the description names the triggers and what they said, then ``detail``
    (what the producer itself found: ``"undecodable body: ..."``).
    """
    found = dead_letter_annotations(reason, verdicts)
    said = "; ".join(part for part in (
        f"triggers {found[ANNOTATION_TRIGGERS]}" if ANNOTATION_TRIGGERS in found else "",
        found.get(ANNOTATION_DETAIL, ""), detail) if part)
    return f"sharedstream.{reason}"[:_MAX_DETAIL], (said or reason)[:_MAX_DETAIL]
