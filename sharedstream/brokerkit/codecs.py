"""Payload decoding and declarative matching shared by the broker trigger modules.

A raw event is shared by every filter of a stream, so a broker's message
class inherits :class:`DecodeCache`: each format is decoded once per
message, not once per subscriber, and a decoding failure is remembered and
raised again for every filter that asks (each then rejects the message).

A broker trigger names its payload formats with :class:`PayloadFormat`
(the kit's :data:`AS_HELD`, :data:`BYTES`, :data:`UTF8`, :data:`JSON` and
:data:`MSGPACK`, or its own) and its declarative ``match`` is checked and
compiled once by :func:`compile_match`; :mod:`sharedstream.brokerkit.trigger`
applies both.

Nothing here imports a broker SDK.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import msgspec

from sharedstream.engine.fanout import PASS_ALL, KeyedPrefilter

__all__ = [
    "AS_HELD",
    "BYTES",
    "DECODERS",
    "JSON",
    "MISSING",
    "MSGPACK",
    "UTF8",
    "CompiledMatch",
    "DecodeCache",
    "PayloadFormat",
    "as_text",
    "compile_match",
    "decoding_prefilter",
    "lookup",
    "shared_prefilter",
]

MISSING: Any = object()
"""What :func:`lookup` returns for a path that is not in the document."""


def _unpack_msgpack(value: bytes) -> Any:
    return msgpack.unpackb(value, raw=False, strict_map_key=False)


_decode_json_fast = msgspec.json.Decoder().decode


def _load_json(value: bytes) -> Any:
    """``json.loads(value)``: the same result or the same error, about seven times faster.

    msgspec parses every document it accepts exactly as ``json.loads`` does
    (same types, big integers included); what it refuses (``NaN``, numbers
    that overflow a float, lone surrogates, byte-order marks, UTF-16/32,
    malformed input) goes to ``json.loads``, so the result, or the error
    and its message, are ``json.loads``' own. The property tests in
    ``tests/unit/test_codecs.py`` hold the two to that.
    """
    try:
        return _decode_json_fast(value)
    except ValueError:  # msgspec.DecodeError, or bytes that are not UTF-8
        pass
    # json.loads on bytes first guesses UTF-8/16/32 from BOMs and zero bytes; a
    # document starting with a nonzero ASCII byte followed by a nonzero byte is
    # UTF-8 in that guess, so it is decoded as such directly.
    if value and 0 < value[0] < 0x80 and (len(value) < 2 or value[1]):
        return json.loads(value.decode("utf-8", "surrogatepass"))
    return json.loads(value)


DECODERS: dict[str, Callable[[bytes], Any]] = {
    "utf-8": bytes.decode,
    "json": _load_json,
    "msgpack": _unpack_msgpack,
}
"""Format name -> decoder of raw bytes; each raises ``ValueError`` on bad input."""


@dataclass(frozen=True)
class PayloadFormat:
    """How a broker trigger turns a message body into the value it matches and fires.

    ``decode`` takes the message's raw bytes (``DecodeCache.raw_bytes``) and
    raises ``ValueError`` on bad input; ``None`` means no decoding at all: the
    value is the body as the message holds it (``bytes``, ``str`` or
    ``None``). ``native``: every value ``decode`` returns is made only of
    ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list`` and
    ``str``-keyed ``dict`` (exact types), so a trigger may vouch for the
    payloads it builds from it. ``document``: values are JSON-like
    documents, so ``match["json"]`` paths can be looked up in them (and a
    native document is vouched for only when it is shallow enough).
    """

    decode: Callable[[bytes], Any] | None
    native: bool
    document: bool = False


def _identity(raw: bytes) -> bytes:
    return raw


AS_HELD = PayloadFormat(None, native=True)
"""The body exactly as the message holds it (``bytes``, ``str`` or ``None``), not decoded."""
BYTES = PayloadFormat(_identity, native=True)
"""The message's raw bytes (``DecodeCache.raw_bytes``), e.g. a text body UTF-8 encoded."""
UTF8 = PayloadFormat(bytes.decode, native=True)
"""Raw bytes decoded as UTF-8 text."""
JSON = PayloadFormat(_load_json, native=True, document=True)
"""Raw bytes parsed as JSON (exactly as ``json.loads`` does)."""
MSGPACK = PayloadFormat(_unpack_msgpack, native=False, document=True)
"""Raw bytes unpacked as msgpack; not native: msgpack values may hold ext types."""


class CompiledMatch(NamedTuple):
    """A declarative ``match``, checked and compiled once when the trigger is built.

    ``key`` is the wanted message key as text (:data:`MISSING`: no key
    condition); ``named`` the wanted ``(name, text)`` pairs of the broker's
    named values (Kafka headers, SQS message attributes); ``paths`` the
    wanted ``(path parts, value)`` pairs looked up in the decoded document.
    Text is compared after :func:`as_text` on both sides.
    """

    key: Any
    named: tuple[tuple[str, str | None], ...]
    paths: tuple[tuple[tuple[str, ...], Any], ...]

    def __bool__(self) -> bool:
        """Whether the match has any condition (an empty match fires for everything)."""
        return self.key is not MISSING or bool(self.named) or bool(self.paths)


def compile_match(
    match: Any, *, key_field: str | None, named_field: str | None, document: bool,
    payload_format: str, document_formats: tuple[str, ...],
) -> CompiledMatch:
    """Check ``match`` and compile it; raise ``ValueError`` (one line naming the option) if bad.

    The fields a broker takes are ``key_field`` (a wanted key, text or
    bytes), ``named_field`` (a dict of name -> wanted text or bytes) and
    ``"json"`` (a dict of dotted path -> wanted value), which needs a
    ``document`` payload format (one of ``document_formats``).
    """
    if match is None:
        match = {}
    if not isinstance(match, Mapping):
        # ValueError, as for every other bad trigger setting: callers catch one type.
        raise ValueError(f"match must be a dict, got {type(match).__name__}")  # noqa: TRY004
    fields = {name for name in (key_field, named_field, "json") if name is not None}
    unknown = set(match) - fields
    if unknown:
        raise ValueError(f"unknown match fields {sorted(map(str, unknown))}; use {sorted(fields)}")
    if "json" in match and not document:
        raise ValueError(f"match['json'] needs payload_format "
                         f"{' or '.join(map(repr, document_formats))}, got {payload_format!r}")
    for field in sorted(fields - {key_field}):
        wanted = match.get(field, {})
        if not isinstance(wanted, Mapping):
            raise ValueError(  # noqa: TRY004 - see above
                f"match[{field!r}] must be a dict, got {type(wanted).__name__}")
        for name in wanted:
            if not isinstance(name, str) or not name:
                raise ValueError(f"match[{field!r}] keys must be non-empty str, got {name!r}")
    key = as_text(match[key_field]) if key_field is not None and key_field in match else MISSING
    named = tuple((name, as_text(wanted))
                  for name, wanted in match.get(named_field, {}).items()) if named_field else ()
    paths = tuple((tuple(path.split(".")), wanted)
                  for path, wanted in match.get("json", {}).items())
    return CompiledMatch(key, named, paths)


def as_text(value: bytes | str | None) -> str | None:
    """``value`` as text; bytes that are not UTF-8 become ``None`` (they match nothing)."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value


def lookup(document: Any, parts: tuple[str, ...]) -> Any:
    """The value at ``parts`` (a dotted path split once: ``("order", "amount")``), or MISSING."""
    for part in parts:
        # type() first: decoded JSON and msgpack are plain dicts, and the ABC check is slow.
        if not (type(document) is dict or isinstance(document, Mapping)) or part not in document:
            return MISSING
        document = document[part]
    return document


class DecodeCache:
    """Mixin for raw-event classes: decode each format once for all filters.

    Subclasses declare their own ``__slots__``, call ``super().__init__()``
    and say where the raw bytes are (:meth:`raw_bytes`, asked only on a
    cache miss). Treat decoded values as read-only: every filter of the
    stream gets the same object.
    """

    __slots__ = ("_decoded",)

    def __init__(self) -> None:
        self._decoded: dict[Hashable, Any] = {}

    def raw_bytes(self) -> bytes | None:
        """The bytes to decode (``None``: nothing to decode, decodes to ``None``)."""
        raise NotImplementedError

    def decoded(self, payload_format: str, decode: Callable[[bytes], Any]) -> Any:
        """``decode(self.raw_bytes())``, computed once per format and shared by every filter.

        A failure (``ValueError``, ``TypeError`` or ``RecursionError`` from
        the decoder) is remembered and raised again, as ``ValueError``, on
        every call.
        """
        cache = self._decoded
        if payload_format not in cache:
            raw = self.raw_bytes()
            try:
                cache[payload_format] = decode(raw) if raw is not None else None
            except (ValueError, TypeError) as exc:  # msgpack's errors are ValueErrors too
                cache[payload_format] = ValueError(f"undecodable {payload_format} value: {exc}")
            except RecursionError:  # json.loads on a document nested thousands deep
                cache[payload_format] = ValueError(
                    f"undecodable {payload_format} value: nested too deep to decode")
        result = cache[payload_format]
        if isinstance(result, ValueError):
            raise result
        return result


def decoding_prefilter(
    decode: Callable[[Any], Any], matches: Callable[[Any, Any], bool]
) -> Callable[[Any], bool]:
    """A ``shared_stream_prefilter`` for filters shaped "decode, reject if undecodable, match".

    The returned test declines a raw event only when ``decode`` succeeds
    and ``matches(value, raw_event)`` is false, which is exactly when such a
    filter yields nothing and rejects nothing. An undecodable raw event is
    accepted, so the filter still sees it and rejects it.
    """

    def accept(raw_event: Any) -> bool:
        try:
            value = decode(raw_event)
        except ValueError:
            return True  # the filter rejects it: it must see it
        return bool(matches(value, raw_event))

    return accept


def shared_prefilter(
    shape: Hashable, select: Callable[[Any], tuple[Any, ...]], wanted: tuple[Any, ...]
) -> KeyedPrefilter:
    """A prefilter whose work is shared by every trigger with the same ``shape`` of match.

    ``select(raw_event)`` decodes the raw event and returns the tuple of
    values the match compares (key, headers, paths...), raising
    ``ValueError`` when the raw event does not decode; ``shape`` names
    everything ``select`` depends on. The test accepts when the selection
    equals ``wanted``, or when the raw event does not decode (the filter
    rejects it). It is a :class:`~sharedstream.engine.fanout.KeyedPrefilter`: the
    fan-out selects once per raw event for all the triggers of one shape
    and looks the accepting ones up by ``wanted`` (decoding itself is
    cached in the raw event, so asking the tests one by one decodes once too).
    """

    def select_or_pass(raw_event: Any) -> Any:
        try:
            return select(raw_event)
        except ValueError:
            return PASS_ALL  # the filter rejects it: it must see it

    return KeyedPrefilter(("sharedstream.codecs", shape), select_or_pass, wanted)

