"""A confluent-kafka client config (an Airflow Kafka connection's extra), as aiokafka settings.

Airflow's Kafka provider keeps a consumer's whole configuration in the
connection's ``extra``: the dict confluent-kafka takes (``"bootstrap.servers"``,
``"group.id"``, ``"security.protocol"``, ...). Our producer reads with aiokafka,
whose settings have other names and, for a few features, no equivalent.
:func:`consumer_config` sorts every key into one of four kinds:

1. **honoured** - translated (:data:`HONOURED`, the connection and security
   keys below): the consumer behaves as confluent-kafka's would;
2. **refused, lossy** - ``enable.auto.commit`` true: the one setting that
   would commit records before their events are stored;
3. **refused, security** - any other ``ssl.*``, ``sasl.*`` or
   ``security.*`` key, or a mechanism or protocol aiokafka cannot speak:
   silently dropping one would connect with less protection than asked for
   (or not at all, for a reason nobody could see);
4. **ignored** - everything else (tuning, logging, callbacks): listed in
   :attr:`ConsumerConfig.ignored` for one warning.

A refusal is an :class:`~sharedstream.connections.InvalidConnection` (a
configuration error of the stream: its triggers are marked failed, other
streams run on) with one line naming the connection, where it was read and
the key. Nothing here connects or imports aiokafka; the SSL context is
built with the standard library.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sharedstream.connections import Connection, InvalidConnection

__all__ = ["HONOURED", "ConsumerConfig", "consumer_config"]

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r}")


HONOURED: Mapping[str, tuple[str, Callable[[Any], Any]]] = {
    "session.timeout.ms": ("session_timeout_ms", int),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", int),
    "max.poll.interval.ms": ("max_poll_interval_ms", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "fetch.wait.max.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "isolation.level": ("isolation_level", str),
    "check.crcs": ("check_crcs", _as_bool),
}
"""Consumer tuning keys with an aiokafka equivalent: confluent name -> (aiokafka name, type)."""

_OFFSET_RESET = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
                 "latest": "latest", "largest": "latest", "end": "latest", "error": "none"}
_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})
_SSL_FILES = {"ssl.ca.location": "cafile", "ssl.certificate.location": "certfile",
              "ssl.key.location": "keyfile", "ssl.key.password": "password"}
_CONNECTION_KEYS = frozenset({
    "bootstrap.servers", "group.id", "client.id", "auto.offset.reset", "enable.auto.commit",
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
    *_SSL_FILES,
})
_SECURITY_PREFIXES = ("ssl.", "sasl.", "security.", "enable.ssl.")


@dataclass(frozen=True)
class ConsumerConfig:
    """What a confluent-kafka config means for our consumer (see :func:`consumer_config`)."""

    bootstrap_servers: str
    group_id: str
    client_id: str | None = None
    security: Mapping[str, Any] = field(default_factory=dict)
    """aiokafka security kwargs (``security_protocol``, ``sasl_*``, ``ssl_context``)."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Further ``AIOKafkaConsumer`` kwargs (``auto_offset_reset``, timeouts, ...)."""
    ignored: tuple[str, ...] = ()
    """Keys accepted but without effect here, sorted (for one warning)."""


def consumer_config(connection: Connection) -> ConsumerConfig:
    """Translate the confluent-kafka config in ``connection``'s extra.

    Raises :class:`InvalidConnection` (one line, naming the connection and
    the key) for a missing ``bootstrap.servers`` or ``group.id``,
    ``enable.auto.commit`` true, a value of the wrong type, or a security
    setting that cannot be honoured. Pure, apart from reading the SSL files
    the config names.
    """
    extra = connection.extra_dejson

    def refuse(reason: str) -> InvalidConnection:
        return InvalidConnection(connection.conn_id, connection.source, reason)

    def text(key: str) -> str | None:
        value = extra.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise refuse(f"{key} must be text, got {value!r}")
        return value.strip()

    bootstrap = text("bootstrap.servers")
    if bootstrap is None:
        raise refuse("bootstrap.servers is required in the connection's extra (its config dict)")
    group_id = text("group.id")
    if group_id is None:
        raise refuse("group.id is required in the connection's extra: offsets are committed "
                      "for a consumer group")
    if "enable.auto.commit" in extra:
        try:
            auto_commit = _as_bool(extra["enable.auto.commit"])
        except ValueError as exc:
            raise refuse(f"enable.auto.commit: {exc}") from exc
        if auto_commit:
            raise refuse("enable.auto.commit=true is refused: it commits records before their "
                         "events are stored (data loss on a crash); must set "
                         "enable.auto.commit=false")
    overrides: dict[str, Any] = {}
    reset = text("auto.offset.reset")
    if reset is not None:
        if reset.lower() not in _OFFSET_RESET:
            raise refuse(f"auto.offset.reset must be one of {sorted(_OFFSET_RESET)}, "
                         f"got {reset!r}")
        overrides["auto_offset_reset"] = _OFFSET_RESET[reset.lower()]
    for key, (name, convert) in HONOURED.items():
        if key in extra:
            try:
                overrides[name] = convert(extra[key])
            except (TypeError, ValueError) as exc:
                raise refuse(f"{key}: {extra[key]!r} is not a valid {convert.__name__}") from exc
    security = _security(extra, text, refuse)
    unknown = set(extra) - _CONNECTION_KEYS - set(HONOURED)
    unsafe = sorted(key for key in unknown if key.startswith(_SECURITY_PREFIXES))
    if unsafe:
        raise refuse(f"{', '.join(unsafe)} cannot be honoured by sharedstream's Kafka client "
                     "(aiokafka); remove them or use a setting it supports (see docs/airflow.md)")
    return ConsumerConfig(
        bootstrap_servers=bootstrap, group_id=group_id, client_id=text("client.id"),
        security=security, overrides=overrides, ignored=tuple(sorted(unknown)),
    )


def _security(
    extra: Mapping[str, Any], text: Callable[[str], str | None],
    refuse: Callable[[str], InvalidConnection],
) -> dict[str, Any]:
    """The aiokafka security kwargs of ``extra`` (protocol, SASL, an SSL context)."""
    protocol = (text("security.protocol") or "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise refuse(f"security.protocol must be one of {sorted(_PROTOCOLS)}, got {protocol!r}")
    security: dict[str, Any] = {"security_protocol": protocol}
    if protocol.startswith("SASL_"):
        mechanism = (text("sasl.mechanism") or text("sasl.mechanisms") or "PLAIN").upper()
        if mechanism not in _MECHANISMS:
            raise refuse(f"sasl.mechanism {mechanism!r} is not supported by sharedstream's "
                         f"Kafka client (aiokafka); use one of {sorted(_MECHANISMS)}")
        username, password = text("sasl.username"), text("sasl.password")
        if username is None or password is None:
            raise refuse(f"security.protocol {protocol} with {mechanism} needs sasl.username "
                         "and sasl.password")
        security.update(sasl_mechanism=mechanism, sasl_plain_username=username,
                        sasl_plain_password=password)
    if protocol.endswith("SSL"):
        security["ssl_context"] = _ssl_context(extra, text, refuse)
    elif any(key in extra for key in _SSL_FILES):
        raise refuse(f"ssl.* files are set but security.protocol is {protocol}: "
                     "set SSL or SASL_SSL")
    return security


def _ssl_context(
    extra: Mapping[str, Any], text: Callable[[str], str | None],
    refuse: Callable[[str], InvalidConnection],
) -> ssl.SSLContext:
    files = {name: text(key) for key, name in _SSL_FILES.items()}
    try:
        context = ssl.create_default_context(cafile=files["cafile"])
        if files["certfile"] is not None:
            context.load_cert_chain(files["certfile"], files["keyfile"], files["password"])
    except (OSError, ssl.SSLError) as exc:
        raise refuse(f"cannot load the SSL files it names: {exc}") from exc
    algorithm = (text("ssl.endpoint.identification.algorithm") or "https").lower()
    if algorithm not in {"https", "none"}:
        raise refuse("ssl.endpoint.identification.algorithm must be https or none, "
                     f"got {algorithm!r}")
    verify = extra.get("enable.ssl.certificate.verification", True)
    try:
        verify_peer = _as_bool(verify)
    except ValueError as exc:
        raise refuse(f"enable.ssl.certificate.verification: {exc}") from exc
    context.check_hostname = verify_peer and algorithm == "https"
    if not verify_peer:
        context.verify_mode = ssl.CERT_NONE
    return context
