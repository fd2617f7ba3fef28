"""Airflow-style connections: named broker settings kept out of trigger kwargs.

A *connection* is a named set of fields (``conn_type``, ``host``, ``port``,
``login``, ``password``, ``schema``, ``extra``) that a trigger refers to by
id (``conn_id="kafka_default"``) instead of carrying the settings, and
their secrets, inline. :func:`get_connection` finds it, in this order:

1. the environment variable ``SHAREDSTREAM_CONN_<ID>``,
2. the environment variable ``AIRFLOW_CONN_<ID>`` (so an Airflow deployment's
   variables work unchanged),
3. the ``[connections.<conn_id>]`` tables of the config file, handed to this
   module by the runtime through :func:`set_file_connections`,

where ``<ID>`` is the conn id upper-cased, as Airflow names its variables.
An environment value is read at every lookup (never cached), so changing a
variable takes effect at the next producer start.

Forms, read the way Airflow reads them:

- URI: ``conn-type://login:password@host:port/schema?key=value&...``.
  Every part is percent-decoded; ``-`` in the scheme reads as ``_``
  (``google-cloud-platform://`` is ``google_cloud_platform``) and
  ``postgresql`` as ``postgres``; the host is lower-cased (it comes from
  :attr:`urllib.parse.SplitResult.hostname`); query parameters become
  ``extra``, each value decoded as JSON when it is JSON (``123`` -> ``123``,
  ``true`` -> ``True``) and kept as text otherwise, the last one winning when
  a key repeats; a ``__extra__`` parameter holds the whole extra as a JSON
  object instead. ``type://https://host`` keeps ``https://`` in the host.
- JSON: a value starting with ``{`` is an object with keys ``conn_type``,
  ``host``, ``port``, ``login``, ``password``, ``schema``, ``extra`` (a JSON
  object, or a string holding one) and ``description`` (ignored).
- Config file: the same keys in a TOML table, or a single ``uri = "..."``
  (:func:`connection_from_table`).

Invariants:

- A malformed value raises :class:`InvalidConnection` naming the conn id,
  where the value came from and what is wrong; the password (and any other
  part of the value) is never echoed.
- A missing connection raises :class:`ConnectionNotFound`, one line naming
  every place looked.
- :class:`Connection` is immutable; its ``repr`` and :meth:`Connection.masked`
  show ``"********"`` for the password and for every secret-looking extra
  key (see :func:`is_secret_key`).
- :meth:`Connection.get_uri` parses back (:func:`parse_connection_uri`) to an
  equal connection (host compared lower-cased, as parsing lower-cases it).
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from sharedstream.brokerkit.errors import BrokerConfigError

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

CONN_ENV_PREFIXES = ("SHAREDSTREAM_CONN_", "AIRFLOW_CONN_")
"""Environment variable prefixes, in lookup order; the conn id follows, upper-cased."""

MASK = "********"
"""What a secret shows as in :meth:`Connection.masked` and ``repr``."""

EXTRA_KEY = "__extra__"
"""The URI query parameter holding the whole extra as JSON (Airflow's name)."""

FIELDS = ("conn_type", "host", "port", "login", "password", "schema", "extra")
"""The fields of a connection, as JSON keys and config-file keys."""

_SECRET_SUBSTRINGS = (
    "password", "passwd", "secret", "token", "key", "credential", "connection_string",
    "connectionstring", "private",
)
_SECRET_WORDS = frozenset({"sas", "pwd"})
_SECRET_VALUE = re.compile(r"(sharedaccesskey|accountkey|sharedaccesssignature)\s*=", re.I)


class ConnectionNotFound(BrokerConfigError):
    """No connection with this id in any place :func:`get_connection` looks.

    The message is one line naming the conn id, both environment variables
    and the config file's section. A configuration error of the stream
    (a :class:`~sharedstream.brokerkit.errors.BrokerConfigError`, hence a
    ``SharedStreamError``): the triggerer marks the stream's triggers failed
    instead of restarting them. Not retryable: the same environment and
    configuration give the same answer.
    """

    retryable = False

    def __init__(self, conn_id: str, *, file_origin: str = "") -> None:
        names = " or ".join(_env_names(conn_id))
        where = f"in {file_origin}" if file_origin else "in the config file (none loaded)"
        super().__init__(f"connection {conn_id!r} not found: no environment variable {names}, "
                         f"and no [connections.{conn_id}] table {where}")
        self.conn_id = conn_id


class InvalidConnection(BrokerConfigError):
    """A connection's URI, JSON or config table is malformed, or unusable by its trigger.

    The message is one line: conn id, source, what is wrong; never the
    password or the raw value. ``key`` is the offending field when there is
    one (for the config file's "did you mean"). A configuration error, like
    :class:`ConnectionNotFound`. Not retryable.
    """

    retryable = False

    def __init__(self, conn_id: str, source: str, problem: str, *, key: str | None = None) -> None:
        where = f" (from {source})" if source else ""
        super().__init__(f"invalid connection {conn_id!r}{where}: {problem}")
        self.conn_id = conn_id
        self.source = source
        self.key = key


def is_secret_key(name: str) -> bool:
    """True if an extra key looks like it holds a secret (case-insensitive).

    A key containing ``password``, ``secret``, ``token``, ``key``,
    ``credential``, ``connection_string``, ``private`` (...) is secret, as is
    one with the word ``sas`` or ``pwd`` (``sas_url``; but ``sasl.mechanism``
    is not: the word is ``sasl``).
    """
    lowered = name.lower()
    if any(part in lowered for part in _SECRET_SUBSTRINGS):
        return True
    return any(word in _SECRET_WORDS for word in re.split(r"[^a-z0-9]+", lowered))


def _mask_value(key: str, value: Any) -> Any:
    if is_secret_key(key):
        return MASK
    if isinstance(value, Mapping):
        return {str(k): _mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, str) and _SECRET_VALUE.search(value):
        return MASK
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value


@dataclass(frozen=True, repr=False)
class Connection:
    """One named connection; immutable, its secrets masked in ``repr``.

    ``extra`` is the parsed extra (a read-only mapping; lists inside it read
    back as tuples); :attr:`extra_dejson` gives a fresh, mutable copy.
    ``source`` says where it was read (``"environment variable
    AIRFLOW_CONN_KAFKA_DEFAULT"``, ``"config file /x/sharedstream.toml
    [connections.kafka_default]"``), or ``""`` when built directly.
    """

    conn_id: str
    conn_type: str | None = None
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = None
    schema: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", _freeze(self.extra))

    @property
    def extra_dejson(self) -> dict[str, Any]:
        """The extra as a plain dict (a deep copy: changing it changes nothing here)."""
        thawed: dict[str, Any] = _thaw(self.extra)
        return thawed

    def masked(self) -> dict[str, Any]:
        """Every field for display, with secrets replaced by ``"********"``.

        The password (when set), every secret-looking extra key (nested ones
        too) and any value carrying an Azure shared-access key are masked.
        """
        shown: dict[str, Any] = {"conn_id": self.conn_id}
        for name in FIELDS:
            value = self.extra_dejson if name == "extra" else getattr(self, name)
            if name == "password" and value is not None:
                value = MASK
            elif name == "extra":
                value = {key: _mask_value(key, item) for key, item in value.items()}
            elif isinstance(value, str) and _SECRET_VALUE.search(value):
                value = MASK
            shown[name] = value
        shown["source"] = self.source
        return shown

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.masked().items())
        return f"Connection({fields})"

    def get_uri(self) -> str:
        """The connection as an Airflow-style URI (it holds the password: do not log it).

        The extra goes in query parameters when each value reads back as
        itself, otherwise as one JSON ``__extra__`` parameter.
        """
        scheme = (self.conn_type or "").lower().replace("_", "-")
        uri = f"{scheme}://"
        authority = ""
        if self.login is not None:
            authority += quote(self.login, safe="")
        if self.password is not None:
            authority += ":" + quote(self.password, safe="")
        if authority:
            uri += authority + "@"
        host = ""
        if self.host:
            protocol, _, rest = self.host.rpartition("://")
            if protocol:
                uri += f"{protocol}://"
            host = f"[{rest}]" if is_ipv6(rest) else quote(rest, safe="")
        if self.port is not None:
            host = (host or ("" if authority else "@")) + f":{self.port}"
        uri += host
        if self.schema:
            uri += "/" + quote(self.schema, safe="")
        if self.extra:
            uri += ("?" if self.schema else "/?") + _extra_query(self.extra_dejson)
        return uri


def is_ipv6(host: str) -> bool:
    """Whether ``host`` is an IPv6 address (written in a URL between brackets)."""
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _decode_query_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _extra_query(extra: dict[str, Any]) -> str:
    simple = all(isinstance(v, str | int | float | bool) for v in extra.values())
    if simple:
        encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()}
        query = urlencode(encoded)
        pairs = parse_qsl(query, keep_blank_values=True)
        if {k: _decode_query_value(v) for k, v in pairs} == extra:
            return query
    return urlencode({EXTRA_KEY: json.dumps(extra)})


def _normalize_conn_type(conn_type: str) -> str:
    # Airflow's rules: postgresql is postgres; a dash (the only form a URI scheme allows) is _.
    if conn_type == "postgresql":
        return "postgres"
    return conn_type.replace("-", "_")


def _parse_extra_json(conn_id: str, text: str, source: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidConnection(conn_id, source, f"{what} is not valid JSON ({exc.msg} at "
                                f"char {exc.pos})", key="extra") from None
    if not isinstance(value, dict):
        raise InvalidConnection(conn_id, source, f"{what} must be a JSON object, got "
                                f"{type(value).__name__}", key="extra")
    return value


def parse_connection_uri(conn_id: str, uri: str, *, source: str = "") -> Connection:
    """Read an Airflow-style connection URI (see the module docstring).

    Raises :class:`InvalidConnection` for a value that is not such a URI
    (no ``scheme://``, more than two ``://``, a port that is not a number,
    a ``__extra__`` that is not a JSON object).
    """
    text = uri.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z0-9+.\-_]*", scheme):
        raise InvalidConnection(conn_id, source, "expected a URI conn-type://login:password@"
                                "host:port/schema?extra=... or a JSON object")
    protocol = None
    head, again, tail = rest.partition("://")
    if again and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", head):  # type://https://host...
        protocol, rest = head, tail
        if "://" in re.split(r"[?#]", rest, maxsplit=1)[0]:
            raise InvalidConnection(conn_id, source, "more than one protocol before the host; "
                                    "expected conn-type://[protocol://]host")
    try:
        parts = urlsplit("//" + rest)
    except ValueError:  # a bracketed host that is no IPv6 address
        raise InvalidConnection(conn_id, source, "the host is not valid", key="host") from None
    try:
        port = parts.port
    except ValueError:
        raise InvalidConnection(conn_id, source, "the port is not a number in 0..65535",
                                key="port") from None
    host = unquote(parts.hostname or "") or None
    if host and protocol:
        host = f"{protocol}://{host}"
    extra: dict[str, Any] = {}
    if parts.query:
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if EXTRA_KEY in query:
            extra = _parse_extra_json(conn_id, query[EXTRA_KEY], source, "the __extra__ parameter")
        else:
            extra = {key: _decode_query_value(value) for key, value in query.items()}
    return Connection(
        conn_id=conn_id,
        conn_type=_normalize_conn_type(scheme.lower()) or None,
        host=host,
        port=port,
        login=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        schema=unquote(parts.path[1:]) or None,
        extra=extra,
        source=source,
    )


def connection_from_table(
    conn_id: str, table: Mapping[str, Any], *, source: str = ""
) -> Connection:
    """Build a connection from parsed JSON or a config-file table.

    Keys are those of :data:`FIELDS` (plus ``description``, ignored), or a
    single ``uri`` (read by :func:`parse_connection_uri`). Text fields must be strings, the
    port an integer (or a string of digits), ``extra`` a mapping or a string
    holding a JSON object. Raises :class:`InvalidConnection` with ``key`` set
    to the offending key (an unknown key says which one was probably meant).
    """
    if "uri" in table:
        others = sorted(set(table) - {"uri", "description"})
        if others:
            raise InvalidConnection(conn_id, source, f"uri cannot be combined with {others[0]}",
                                    key=others[0])
        if not isinstance(table["uri"], str):
            raise InvalidConnection(conn_id, source, "uri must be a string", key="uri")
        return parse_connection_uri(conn_id, table["uri"], source=source)
    known = [*FIELDS, "description", "uri"]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            match = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {match[0]}?" if match else f"expected one of: {', '.join(known)}"
            raise InvalidConnection(conn_id, source, f"unknown key {key!r}: {hint}", key=key)
        if value is None or key == "description":
            continue
        if key == "port":
            values[key] = _port(conn_id, value, source)
        elif key == "extra":
            values[key] = _extra(conn_id, value, source)
        elif not isinstance(value, str):
            raise InvalidConnection(conn_id, source, f"{key} must be a string, got "
                                    f"{type(value).__name__}", key=key)
        elif key == "conn_type":
            values[key] = _normalize_conn_type(value) or None
        else:
            values[key] = value
    return Connection(conn_id=conn_id, source=source, **values)


def _port(conn_id: str, value: object, source: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise InvalidConnection(conn_id, source, "port must be an integer in 0..65535",
                                key="port")
    return value


def _extra(conn_id: str, value: object, source: str) -> dict[str, Any]:
    if isinstance(value, str):
        return _parse_extra_json(conn_id, value, source, "extra") if value.strip() else {}
    if not isinstance(value, Mapping):
        raise InvalidConnection(conn_id, source, "extra must be an object (or a string holding "
                                f"a JSON object), got {type(value).__name__}", key="extra")
    return dict(value)


def parse_connection_json(conn_id: str, text: str, *, source: str = "") -> Connection:
    """Read the JSON form (see the module docstring); :class:`InvalidConnection` if malformed."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidConnection(conn_id, source, f"not valid JSON ({exc.msg} at char "
                                f"{exc.pos})") from None
    if not isinstance(value, dict):
        raise InvalidConnection(conn_id, source, "the JSON form must be an object")
    return connection_from_table(conn_id, value, source=source)


def _parse_value(conn_id: str, value: str, source: str) -> Connection:
    if value.lstrip().startswith("{"):
        return parse_connection_json(conn_id, value, source=source)
    return parse_connection_uri(conn_id, value, source=source)


def _env_names(conn_id: str) -> list[str]:
    return [prefix + conn_id.upper() for prefix in CONN_ENV_PREFIXES]


@dataclass
class _FileSection:
    """The config file's connections in this process (one instance, set by the runtime)."""

    connections: Mapping[str, Connection] = field(default_factory=dict)
    origin: str = ""


_file_section = _FileSection()


def set_file_connections(connections: Mapping[str, Connection], *, origin: str = "") -> None:
    """Make the config file's connections visible to :func:`get_connection` in this process.

    Called by the runtime after it loads the configuration (replacing any
    earlier set; an empty mapping clears it). ``origin`` names the file for
    :class:`ConnectionNotFound` messages (``"config file /x/sharedstream.toml"``).
    """
    _file_section.connections = MappingProxyType(dict(connections))
    _file_section.origin = origin


def get_connection(conn_id: str, *, environ: Mapping[str, str] | None = None) -> Connection:
    """The connection ``conn_id``: ``SHAREDSTREAM_CONN_<ID>``, ``AIRFLOW_CONN_<ID>``, the file.

    ``environ`` defaults to ``os.environ``, read now. Raises
    :class:`ConnectionNotFound` if no place has it and
    :class:`InvalidConnection` if the first place that has it holds a
    malformed value (a later place is not tried: a typo must not silently
    fall back to another connection).
    """
    if not isinstance(conn_id, str) or not conn_id.strip():
        raise InvalidConnection(str(conn_id), "", "a conn id must be a non-empty string")
    env = os.environ if environ is None else environ
    for name in _env_names(conn_id):
        value = env.get(name)
        if value is not None and value.strip():
            return _parse_value(conn_id, value, f"environment variable {name}")
    found = _file_section.connections.get(conn_id)
    if found is None:
        raise ConnectionNotFound(conn_id, file_origin=_file_section.origin)
    return found


def env_connections(environ: Mapping[str, str] | None = None) -> Iterator[Connection]:
    """Every connection defined by an environment variable, in lookup order, for display.

    The conn id is the variable's suffix lower-cased; one shadowed by a
    ``SHAREDSTREAM_CONN_`` variable of the same id is skipped. Raises
    :class:`InvalidConnection` for a malformed one.
    """
    env = os.environ if environ is None else environ
    seen: set[str] = set()
    for prefix in CONN_ENV_PREFIXES:
        for name in sorted(env):
            if not name.upper().startswith(prefix) or len(name) == len(prefix):
                continue
            conn_id = name[len(prefix):].lower()
            if conn_id in seen or not env[name].strip():
                continue
            seen.add(conn_id)
            yield _parse_value(conn_id, env[name], f"environment variable {name}")
