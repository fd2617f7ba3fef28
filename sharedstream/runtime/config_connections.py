"""The config file's ``[connections.<conn_id>]`` tables: reading them and showing them.

Each table holds a connection's fields (``conn_type``, ``host``, ``port``,
``login``, ``password``, ``schema``, ``extra`` as an inline table or a JSON
string) or a single ``uri = "..."``; see :mod:`sharedstream.connections`
for what each form means. :mod:`sharedstream.runtime.config` reads the
section with :func:`read_connections` (turning :class:`InvalidConnection`
into its ``ConfigError``) and shows it with :func:`connections_as_dict` and
:func:`render_connections`.

Invariants:

- A shown connection (masked or not) lists only the fields that are set,
  so the unmasked TOML loads back to equal connections.
- Masked, the password and every secret-looking extra key read
  ``"********"`` (:meth:`Connection.masked`); nothing else hides them, so
  the masked form is the only one ``config show`` prints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sharedstream.connections import (
    FIELDS,
    Connection,
    InvalidConnection,
    connection_from_table,
    set_file_connections,
)

__all__ = ["connections_as_dict", "install_connections", "read_connections", "render_connections"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def read_connections(section: Mapping[str, Any], path: Path) -> dict[str, Connection]:
    """The connections of a config file's ``[connections]`` section, by conn id.

    Raises :class:`InvalidConnection` naming the connection and the key
    (with a "did you mean") for anything malformed, including an entry that
    is not a table.
    """
    found: dict[str, Connection] = {}
    for conn_id, table in section.items():
        source = f"config file {path} [connections.{conn_id}]"
        if not isinstance(table, dict):
            raise InvalidConnection(
                conn_id, source, "expected a table ([connections.<conn_id>] with conn_type, "
                f"host, ... or uri = \"...\"), got a {type(table).__name__}")
        found[conn_id] = connection_from_table(conn_id, table, source=source)
    return found


def install_connections(connections: Mapping[str, Connection], file: Path | None) -> None:
    """Make the config file's connections visible to ``get_connection`` in this process.

    Called by the triggerer (and ``connections get``) after loading the
    configuration; ``file`` is named in ``ConnectionNotFound`` messages.
    """
    set_file_connections(connections, origin=f"config file {file}" if file is not None else "")


def connections_as_dict(
    connections: Mapping[str, Connection], *, mask_secrets: bool = True
) -> dict[str, dict[str, Any]]:
    """``conn_id -> {field: value}`` for the fields that are set; secrets masked unless asked."""
    shown: dict[str, dict[str, Any]] = {}
    for conn_id, conn in connections.items():
        values = conn.masked() if mask_secrets else {
            name: conn.extra_dejson if name == "extra" else getattr(conn, name) for name in FIELDS}
        shown[conn_id] = {name: values[name] for name in FIELDS
                          if values[name] is not None and values[name] != {}}
    return shown


def render_connections(
    connections: Mapping[str, Connection], *, mask_secrets: bool = True
) -> list[str]:
    """TOML lines of ``[connections.<conn_id>]`` tables, each headed by where it came from."""
    lines: list[str] = []
    for conn_id, values in connections_as_dict(connections, mask_secrets=mask_secrets).items():
        source = connections[conn_id].source
        lines += [""] + ([_comment(f"from {source}")] if source else [])
        lines.append(f"[connections.{_key(conn_id)}]")
        for name, value in values.items():
            lines.append(f"{name} = {_extra(value) if name == 'extra' else _inline(value)}")
    return lines


def _comment(text: str) -> str:
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _string(text: str) -> str:
    def escape(char: str) -> str:
        if char in '"\\':
            return "\\" + char
        return f"\\u{ord(char):04X}" if ord(char) < 0x20 or ord(char) == 0x7F else char

    return '"' + "".join(map(escape, text)) + '"'


def _has_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_null(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_null(item) for item in value)
    return value is None


def _extra(extra: dict[str, Any]) -> str:
    # TOML has no null: an extra holding one is written as the JSON string the reader accepts.
    return _string(json.dumps(extra)) if _has_null(extra) else _inline(extra)


def _inline(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_inline(item) for item in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_string(str(k))} = {_inline(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")
