"""The shared decoding helpers: the JSON decoder must be ``json.loads``, only faster.

"The same" is strict: the same value with the same types (``repr`` is
compared, so ``1`` is not ``1.0`` and a big integer is not a float), or the
same error type and message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sharedstream.brokerkit.codecs import DECODERS

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                              "utf-32", "utf-32-le", "utf-32-be"])


def outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "value", repr(decode(raw))
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError alike
        return type(exc).__name__, str(exc)


@given(st.binary(max_size=12))
@example(b"")
@example(b"\x00")
@example(b'{"a": "\xed\xa0\x80"}')  # a lone surrogate, kept by "surrogatepass"
@example(b"\xef\xbb\xbf{}")  # a UTF-8 byte-order mark
@example(b"NaN")
@example(b"1e400")  # a float overflow: json.loads says inf
@example(b"18446744073709551616")  # past 64 bits: still an int
@example(b"-9223372036854775809")
@example(b'"\x1f"')  # a raw control character
@example(b"01")
def test_json_decoder_matches_json_loads_on_any_bytes(raw: bytes) -> None:
    assert outcome(DECODERS["json"], raw) == outcome(json.loads, raw)


@given(_JSON, _ENCODINGS)
def test_json_decoder_matches_json_loads_on_documents(document: Any, encoding: str) -> None:
    raw = json.dumps(document).encode(encoding)
    assert outcome(DECODERS["json"], raw) == outcome(json.loads, raw)


# Texts near the edges of the grammar: numbers, escapes, whitespace, nesting, separators.
_NEAR_JSON = st.text(
    alphabet=st.sampled_from(
        list('{}[],:"\\ 0123456789-+.eEtrufalsnINfiy\tn\x0c\x1fu\u00e9\ud800')),
    max_size=16,
)
_NUMBERS = st.integers().map(str) | st.floats().map(repr) | st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,30})?([eE][-+]?[0-9]{1,4})?\Z"
)


@given(_NEAR_JSON)
def test_json_decoder_matches_json_loads_near_the_grammar(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    assert outcome(DECODERS["json"], raw) == outcome(json.loads, raw)


@given(_NUMBERS)
@example("1e400")
@example("2.2250738585072011e-308")
@example("4.9e-324")
@example("123456789012345678901234567890")
def test_json_decoder_reads_numbers_as_json_loads_does(number: str) -> None:
    raw = f'[{number}, {{"n": {number}}}]'.encode()
    assert outcome(DECODERS["json"], raw) == outcome(json.loads, raw)


def test_a_document_nested_too_deep_to_decode_is_a_decode_error() -> None:
    """json.loads recurses; a record nested thousands deep must be rejected, not crash."""
    from sharedstream.brokerkit.codecs import DecodeCache  # noqa: PLC0415 - local to this test

    class Raw(DecodeCache):
        __slots__ = ("raw",)

        def __init__(self, raw: bytes) -> None:
            super().__init__()
            self.raw = raw

        def raw_bytes(self) -> bytes:
            return self.raw

    deep = Raw(b"[" * 100_000 + b"]" * 100_000)
    for _ in range(2):  # remembered: every filter gets the same error
        with pytest.raises(ValueError, match="nested too deep"):
            deep.decoded("json", DECODERS["json"])


def test_a_match_is_compiled_to_text_and_split_paths() -> None:
    from sharedstream.brokerkit.codecs import MISSING, compile_match  # noqa: PLC0415

    options: dict[str, Any] = {"key_field": "key", "named_field": "headers", "document": True,
                               "payload_format": "json", "document_formats": ("json",)}
    compiled = compile_match({"key": b"eu", "headers": {"src": b"web", "bad": b"\xff"},
                              "json": {"order.amount": 5}}, **options)
    assert compiled.key == "eu"
    assert compiled.named == (("src", "web"), ("bad", None))  # not UTF-8: matches no text
    assert compiled.paths == ((("order", "amount"), 5),)
    assert compiled
    empty = compile_match(None, **options)
    assert empty.key is MISSING
    assert not empty  # no condition: everything matches
    assert not compile_match({"headers": {}}, **options)
