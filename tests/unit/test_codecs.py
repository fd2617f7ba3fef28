"""The shared decoding helpers: the JSON decoder must be ``json.loads``, only faster."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from sharedstream.codecs import DECODERS

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                              "utf-32", "utf-32-le", "utf-32-be"])


def outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "value", decode(raw)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError alike
        return type(exc).__name__, str(exc)


@given(st.binary(max_size=12))
@example(b"")
@example(b"\x00")
@example(b'{"a": "\xed\xa0\x80"}')  # a lone surrogate, kept by "surrogatepass"
@example(b"\xef\xbb\xbf{}")  # a UTF-8 byte-order mark
def test_json_decoder_matches_json_loads_on_any_bytes(raw: bytes) -> None:
    assert outcome(DECODERS["json"], raw) == outcome(json.loads, raw)


@given(_JSON, _ENCODINGS)
def test_json_decoder_matches_json_loads_on_documents(document: Any, encoding: str) -> None:
    raw = json.dumps(document).encode(encoding)
    assert outcome(DECODERS["json"], raw) == outcome(json.loads, raw)
