"""Payloads as JSON, the way Airflow's pydantic ``TriggerEvent`` renders them.

Airflow's ``TriggerEvent`` is a pydantic model with one ``payload: Any``
field, so ``model_dump(mode="json")`` and ``model_dump_json()`` follow
pydantic's rules for values of unknown type. This module applies the same
rules without depending on pydantic, for the values a payload holds:

* ``None``, ``bool``, ``int``, ``str`` as they are; a ``float`` that is not
  finite becomes ``null``;
* ``bytes`` and ``bytearray`` as UTF-8 text;
* ``list``, ``tuple``, ``set`` and ``frozenset`` as arrays; ``dict`` as an
  object whose keys are rendered like values and then as text (``True`` is
  ``"true"``, ``None`` is ``"None"``, ``1`` is ``"1"``);
* ``datetime``, ``date`` and ``time`` in ISO 8601 (UTC written ``Z``),
  ``timedelta`` as an ISO 8601 duration (``PT1H30M``, ``-PT1S``, a year
  being 365 days);
* ``Decimal``, ``UUID`` and paths as text, an ``Enum`` as its value, a
  dataclass as an object of its fields.

Anything else raises ``TypeError`` (pydantic raises its own serialization
error there). Pure functions, no state; not on the engine's hot path (only
called by the ``model_dump*`` methods and ``BaseEventTrigger.hash``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

__all__ = ["dumps", "jsonable", "python_dump"]


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (``dict``, ``list``, ``str``, numbers, ``None``)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    for types, convert in _LEAVES:
        if isinstance(value, types):
            return convert(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"cannot render a payload value of type {type(value).__qualname__} as JSON")


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``value`` as JSON text: compact (no spaces) unless ``indent``, non-ASCII kept."""
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(jsonable(value), indent=indent, separators=separators,
                      ensure_ascii=False, allow_nan=False, sort_keys=sort_keys)


def python_dump(value: Any) -> Any:
    """``value`` with dataclasses turned into dicts of their fields (pydantic's python mode)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: python_dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: python_dump(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(python_dump(item) for item in value)
    return value


def _key(key: Any) -> str:
    rendered = jsonable(key)
    if isinstance(rendered, bool):
        return "true" if rendered else "false"
    return rendered if isinstance(rendered, str) else str(rendered)


def _iso_with_z(value: dt.datetime | dt.time) -> str:
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _duration(value: dt.timedelta) -> str:
    sign = "-" if value < dt.timedelta(0) else ""
    value = abs(value)
    years, days = divmod(value.days, 365)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    date_part = (f"{years}Y" if years else "") + (f"{days}D" if days else "")
    time_part = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if value.microseconds:
        time_part += f"{seconds}.{value.microseconds:06d}".rstrip("0") + "S"
    elif seconds:
        time_part += f"{seconds}S"
    if not date_part and not time_part:
        time_part = "0S"
    return f"{sign}P{date_part}" + (f"T{time_part}" if time_part else "")


_LEAVES: tuple[tuple[type | tuple[type, ...], Callable[[Any], str]], ...] = (
    ((bytes, bytearray), lambda value: bytes(value).decode("utf-8")),
    ((dt.datetime, dt.time), _iso_with_z),
    (dt.date, lambda value: value.isoformat()),
    (dt.timedelta, _duration),
    ((Decimal, uuid.UUID, Path), str),
)
"""Values rendered as one JSON string, by type (a ``datetime`` is also a ``date``: first)."""
