"""Airflow-style connections: named broker settings kept out of trigger kwargs.

:mod:`~sharedstream.connections.lookup` holds the connection itself: its
forms (URI, JSON, a config table), where a conn id is looked up and in
which order, and the invariants of both. :mod:`~sharedstream.connections.settings`
turns a connection into a broker trigger's settings, strictly. This package
hands on the public names of the first, so ``from sharedstream.connections
import get_connection`` is the documented way in (``docs/connections.md``).
"""

from sharedstream.connections.lookup import (
    CONN_ENV_PREFIXES,
    EXTRA_KEY,
    FIELDS,
    MASK,
    Connection,
    ConnectionNotFound,
    InvalidConnection,
    connection_from_table,
    env_connections,
    get_connection,
    is_ipv6,
    is_secret_key,
    parse_connection_json,
    parse_connection_uri,
    set_file_connections,
)

__all__ = [
    "CONN_ENV_PREFIXES",
    "EXTRA_KEY",
    "FIELDS",
    "MASK",
    "Connection",
    "ConnectionNotFound",
    "InvalidConnection",
    "connection_from_table",
    "env_connections",
    "get_connection",
    "is_ipv6",
    "is_secret_key",
    "parse_connection_json",
    "parse_connection_uri",
    "set_file_connections",
]
