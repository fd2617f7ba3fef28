"""An Airflow AWS connection, as the SQS producer's client settings.

Airflow's Amazon provider reads credentials and client options from the
connection ``aws_conn_id``: ``login`` is the access key id, ``password``
the secret access key, and ``extra`` may hold ``aws_session_token``,
``region_name``, ``endpoint_url`` (or, per service,
``service_config: {"sqs": {"endpoint_url": ...}}``), ``verify`` and
``config_kwargs`` (botocore ``Config`` options). :func:`client_settings`
turns one into :class:`ClientSettings`, with the provider's precedence: a
trigger's own ``region_name``, ``verify`` and ``botocore_config`` win over
the connection's.

Without a connection - ``aws_conn_id=None``, or the default id
``aws_default`` not defined anywhere - botocore's usual chain applies
(environment variables, shared files, instance role), as in the provider;
for the latter one warning says so. Any other id that is not defined is an
error (a typo there would otherwise run with the wrong identity).

Extras that would change *who* the client is and that we cannot honour
(``role_arn``, ``assume_role_method``, ``profile_name``, ...) are refused
with :class:`~sharedstream.connections.InvalidConnection` (a configuration
error of the stream: its triggers are marked failed, other streams run on);
other extras are ignored, named in :attr:`ClientSettings.ignored` for one
warning. Nothing here connects or imports the SDK.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sharedstream.connections import (
    Connection,
    ConnectionNotFound,
    InvalidConnection,
    get_connection,
)

__all__ = ["DEFAULT_CONN_ID", "ClientSettings", "client_settings"]

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = "aws_default"
"""The one connection id whose absence means botocore's default chain (as in Airflow)."""

_HONOURED = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                       "region_name", "endpoint_url", "service_config", "verify",
                       "config_kwargs"})
_IDENTITY = frozenset({"role_arn", "assume_role_method", "assume_role_kwargs",
                       "assume_role_with_web_identity_federation", "profile_name",
                       "session_kwargs", "aws_iam_role", "external_id",
                       "assume_role_with_web_identity_token_file"})
_REGION_IN_URL = re.compile(r"^https?://sqs[.-]([a-z0-9-]+)\.amazonaws\.com", re.IGNORECASE)
_FALLBACK_REGION = "us-east-1"


@dataclass(frozen=True)
class ClientSettings:
    """What the SQS client is built with (see :func:`client_settings`)."""

    region_name: str
    endpoint_url: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)
    """Empty: botocore's default chain."""
    verify: bool | str | None = None
    client_config: Mapping[str, Any] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()


def client_settings(
    *,
    aws_conn_id: str | None,
    sqs_queue: str,
    region_name: str | None = None,
    verify: bool | str | None = None,
    botocore_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientSettings:
    """The client settings for ``sqs_queue``: the connection's, the trigger's arguments over them.

    Raises :class:`ConnectionNotFound` for a connection that is not defined
    (other than ``aws_default``) and :class:`InvalidConnection` (one line,
    naming the connection) for one that is malformed or asks for an
    identity we cannot assume: configuration errors of the stream. Reads
    the environment (and, through :func:`get_connection`, the config file's
    connections); call it when the producer is built, not at definitions load.
    """
    env = os.environ if environ is None else environ
    connection = Connection(conn_id=str(aws_conn_id))  # none: no fields, no extra
    if aws_conn_id is not None:
        try:
            connection = get_connection(aws_conn_id, environ=env)
        except ConnectionNotFound:
            if aws_conn_id != DEFAULT_CONN_ID:
                raise
            log.warning("AWS connection %r is not defined; using botocore's default credentials "
                        "and region", aws_conn_id)
    fields = _Fields(connection)
    refused = sorted(_IDENTITY & set(fields.extra))
    if refused:
        raise fields.invalid(
            f"{', '.join(refused)} cannot be honoured by sharedstream's SQS client (it assumes "
            "no roles and reads no profiles); give the credentials themselves, or none for "
            "botocore's default chain")
    config = dict(fields.mapping("config_kwargs"))
    config.update(botocore_config or {})
    return ClientSettings(
        region_name=(region_name or fields.text("region_name")
                     or _default_region(env, sqs_queue)),
        endpoint_url=fields.endpoint(),
        credentials=fields.credentials(),
        verify=verify if verify is not None else fields.extra.get("verify"),
        client_config=config,
        ignored=tuple(sorted(set(fields.extra) - _HONOURED)),
    )


class _Fields:
    """Typed reads of one connection's fields and extra; a wrong type is an InvalidConnection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.extra = connection.extra_dejson

    def invalid(self, problem: str) -> InvalidConnection:
        return InvalidConnection(self.connection.conn_id, self.connection.source, problem)

    def text(self, key: str) -> str | None:
        value = self.extra.get(key)
        if value is not None and not isinstance(value, str):
            raise self.invalid(f"{key} must be text, got {type(value).__name__}")
        return value or None

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.extra.get(key) or {}
        if not isinstance(value, Mapping):
            raise self.invalid(f"{key} must be an object")
        return value

    def credentials(self) -> dict[str, str]:
        key_id = self.connection.login or self.text("aws_access_key_id")
        secret = self.connection.password or self.text("aws_secret_access_key")
        if bool(key_id) != bool(secret):
            raise self.invalid("an access key id needs its secret access key (login and "
                               "password), and the other way round")
        if not key_id or not secret:
            return {}
        credentials = {"aws_access_key_id": key_id, "aws_secret_access_key": secret}
        token = self.text("aws_session_token")
        if token:
            credentials["aws_session_token"] = token
        return credentials

    def endpoint(self) -> str | None:
        service = self.mapping("service_config").get("sqs") or {}
        if not isinstance(service, Mapping):
            raise self.invalid("service_config.sqs must be an object")
        endpoint = service.get("endpoint_url") or self.extra.get("endpoint_url")
        if endpoint is not None and not isinstance(endpoint, str):
            raise self.invalid("endpoint_url must be text")
        return endpoint or None


def _default_region(environ: Mapping[str, str], queue: str) -> str:
    """The region botocore would read from the environment, else the queue URL's, else us-east-1."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if environ.get(name):
            return environ[name]
    match = _REGION_IN_URL.match(queue)
    return match.group(1) if match else _FALLBACK_REGION
