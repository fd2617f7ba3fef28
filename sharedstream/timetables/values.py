"""The time values timetables take and store: aware datetimes, timezones and deltas.

Invariants every timetable relies on:

1. No naive datetime gets in. :func:`require_aware` refuses one with
   :class:`NaiveDatetime` (a one-line message naming the argument), and
   returns the moment in UTC, so equal instants compare and print equally.
2. A timezone is a ``zoneinfo.ZoneInfo`` (or a name it knows, such as
   ``"Europe/Amsterdam"`` or ``"UTC"``) or a fixed offset
   (``datetime.timezone``); it is stored as its IANA key or as ``"+HH:MM"``
   and comes back equal. Any other ``tzinfo`` (pytz, dateutil) is refused:
   it could not be stored faithfully.
3. A delta is a positive ``datetime.timedelta`` or a
   ``dateutil.relativedelta.relativedelta``; :func:`encode_delta` /
   :func:`decode_delta` round-trip both exactly (JSON-able dicts).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.relativedelta import relativedelta, weekday

from sharedstream.engine.errors import SharedStreamError

__all__ = [
    "Delta",
    "InvalidTimetable",
    "NaiveDatetime",
    "check_delta",
    "decode_delta",
    "decode_timezone",
    "encode_delta",
    "encode_timezone",
    "parse_timezone",
    "require_aware",
]

Delta = dt.timedelta | relativedelta
"""What ``DeltaTriggerTimetable``, ``DeltaDataIntervalTimetable`` and ``interval=`` take."""

_OFFSET = re.compile(r"^([+-])(\d{2}):(\d{2})$")
_RELATIVE_FIELDS = ("years", "months", "days", "leapdays", "hours", "minutes", "seconds",
                    "microseconds")
_ABSOLUTE_FIELDS = ("year", "month", "day", "hour", "minute", "second", "microsecond")


class InvalidTimetable(SharedStreamError, ValueError):
    """A timetable was given arguments it cannot schedule with (bad cron, bad delta, ...)."""


class NaiveDatetime(SharedStreamError, ValueError):
    """A datetime without a timezone was given where an instant is needed."""


def require_aware(value: object, what: str) -> dt.datetime:
    """``value`` as an aware datetime in UTC; :class:`NaiveDatetime` if it has no timezone."""
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{what} must be a datetime, got {type(value).__qualname__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise NaiveDatetime(
            f"{what} {value.isoformat()} has no timezone; pass an aware datetime "
            "(for example datetime(..., tzinfo=ZoneInfo('UTC')))"
        )
    return value.astimezone(dt.UTC)


def parse_timezone(value: str | dt.tzinfo) -> dt.tzinfo:
    """A ``ZoneInfo`` for an IANA name or ``"+HH:MM"``, or ``value`` if it is one we can store."""
    if isinstance(value, str):
        match = _OFFSET.match(value)
        if match:
            sign, hours, minutes = match.groups()
            offset = dt.timedelta(hours=int(hours), minutes=int(minutes))
            return dt.timezone(-offset if sign == "-" else offset)
        try:
            return ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidTimetable(f"unknown timezone {value!r}") from exc
    encode_timezone(value)  # refuses a tzinfo that cannot be stored
    return value


def encode_timezone(tz: dt.tzinfo) -> str:
    """The stored form of ``tz``: its IANA key, ``"UTC"`` or ``"+HH:MM"``."""
    if isinstance(tz, ZoneInfo) and tz.key:
        return tz.key
    if tz is dt.UTC:
        return "UTC"
    if isinstance(tz, dt.timezone):
        offset = tz.utcoffset(None)
        sign = "-" if offset < dt.timedelta(0) else "+"
        minutes = abs(offset) // dt.timedelta(minutes=1)
        if abs(offset) % dt.timedelta(minutes=1):
            raise InvalidTimetable(f"timezone offset {offset} is not a whole number of minutes")
        return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    raise InvalidTimetable(
        f"timezone {tz!r} cannot be stored; use zoneinfo.ZoneInfo, an IANA name or "
        "datetime.timezone"
    )


def decode_timezone(data: str) -> dt.tzinfo:
    """Inverse of :func:`encode_timezone`."""
    if data == "UTC":
        return dt.UTC
    return parse_timezone(data)


def check_delta(delta: object, what: str) -> Delta:
    """``delta`` if it is a timedelta or relativedelta, else ``TypeError``."""
    if not isinstance(delta, dt.timedelta | relativedelta):
        raise TypeError(
            f"{what} must be a datetime.timedelta or a dateutil relativedelta, "
            f"got {type(delta).__qualname__}"
        )
    return delta


def encode_delta(delta: Delta) -> dict[str, Any]:
    """A JSON-able dict for ``delta``: ``{"seconds": ...}`` or the relativedelta's fields."""
    if isinstance(delta, dt.timedelta):
        return {"days": delta.days, "seconds": delta.seconds,
                "microseconds": delta.microseconds}
    fields: dict[str, Any] = {
        name: getattr(delta, name) for name in _RELATIVE_FIELDS if getattr(delta, name)
    }
    fields.update({name: getattr(delta, name) for name in _ABSOLUTE_FIELDS
                   if getattr(delta, name) is not None})
    if delta.weekday is not None:
        fields["weekday"] = [delta.weekday.weekday, delta.weekday.n]
    return {"relativedelta": fields}


def decode_delta(data: dict[str, Any]) -> Delta:
    """Inverse of :func:`encode_delta`."""
    if "relativedelta" not in data:
        return dt.timedelta(days=data["days"], seconds=data["seconds"],
                            microseconds=data["microseconds"])
    fields = dict(data["relativedelta"])
    if "weekday" in fields:
        day, n = fields.pop("weekday")
        fields["weekday"] = weekday(day, n)
    return relativedelta(**fields)
