"""Value decoding and declarative matching shared by the broker trigger modules.

A raw event is shared by every filter of a stream, so a broker's message
class inherits :class:`DecodeCache`: each format is decoded once per
message, not once per subscriber, and a decoding failure is remembered and
raised again for every filter that asks (each then rejects the message).

Nothing here imports a broker SDK.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import msgpack
import msgspec

from sharedstream.engine.fanout import PASS_ALL, KeyedPrefilter

__all__ = [
    "DECODERS",
    "MISSING",
    "DecodeCache",
    "as_text",
    "decoding_prefilter",
    "lookup",
    "match_prefilter",
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

    def decoded(self, value_format: str, decode: Callable[[bytes], Any]) -> Any:
        """``decode(self.raw_bytes())``, computed once per format and shared by every filter.

        A failure (``ValueError``, ``TypeError`` or ``RecursionError`` from
        the decoder) is remembered and raised again, as ``ValueError``, on
        every call.
        """
        cache = self._decoded
        if value_format not in cache:
            raw = self.raw_bytes()
            try:
                cache[value_format] = decode(raw) if raw is not None else None
            except (ValueError, TypeError) as exc:  # msgpack's errors are ValueErrors too
                cache[value_format] = ValueError(f"undecodable {value_format} value: {exc}")
            except RecursionError:  # json.loads on a document nested thousands deep
                cache[value_format] = ValueError(
                    f"undecodable {value_format} value: nested too deep to decode")
        result = cache[value_format]
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


def match_prefilter(
    trigger: Any,
    base: type[Any],
    *,
    declared: bool,
    shared: Callable[[], Callable[[Any], bool]],
) -> Callable[[Any], bool] | None:
    """The ``shared_stream_prefilter`` of a broker trigger whose filter decodes, then matches.

    ``base`` is the broker's trigger class, whose ``filter_shared_stream``
    rejects what ``decode`` cannot decode and fires for what ``matches``.
    ``None`` when a subclass overrides that filter (its logic is unknown)
    or when nothing is filtered out (no declarative match, ``declared``
    false, and neither ``decode`` nor ``matches`` overridden). A subclass
    that overrides ``decode`` or ``matches`` gets :func:`decoding_prefilter`
    over them; the base class's declarative match gets ``shared()`` (a
    :func:`shared_prefilter`).
    """
    cls = type(trigger)
    if cls.filter_shared_stream is not base.filter_shared_stream:
        return None
    if cls.matches is not base.matches or cls.decode is not base.decode:
        return decoding_prefilter(trigger.decode, trigger.matches)
    return shared() if declared else None
