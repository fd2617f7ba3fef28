"""An Airflow AWS connection id, as the SQS producer's client settings, the provider's way.

The connection itself is translated as for our own SQS trigger
(:func:`sharedstream.triggers.sqs.sqs_settings_from_connection`: login and
password are the keys, ``extra`` may hold ``aws_session_token``,
``region_name``, ``endpoint_url`` or ``service_config.sqs.endpoint_url``,
``verify`` and ``config_kwargs``; identities we cannot assume are refused,
other extras ignored with one warning). :func:`client_settings` adds the
provider's rules around it:

* the trigger's own ``region_name``, ``verify`` and ``botocore_config`` win
  over the connection's (``botocore_config`` key by key);
* ``aws_conn_id=None``, or the default id ``aws_default`` not defined
  anywhere, means botocore's usual chain (environment variables, shared
  files, instance role), the latter with one warning; any other id that is
  not defined is an error (a typo there would otherwise run with the wrong
  identity);
* with no region from the trigger or the connection, the region is
  ``AWS_REGION`` or ``AWS_DEFAULT_REGION``, else the one in the queue URL,
  else ``us-east-1``.

Nothing here connects or imports the SDK.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sharedstream.connections import ConnectionNotFound, get_connection
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.triggers.sqs import DEFAULT_REGION, sqs_settings_from_connection

__all__ = ["DEFAULT_CONN_ID", "ClientSettings", "client_settings"]

log = key_value_logger(__name__)

DEFAULT_CONN_ID = "aws_default"
"""The one connection id whose absence means botocore's default chain (as in Airflow)."""

_REGION_IN_URL = re.compile(r"^https?://sqs[.-]([a-z0-9-]+)\.amazonaws\.com", re.IGNORECASE)


@dataclass(frozen=True)
class ClientSettings:
    """What the SQS client is built with (see :func:`client_settings`)."""

    region_name: str
    endpoint_url: str | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)
    """Empty: botocore's default chain."""
    verify: bool | str | None = None
    client_config: Mapping[str, Any] = field(default_factory=dict)


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
    (other than ``aws_default``) and
    :class:`~sharedstream.connections.InvalidConnection` (one line, naming
    the connection) for one that is malformed or asks for an identity we
    cannot assume: configuration errors of the stream. Reads the
    environment (and, through :func:`get_connection`, the config file's
    connections); call it when the producer is built, not at definitions load.
    """
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    if aws_conn_id is not None:
        try:
            found = sqs_settings_from_connection(get_connection(aws_conn_id, environ=env))
        except ConnectionNotFound:
            if aws_conn_id != DEFAULT_CONN_ID:
                raise
            log.warning("AWS connection not defined; using botocore's default credentials "
                        "and region", conn_id=aws_conn_id)
    return ClientSettings(
        region_name=region_name or found.get("region_name") or _default_region(env, sqs_queue),
        endpoint_url=found.get("endpoint_url"),
        credentials=found.get("credentials") or {},
        verify=verify if verify is not None else found.get("verify"),
        client_config={**(found.get("client_config") or {}), **(botocore_config or {})},
    )


def _default_region(environ: Mapping[str, str], queue: str) -> str:
    """The region botocore would read from the environment, else the queue URL's, else ours."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if environ.get(name):
            return environ[name]
    match = _REGION_IN_URL.match(queue)
    return match.group(1) if match else DEFAULT_REGION
