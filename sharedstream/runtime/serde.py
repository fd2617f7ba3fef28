"""Serialize trigger kwargs for the metadata store (msgpack).

A trigger is stored as ``(classpath, kwargs)`` and rebuilt elsewhere as
``cls(**kwargs)``, so the kwargs must come back *exactly*: same types, same
values. :func:`pack_kwargs` and :func:`unpack_kwargs` guarantee that for the
following types (exact types only, see below):

* ``None``, ``bool``, ``int`` (any size), ``float``, ``str``, ``bytes``;
* ``list``, ``tuple`` (stays a tuple), ``dict`` (``str`` keys or any other
  supported hashable key), ``set``, ``frozenset``;
* ``datetime.datetime`` (naive or aware), ``datetime.date``,
  ``datetime.time``, ``datetime.timedelta``;
* ``decimal.Decimal``, ``uuid.UUID``.

Aware datetimes and times keep their wall time, their ``fold`` and the kind
of their ``tzinfo``: ``timezone.utc`` comes back as ``timezone.utc``, a
fixed offset ``timezone(timedelta(...), name)`` as an equal fixed offset
with the same name, a ``zoneinfo.ZoneInfo`` as ``ZoneInfo(key)``. Any other
``tzinfo`` (``pytz``, ``dateutil``, a ``ZoneInfo`` read from a file, which
has no key) is refused.

Subclasses of the supported types (``enum.Enum`` members such as an
``IntEnum``, named tuples, ``OrderedDict``, ``bytearray``, ...) are refused
with :class:`SerializationError` rather than silently coming back as their
base type. So is nesting deeper than :data:`MAX_DEPTH` containers.

Values msgpack cannot represent natively travel as msgpack extension types.
Container extensions hold a msgpack-packed array; ``tz`` is ``nil`` (naive),
``[0]`` (``timezone.utc``), ``[1, offset_microseconds, name_or_nil]`` (fixed
offset) or ``[2, key]`` (``ZoneInfo``):

====  ============  =====================================================
code  type          payload
====  ============  =====================================================
1     ``int``       two's-complement big-endian bytes, minimal length
                    (only ints outside msgpack's ``[-2**63, 2**64)``)
2     ``tuple``     packed array of the elements
3     ``set``       packed array of the elements, in canonical order
4     ``frozenset`` packed array of the elements, in canonical order
5     ``datetime``  packed ``[year, month, day, hour, minute, second,
                    microsecond, fold, tz]``
6     ``date``      packed ``[year, month, day]``
7     ``time``      packed ``[hour, minute, second, microsecond, fold, tz]``
8     ``timedelta`` packed ``[days, seconds, microseconds]``
9     ``Decimal``   ``str(value)`` as UTF-8
10    ``UUID``      the 16 bytes of ``value.bytes``
====  ============  =====================================================

Output is deterministic: equal input (same types, same insertion order)
packs to the same bytes in every process. Dicts keep their insertion order;
set elements are ordered by their own packed bytes, a total order that does
not depend on the interpreter's hash seed (natural ``<`` ordering does not
qualify: it is partial for frozensets, and the iteration order it would fall
back on varies with ``PYTHONHASHSEED`` for strings). :func:`kwargs_fingerprint`
additionally sorts dict keys recursively, so it identifies kwargs regardless
of insertion order; the runtime uses it to collapse identical triggers.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import reprlib
import threading
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgpack

from sharedstream.engine.errors import SharedStreamError

__all__ = [
    "MAX_DEPTH",
    "MAX_EVENT_PAYLOAD_BYTES",
    "SerializationError",
    "kwargs_fingerprint",
    "pack_event_payload",
    "pack_kwargs",
    "unpack_event_payload",
    "unpack_kwargs",
]

MAX_DEPTH: Final = 100
"""How many containers deep kwargs may nest, counting the kwargs dict itself."""

MAX_EVENT_PAYLOAD_BYTES: Final = 32 * 1024 * 1024
"""The largest packed trigger-event payload stored (a bigger one is refused at its trigger)."""

EXT_BIGINT: Final = 1
EXT_TUPLE: Final = 2
EXT_SET: Final = 3
EXT_FROZENSET: Final = 4
EXT_DATETIME: Final = 5
EXT_DATE: Final = 6
EXT_TIME: Final = 7
EXT_TIMEDELTA: Final = 8
EXT_DECIMAL: Final = 9
EXT_UUID: Final = 10

_TZ_UTC: Final = 0
_TZ_FIXED: Final = 1
_TZ_ZONEINFO: Final = 2

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_ONE_MICROSECOND: Final = dt.timedelta(microseconds=1)

_SCALARS: Final = frozenset({type(None), bool, str, bytes, float})
_SUPPORTED_BASES: Final = (
    int, float, str, bytes, list, tuple, dict, set, frozenset,
    dt.date, dt.time, dt.timedelta, decimal.Decimal, uuid.UUID,
)  # fmt: skip

_short_repr = reprlib.Repr()
_short_repr.maxstring = 40
_short_repr.maxother = 40


class _Where:
    """Where a value sits in the kwargs, rendered only if an error message needs it.

    Building the ``kwargs['a'][2]`` string for every value would cost more
    than packing it; this keeps the parent and the step and formats lazily.
    """

    __slots__ = ("key", "parent", "template")

    def __init__(self, parent: object, template: str, key: object) -> None:
        self.parent, self.template, self.key = parent, template, key

    def __str__(self) -> str:
        return f"{self.parent}{self.template.format(_short_repr.repr(self.key))}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class SerializationError(SharedStreamError, ValueError):
    """Trigger kwargs could not be packed or unpacked.

    When packing, the message names where the offending value sits and its
    type, e.g. ``kwargs['options'][2]: cannot serialize object of type Foo``.
    When unpacking, the stored bytes are corrupt or were written by an
    incompatible version. Never retryable: the same input fails the same way.
    """


def pack_kwargs(kwargs: Mapping[str, Any]) -> bytes:
    """Pack trigger ``kwargs`` into msgpack bytes.

    Keys of ``kwargs`` itself must be ``str`` (they are keyword names);
    nested dicts may use any supported hashable key. Dict insertion order is
    kept. Equal input always packs to the same bytes.

    Raises :class:`SerializationError` when a value (or key) has an
    unsupported type or ``tzinfo``, or nests deeper than :data:`MAX_DEPTH`;
    the message names its path, e.g. ``kwargs['options'][2]``.
    """
    if type(kwargs) is dict and _native_kwargs(kwargs):
        # Only types msgpack packs natively, exactly as the general encoder would hand
        # them over: pack as is (the runtime packs every stored event payload here).
        return _packb(kwargs)
    return _packb(_top_level(kwargs, canonical=False))


def pack_event_payload(payload: Any, *, native: bool = False) -> bytes:
    """Pack a trigger event's payload as the kwargs ``{"payload": payload}``.

    ``native`` is the trigger's promise (``BaseEventTrigger.payload_is_native``)
    that the payload holds only types msgpack packs natively, nested fewer
    than ``MAX_DEPTH - 2`` containers deep: it is then packed without the
    type walk. Whatever msgpack refuses under that promise (a tuple, a set,
    an int past 64 bits...) falls back to :func:`pack_kwargs`, so the bytes
    are the same either way. Raises :class:`SerializationError` as
    :func:`pack_kwargs` does, and also for text that is not valid Unicode
    (a lone surrogate) and for a result over ``MAX_EVENT_PAYLOAD_BYTES``:
    whatever it raises names why the store could not take the payload.
    """
    kwargs = {"payload": payload}
    packed: bytes | None = None
    if native:
        try:  # noqa: SIM105 - not contextlib.suppress (5x the cost): once per stored event
            packed = _packb(kwargs)
        except (TypeError, ValueError, OverflowError):
            pass  # not as promised: the checked way below names what is wrong
    if packed is None:
        try:
            packed = pack_kwargs(kwargs)
        except SerializationError:
            raise
        except UnicodeEncodeError as exc:
            raise SerializationError(
                f"payload: text that is not valid Unicode ({exc.reason} at position "
                f"{exc.start}: a lone surrogate?)"
            ) from exc
        except (RecursionError, OverflowError, ValueError, TypeError) as exc:
            raise SerializationError(f"payload: {type(exc).__name__}: {exc}") from exc
    if len(packed) > MAX_EVENT_PAYLOAD_BYTES:
        raise SerializationError(
            f"payload: {len(packed):,} bytes packed, over the limit of "
            f"{MAX_EVENT_PAYLOAD_BYTES:,} (MAX_EVENT_PAYLOAD_BYTES)"
        )
    return packed


def unpack_event_payload(data: bytes) -> Any:
    """The payload :func:`pack_event_payload` packed (its inverse).

    Raises :class:`SerializationError` as :func:`unpack_kwargs` does.
    """
    return unpack_kwargs(data).get("payload")


def unpack_kwargs(data: bytes) -> dict[str, Any]:
    """Rebuild the kwargs dict packed by :func:`pack_kwargs`.

    The result equals the packed input value for value and type for type
    (tuples stay tuples, aware datetimes keep their tzinfo kind and wall time).

    Raises :class:`SerializationError` when ``data`` is not packed kwargs
    (corrupt, truncated, or written by an incompatible version), or names a
    ``ZoneInfo`` key this machine's time zone database does not know.
    """
    try:
        result = _resolve(_unpackb(data))
    except SerializationError:
        raise
    except (
        ValueError,
        TypeError,
        LookupError,
        OverflowError,
        ArithmeticError,
        RecursionError,
        msgpack.UnpackException,
    ) as exc:
        raise SerializationError(f"cannot unpack kwargs: {type(exc).__name__}: {exc}") from exc
    if type(result) is not dict or any(type(key) is not str for key in result):
        raise SerializationError("cannot unpack kwargs: data is not a mapping of keyword names")
    return result


def kwargs_fingerprint(classpath: str, kwargs: Mapping[str, Any]) -> str:
    """Identify a trigger by its classpath and kwargs: a SHA-256 hex digest.

    The digest covers the msgpack array ``[classpath, kwargs]`` where
    ``kwargs`` is in canonical form: every dict's entries are sorted by the
    packed bytes of their keys, recursively. So ``{"a": 1, "b": 2}`` and
    ``{"b": 2, "a": 1}`` give the same fingerprint, while any change of
    classpath, key, value or value type gives another one.

    Raises :class:`SerializationError` for the same inputs as :func:`pack_kwargs`.
    """
    if type(classpath) is not str:
        raise SerializationError(
            f"classpath: expected str, got object of type {type(classpath).__qualname__}"
        )
    canonical = _top_level(kwargs, canonical=True)
    return hashlib.sha256(_packb([classpath, canonical])).hexdigest()


# -- packing -----------------------------------------------------------------


class _Packers(threading.local):
    """One reusable packer per thread: half the cost of ``msgpack.packb`` per call."""

    def __init__(self) -> None:
        self.pack = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack


_packers = _Packers()


def _packb(obj: Any) -> bytes:
    # Same bytes as msgpack.packb with these options; a failed pack resets the
    # packer's buffer, so an error never leaks into the next call.
    return _packers.pack(obj)


def _native_kwargs(kwargs: dict[Any, Any]) -> bool:
    """Whether :func:`_top_level` would return ``kwargs`` unchanged (so no error either).

    True when the keys are ``str`` and every value is ``None``, ``bool``,
    ``str``, ``bytes``, ``float``, an ``int`` msgpack holds, or a ``list`` or
    ``dict`` of such, nested no deeper than :data:`MAX_DEPTH` (exact types).
    """
    for key in kwargs:
        if type(key) is not str:
            return False
    return _native_container(kwargs, 0)


def _native_container(value: Any, depth: int) -> bool:
    """Mirrors :func:`_encode`'s cases and depth count, for natively packed values only.

    Scalars are checked inline, one call per container rather than per value:
    this runs for every stored event payload. A dict's keys are almost always
    ``str``, so they get a loop of their own (cheaper than walking ``items()``).
    """
    kind = type(value)
    if (kind is not dict and kind is not list) or depth >= MAX_DEPTH:
        return False
    if kind is dict:
        for key in value:
            if type(key) is not str and not _native_scalar(key):
                return False  # a container key is a tuple or frozenset: not native
        items: Iterable[Any] = value.values()
    else:
        items = value
    depth += 1
    for item in items:
        item_kind = type(item)
        if item_kind in _SCALARS or (item_kind is int and _INT_MIN <= item <= _INT_MAX):
            continue
        if not _native_container(item, depth):  # False for an int out of range, too
            return False
    return True


def _native_scalar(value: Any) -> bool:
    kind = type(value)
    return kind in _SCALARS or (kind is int and _INT_MIN <= value <= _INT_MAX)


def _top_level(kwargs: Mapping[str, Any], *, canonical: bool) -> dict[Any, Any]:
    if not isinstance(kwargs, Mapping):
        raise SerializationError(
            f"kwargs: expected a mapping, got object of type {type(kwargs).__qualname__}"
        )
    for key in kwargs:
        if type(key) is not str:
            raise SerializationError(
                f"kwargs (key {_short_repr.repr(key)}): keyword names must be str, "
                f"got object of type {type(key).__qualname__}"
            )
    return _encode_dict(kwargs, "kwargs", canonical=canonical, depth=1)


def _encode(value: Any, path: object, *, canonical: bool, depth: int) -> Any:
    """Turn ``value`` into what msgpack packs natively (ExtType for the rest)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        size = (value.bit_length() + 8) // 8
        return msgpack.ExtType(EXT_BIGINT, value.to_bytes(size, "big", signed=True))
    if kind in _CONTAINERS:
        if depth >= MAX_DEPTH:
            raise SerializationError(f"{path}: nested deeper than {MAX_DEPTH} containers")
        return _encode_container(value, path, canonical=canonical, depth=depth + 1)
    encoder = _VALUE_ENCODERS.get(kind)
    if encoder is not None:
        code, payload = encoder(value, path)
        return msgpack.ExtType(code, payload)
    message = f"{path}: cannot serialize object of type {kind.__qualname__}"
    if isinstance(value, _SUPPORTED_BASES):
        message += " (subclasses of supported types are refused: they would come back as "
        message += "their base type)"
    raise SerializationError(message)


def _encode_datetime(value: dt.datetime, path: object) -> tuple[int, bytes]:
    fields = [value.year, value.month, value.day, value.hour, value.minute, value.second]
    fields += [value.microsecond, value.fold, _encode_tz(value.tzinfo, path, "datetime")]
    return EXT_DATETIME, _packb(fields)


def _encode_date(value: dt.date, path: object) -> tuple[int, bytes]:
    return EXT_DATE, _packb([value.year, value.month, value.day])


def _encode_time(value: dt.time, path: object) -> tuple[int, bytes]:
    fields = [value.hour, value.minute, value.second, value.microsecond, value.fold]
    fields.append(_encode_tz(value.tzinfo, path, "time"))
    return EXT_TIME, _packb(fields)


def _encode_timedelta(value: dt.timedelta, path: object) -> tuple[int, bytes]:
    return EXT_TIMEDELTA, _packb([value.days, value.seconds, value.microseconds])


def _encode_decimal(value: decimal.Decimal, path: object) -> tuple[int, bytes]:
    return EXT_DECIMAL, str(value).encode()


def _encode_uuid(value: uuid.UUID, path: object) -> tuple[int, bytes]:
    return EXT_UUID, value.bytes


_CONTAINERS: Final = frozenset({list, dict, tuple, set, frozenset})
# Keyed by exact type: a subclass is looked up by its own type and is refused.
_VALUE_ENCODERS: Final[dict[type, Callable[[Any, object], tuple[int, bytes]]]] = {
    dt.datetime: _encode_datetime,
    dt.date: _encode_date,
    dt.time: _encode_time,
    dt.timedelta: _encode_timedelta,
    decimal.Decimal: _encode_decimal,
    uuid.UUID: _encode_uuid,
}


def _encode_container(value: Any, path: object, *, canonical: bool, depth: int) -> Any:
    kind = type(value)
    if kind is dict:
        return _encode_dict(value, path, canonical=canonical, depth=depth)
    if kind is list or kind is tuple:
        items = [
            _encode(item, _Where(path, "[{}]", index), canonical=canonical, depth=depth)
            for index, item in enumerate(value)
        ]
        return items if kind is list else msgpack.ExtType(EXT_TUPLE, _packb(items))
    # set / frozenset: order the elements by their packed bytes (see module docstring).
    elements = [
        _encode(item, _Where(path, "{{{}}}", item), canonical=canonical, depth=depth)
        for item in value
    ]
    elements.sort(key=_packb)
    return msgpack.ExtType(EXT_SET if kind is set else EXT_FROZENSET, _packb(elements))


def _encode_dict(
    value: Mapping[Any, Any], path: object, *, canonical: bool, depth: int
) -> dict[Any, Any]:
    entries = []
    for key, item in value.items():
        key_path = _Where(path, " (key {})", key)
        encoded_key = _encode(key, key_path, canonical=canonical, depth=depth)
        item_path = _Where(path, "[{}]", key)
        entries.append((encoded_key, _encode(item, item_path, canonical=canonical, depth=depth)))
    if canonical:
        entries.sort(key=lambda entry: _packb(entry[0]))
    return dict(entries)


def _encode_tz(tz: dt.tzinfo | None, path: object, what: str) -> Any:
    if tz is None:
        return None
    if tz is dt.UTC:
        return [_TZ_UTC]
    if type(tz) is dt.timezone:
        # timezone pickles as (timezone, (offset,)) or (timezone, (offset, name)): the name
        # is kept only when it was given explicitly, even if it equals the default one.
        reduced = tz.__reduce__()
        args: tuple[Any, ...] = reduced[1] if isinstance(reduced, tuple) else ()
        offset = tz.utcoffset(None)
        name = args[1] if len(args) > 1 else None
        return [_TZ_FIXED, offset // _ONE_MICROSECOND, name]
    if type(tz) is zoneinfo.ZoneInfo:
        if tz.key is None:
            raise SerializationError(
                f"{path}: cannot serialize a {what} whose ZoneInfo has no key "
                "(built from a file); use ZoneInfo(key)"
            )
        return [_TZ_ZONEINFO, tz.key]
    raise SerializationError(
        f"{path}: cannot serialize a {what} with tzinfo of type {type(tz).__qualname__}; "
        "use datetime.timezone or zoneinfo.ZoneInfo"
    )


# -- unpacking ---------------------------------------------------------------


# Extension payloads are decoded after the enclosing unpackb call has returned, never
# from inside its ext_hook: each msgpack C unpacker call reserves tens of kilobytes of
# C stack, so decoding nested containers from the hook could overflow the C stack
# (a segfault on corrupt or hostile data) long before Python's recursion limit.


def _unpackb(data: bytes) -> Any:
    """Unpack one msgpack object; extension types stay ``ExtType`` (resolved later)."""
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)


def _resolve(obj: Any) -> Any:
    """Replace every ``ExtType`` in a freshly unpacked object by the value it encodes."""
    kind = type(obj)
    if kind is msgpack.ExtType:
        return _decode_ext(obj.code, obj.data)
    if kind is list:
        return [_resolve(item) for item in obj]
    if kind is dict:
        return {_resolve(key): _resolve(item) for key, item in obj.items()}
    if kind in _SCALARS or kind is int:
        return obj
    raise SerializationError(f"cannot unpack kwargs: unexpected {kind.__qualname__}")


def _decode_ext(code: int, data: bytes) -> Any:
    decoder = _EXT_DECODERS.get(code)
    if decoder is None:
        raise SerializationError(f"cannot unpack kwargs: unknown msgpack extension type {code}")
    return decoder(data)


def _decode_bigint(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _decode_items(data: bytes) -> list[Any]:
    items = _unpackb(data)
    if type(items) is not list:
        raise SerializationError("cannot unpack kwargs: malformed container extension")
    return [_resolve(item) for item in items]


def _decode_datetime(data: bytes) -> dt.datetime:
    year, month, day, hour, minute, second, micro, fold, tz = _unpackb(data)
    return dt.datetime(year, month, day, hour, minute, second, micro, _decode_tz(tz), fold=fold)


def _decode_date(data: bytes) -> dt.date:
    year, month, day = _unpackb(data)
    return dt.date(year, month, day)


def _decode_time(data: bytes) -> dt.time:
    hour, minute, second, micro, fold, tz = _unpackb(data)
    return dt.time(hour, minute, second, micro, _decode_tz(tz), fold=fold)


def _decode_timedelta(data: bytes) -> dt.timedelta:
    days, seconds, micro = _unpackb(data)
    return dt.timedelta(days=days, seconds=seconds, microseconds=micro)


_EXT_DECODERS: Final[dict[int, Callable[[bytes], Any]]] = {
    EXT_BIGINT: _decode_bigint,
    EXT_TUPLE: lambda data: tuple(_decode_items(data)),
    EXT_SET: lambda data: set(_decode_items(data)),
    EXT_FROZENSET: lambda data: frozenset(_decode_items(data)),
    EXT_DATETIME: _decode_datetime,
    EXT_DATE: _decode_date,
    EXT_TIME: _decode_time,
    EXT_TIMEDELTA: _decode_timedelta,
    EXT_DECIMAL: lambda data: decimal.Decimal(data.decode()),
    EXT_UUID: lambda data: uuid.UUID(bytes=data),
}


def _decode_tz(tz: Any) -> dt.tzinfo | None:
    if tz is None:
        return None
    tag = tz[0]
    if tag == _TZ_UTC:
        return dt.UTC
    if tag == _TZ_FIXED:
        _, micros, name = tz
        offset = dt.timedelta(microseconds=micros)
        return dt.timezone(offset) if name is None else dt.timezone(offset, name)
    if tag == _TZ_ZONEINFO:
        try:
            return zoneinfo.ZoneInfo(tz[1])
        except zoneinfo.ZoneInfoNotFoundError as exc:
            raise SerializationError(
                f"cannot unpack kwargs: time zone {tz[1]!r} is not in this machine's "
                "time zone database (install the tzdata package)"
            ) from exc
    raise SerializationError(f"cannot unpack kwargs: unknown time zone tag {tag!r}")
