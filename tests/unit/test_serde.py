"""Trigger kwargs serialization: exact round trips, determinism, paths in errors, fingerprints."""

from __future__ import annotations

import decimal
import enum
import math
import os
import subprocess
import sys
import threading
import uuid
import zoneinfo
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime import serde
from sharedstream.runtime.serde import (
    MAX_DEPTH,
    SerializationError,
    kwargs_fingerprint,
    pack_event_payload,
    pack_kwargs,
    unpack_kwargs,
)

# -- helpers -----------------------------------------------------------------


def roundtrip(value: Any) -> Any:
    return unpack_kwargs(pack_kwargs({"v": value}))["v"]


def assert_same_tz(expected: tzinfo | None, actual: tzinfo | None, path: str) -> None:
    assert type(actual) is type(expected), path
    if isinstance(expected, zoneinfo.ZoneInfo):
        assert isinstance(actual, zoneinfo.ZoneInfo)
        assert actual.key == expected.key, path
    elif isinstance(expected, timezone):
        assert actual == expected, path
        assert isinstance(actual, timezone)
        assert (actual is UTC) == (expected is UTC), path
        assert actual.tzname(None) == expected.tzname(None), path
        assert repr(actual) == repr(expected), path


def assert_identical(expected: Any, actual: Any, path: str = "v") -> None:
    """Same types and values all the way down (independently of the serializer)."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, list | tuple):
        assert len(actual) == len(expected), path
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            assert_identical(want, got, f"{path}[{index}]")
    elif isinstance(expected, dict):
        # Insertion order is part of the contract: pair keys by position.
        assert len(actual) == len(expected), path
        for (want_key, want), (got_key, got) in zip(expected.items(), actual.items(), strict=True):
            assert_identical(want_key, got_key, f"{path} key")
            assert_identical(want, got, f"{path}[{want_key!r}]")
    elif isinstance(expected, set | frozenset):
        assert actual == expected, path
        for want in expected:
            (got,) = [item for item in actual if item == want]
            assert_identical(want, got, f"{path}{{{want!r}}}")
    elif isinstance(expected, datetime):
        assert actual == expected, path  # same instant
        assert actual.replace(tzinfo=None) == expected.replace(tzinfo=None), path  # wall time
        assert actual.fold == expected.fold, path
        assert_same_tz(expected.tzinfo, actual.tzinfo, path)
    elif isinstance(expected, time):
        assert actual.replace(tzinfo=None) == expected.replace(tzinfo=None), path
        assert actual.fold == expected.fold, path
        assert_same_tz(expected.tzinfo, actual.tzinfo, path)
    elif isinstance(expected, decimal.Decimal):
        assert str(actual) == str(expected), path
    elif isinstance(expected, float):
        assert actual == expected or (math.isnan(actual) and math.isnan(expected)), path
        assert math.copysign(1.0, actual) == math.copysign(1.0, expected), path
    else:
        assert actual == expected, path


def reverse_dicts(value: Any) -> Any:
    """The same value with every dict's insertion order reversed (sets hold no dicts)."""
    if type(value) is dict:
        return {key: reverse_dicts(item) for key, item in reversed(value.items())}
    if type(value) is list:
        return [reverse_dicts(item) for item in value]
    if type(value) is tuple:
        return tuple(reverse_dicts(item) for item in value)
    return value


# -- strategies --------------------------------------------------------------

offsets = st.timedeltas(
    min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
)
timezones = st.one_of(
    st.just(UTC),
    st.builds(timezone, offsets),
    st.builds(timezone, offsets, st.text(min_size=1, max_size=8)),
    # st.timezones() scans the whole database; a few zones with DST and odd offsets do.
    st.sampled_from(
        [
            zoneinfo.ZoneInfo(key)
            for key in ("Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe")
        ]
    ),
)
hashable_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.datetimes(),
    # Built by hand: st.datetimes(timezones=...) and st.decimals() are ~5x slower.
    st.builds(
        lambda moment, tz, fold: moment.replace(tzinfo=tz, fold=fold),
        st.datetimes(),
        timezones,
        st.integers(0, 1),
    ),
    st.dates(),
    st.times(),
    st.builds(lambda moment, tz: moment.replace(tzinfo=tz), st.times(), timezones),
    st.timedeltas(),
    st.builds(
        lambda sign, digits, exponent: decimal.Decimal((sign, digits, exponent)),
        st.integers(0, 1),
        st.lists(st.integers(0, 9), min_size=1, max_size=30).map(tuple),
        st.integers(-40, 40),
    ),
    st.sampled_from([decimal.Decimal("Infinity"), decimal.Decimal("-Infinity")]),
    st.uuids(),
)
hashables = st.recursive(
    hashable_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(tuple), st.frozensets(inner, max_size=3)
    ),
    max_leaves=4,
)
values = st.recursive(
    hashables,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
        st.dictionaries(hashables, inner, max_size=3),
        st.sets(hashables, max_size=3),
        st.frozensets(hashables, max_size=3),
    ),
    max_leaves=10,
)
kwargs_dicts = st.dictionaries(st.text(max_size=8), values, max_size=4)


# -- properties --------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(kwargs_dicts)
def test_roundtrip_is_exact_and_deterministic(kwargs: dict[str, Any]) -> None:
    # One property for several checks: generating nested values is the slow part.
    packed = pack_kwargs(kwargs)
    restored = unpack_kwargs(packed)
    assert_identical(kwargs, restored, "kwargs")
    assert pack_kwargs(restored) == packed
    assert pack_kwargs(kwargs) == packed
    fingerprint = kwargs_fingerprint("a.B", kwargs)
    assert kwargs_fingerprint("a.B", restored) == fingerprint
    assert kwargs_fingerprint("a.B", reverse_dicts(kwargs)) == fingerprint


native_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
              st.floats(allow_nan=False), st.text(max_size=10), st.binary(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10,
)


def packed_by_the_general_encoder(kwargs: dict[str, Any]) -> bytes:
    return serde._packb(serde._top_level(kwargs, canonical=False))


@settings(max_examples=60, deadline=None)
@given(st.one_of(kwargs_dicts, st.dictionaries(st.text(max_size=8), native_values, max_size=4)))
def test_the_native_fast_path_packs_exactly_like_the_general_encoder(
    kwargs: dict[str, Any],
) -> None:
    assert pack_kwargs(kwargs) == packed_by_the_general_encoder(kwargs)


@settings(max_examples=80, deadline=None)
@given(st.one_of(values, native_values))
def test_a_vouched_event_payload_packs_as_the_checked_way_would(payload: Any) -> None:
    # A broken promise (a tuple, a set, a big int, a datetime...) falls back to the check.
    checked = pack_kwargs({"payload": payload})
    assert pack_event_payload(payload, native=True) == checked
    assert pack_event_payload(payload) == checked


def test_a_vouched_event_payload_still_names_what_cannot_be_stored() -> None:
    with pytest.raises(SerializationError, match=r"kwargs\['payload'\]\[0\]: .* object"):
        pack_event_payload([object()], native=True)


@pytest.mark.parametrize("key", [(1, 2), frozenset({1}), 2**64, -(2**63) - 1, 7, b"k", 1.5, None])
def test_the_native_fast_path_checks_nested_dict_keys(key: Any) -> None:
    # Keys that are containers or out-of-range ints need the general encoder's ext types.
    kwargs = {"v": {key: 1}}
    assert pack_kwargs(kwargs) == packed_by_the_general_encoder(kwargs)
    assert unpack_kwargs(pack_kwargs(kwargs)) == kwargs


@pytest.mark.parametrize("depth", range(MAX_DEPTH - 3, MAX_DEPTH + 3))
@pytest.mark.parametrize("container", [list, dict])
def test_the_native_fast_path_keeps_the_depth_limit(depth: int, container: type) -> None:
    value: Any = 1
    for _ in range(depth):
        value = [value] if container is list else {"k": value}
    try:
        expected: bytes | None = packed_by_the_general_encoder({"v": value})
    except SerializationError:
        expected = None
    if expected is None:
        with pytest.raises(SerializationError, match="nested deeper"):
            pack_kwargs({"v": value})
    else:
        assert pack_kwargs({"v": value}) == expected


# -- explicit round trips ----------------------------------------------------


@pytest.mark.parametrize(
    "tz",
    [
        UTC,
        timezone(timedelta(hours=5, minutes=30)),
        timezone(timedelta(hours=-3, seconds=-7, microseconds=-11), "Odd"),
        timezone(timedelta(0), "UTC"),
        zoneinfo.ZoneInfo("Europe/Paris"),
        zoneinfo.ZoneInfo("America/New_York"),
    ],
    ids=repr,
)
def test_aware_datetime_keeps_tz_kind_instant_and_wall_time(tz: tzinfo) -> None:
    moment = datetime(2024, 7, 1, 12, 34, 56, 789012, tzinfo=tz)
    restored = roundtrip(moment)
    assert_identical(moment, restored)
    assert restored.utcoffset() == moment.utcoffset()
    assert restored.astimezone(UTC) == moment.astimezone(UTC)


def test_utc_comes_back_as_the_utc_singleton() -> None:
    assert roundtrip(datetime(2024, 1, 1, tzinfo=UTC)).tzinfo is UTC
    # Named zero offset stays a distinct, named fixed offset.
    assert roundtrip(datetime(2024, 1, 1, tzinfo=timezone(timedelta(0), "UTC"))).tzinfo is not UTC


def test_ambiguous_wall_time_keeps_its_fold() -> None:
    new_york = zoneinfo.ZoneInfo("America/New_York")
    first = datetime(2021, 11, 7, 1, 30, tzinfo=new_york)
    second = first.replace(fold=1)
    assert first.astimezone(UTC) != second.astimezone(UTC)
    for moment in (first, second):
        restored = roundtrip(moment)
        assert_identical(moment, restored)
        assert restored.astimezone(UTC) == moment.astimezone(UTC)


def test_naive_datetime_date_time_timedelta() -> None:
    for value in (
        datetime(2000, 2, 29, 23, 59, 59, 999999),
        datetime(2000, 1, 1, fold=1),
        datetime.min,
        datetime.max,
        date(1, 1, 1),
        time(23, 59, 59, 1),
        time(1, 2, tzinfo=zoneinfo.ZoneInfo("Asia/Kolkata")),
        time(1, 2, tzinfo=UTC, fold=1),
        timedelta(microseconds=1),
        timedelta(days=-1, microseconds=-1),
        timedelta(-5, 3, 7),
        timedelta.min,
        timedelta.max,
    ):
        assert_identical(value, roundtrip(value))


@pytest.mark.parametrize(
    "number",
    [0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**1000, -(2**1000)],
)
def test_ints_of_any_size(number: int) -> None:
    assert_identical(number, roundtrip(number))
    raw = msgpack.unpackb(pack_kwargs({"n": number}), ext_hook=lambda code, data: ("ext", code))
    in_native_range = -(2**63) <= number < 2**64
    assert raw["n"] == (number if in_native_range else ("ext", 1))


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (2**64, 1),
        ((1, 2), 2),
        ({1}, 3),
        (frozenset({1}), 4),
        (datetime(2024, 1, 1), 5),
        (date(2024, 1, 1), 6),
        (time(1), 7),
        (timedelta(1), 8),
        (decimal.Decimal("1.5"), 9),
        (uuid.UUID(int=5), 10),
    ],
    ids=lambda value: type(value).__name__,
)
def test_extension_codes_match_the_documented_table(value: Any, code: int) -> None:
    raw = msgpack.unpackb(pack_kwargs({"v": value}), ext_hook=lambda code, data: code)
    assert raw == {"v": code}


def test_containers_keep_their_types_and_keys() -> None:
    value = {
        "tuple": (1, (2, [3, (4,)]), ()),
        "list": [[], [()], [{}]],
        "keys": {1: "int", (1, "a"): "tuple", b"k": "bytes", None: "none", 2.5: "float"},
        "more keys": {frozenset({1, 2}): 1, date(2024, 1, 1): 2, uuid.UUID(int=1): 3},
        "sets": [set(), frozenset(), {(1, 2), frozenset({"x"})}],
    }
    assert_identical(value, roundtrip(value))


def test_special_floats_and_decimals() -> None:
    for value in (float("inf"), float("-inf"), -0.0, float("nan"), 5e-324):
        assert_identical(value, roundtrip(value))
    for text in ("NaN", "-sNaN", "Infinity", "-0", "1.500", "1E+3", "-12345678901234567890.1"):
        restored = roundtrip(decimal.Decimal(text))
        assert type(restored) is decimal.Decimal
        assert str(restored) == str(decimal.Decimal(text))


# -- determinism -------------------------------------------------------------


def test_set_order_does_not_depend_on_insertion_order() -> None:
    words = [f"word{index}" for index in range(50)]
    extra = {f"extra{index}" for index in range(2000)}
    grown = set(words) | extra
    grown -= extra  # same elements, much larger table: another iteration order
    assert grown == set(words)
    assert list(grown) != list(set(words))
    assert pack_kwargs({"s": grown, "f": frozenset(grown)}) == pack_kwargs(
        {"s": set(words), "f": frozenset(words)}
    )


_SEED_SCRIPT = """
from sharedstream.runtime.serde import kwargs_fingerprint, pack_kwargs
kwargs = {
    "words": {"alpha", "beta", "gamma", "delta", "epsilon"},
    "nested": frozenset({frozenset({"a", "b"}), frozenset({"c"}), ("x", frozenset({"y", "z"}))}),
    "mixed": {1, "one", b"one", None, (1, "one")},
}
print(pack_kwargs(kwargs).hex(), kwargs_fingerprint("c.D", kwargs))
"""


def test_output_is_identical_across_hash_seeds() -> None:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _SEED_SCRIPT],
            env={**os.environ, "PYTHONHASHSEED": seed},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in ("1", "2")
    ]
    outputs = {process.communicate(timeout=30)[0] for process in processes}
    assert [process.returncode for process in processes] == [0, 0]
    assert len(outputs) == 1


# -- errors ------------------------------------------------------------------


class Foo:
    pass


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    HIGH = 1


class Naming(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(hours=1)

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        return "N"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"options": [1, 2, Foo()]}, "kwargs['options'][2]: cannot serialize object of type Foo"),
        ({"a": {"b": (1, Foo())}}, "kwargs['a']['b'][1]: cannot serialize object of type Foo"),
        ({"color": Color.RED}, "kwargs['color']: cannot serialize object of type Color"),
        ({"level": Level.HIGH}, "kwargs['level']: cannot serialize object of type Level"),
        ({"buf": bytearray(b"x")}, "kwargs['buf']: cannot serialize object of type bytearray"),
        (
            {"m": {Color.RED: 1}},
            "kwargs['m'] (key <Color.RED: 1>): cannot serialize object of type Color",
        ),
        ({"tags": {Color.RED}}, "kwargs['tags']{<Color.RED: 1>}: cannot serialize object"),
        (
            {"at": datetime(2024, 1, 1, tzinfo=Naming())},
            "kwargs['at']: cannot serialize a datetime with tzinfo of type Naming",
        ),
    ],
)
def test_unsupported_values_are_named_by_path_and_type(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(SerializationError) as excinfo:
        pack_kwargs(kwargs)
    assert str(excinfo.value).startswith(message)
    with pytest.raises(SerializationError):
        kwargs_fingerprint("c.D", kwargs)


def test_subclasses_of_supported_types_are_refused_with_a_reason() -> None:
    with pytest.raises(SerializationError, match="subclasses of supported types are refused"):
        pack_kwargs({"level": Level.HIGH})


def test_error_is_part_of_the_hierarchy() -> None:
    assert issubclass(SerializationError, SharedStreamError)
    assert issubclass(SerializationError, ValueError)
    assert SerializationError.retryable is False


def test_keyword_names_must_be_str() -> None:
    with pytest.raises(SerializationError, match="keyword names must be str"):
        pack_kwargs({1: "x"})  # type: ignore[dict-item]


def test_too_deep_nesting_is_refused() -> None:
    value: Any = []
    for _ in range(MAX_DEPTH + 5):
        value = [value]
    with pytest.raises(SerializationError, match=f"nested deeper than {MAX_DEPTH}"):
        pack_kwargs({"deep": value})
    shallow: Any = 1
    for _ in range(MAX_DEPTH - 2):
        shallow = (shallow,)
    assert roundtrip(shallow) == shallow


def test_zoneinfo_without_a_key_is_refused() -> None:
    candidates = [Path(root) / "Europe" / "Paris" for root in zoneinfo.TZPATH]
    path = next((candidate for candidate in candidates if candidate.is_file()), None)
    if path is None:
        pytest.skip("no system time zone database")
    with path.open("rb") as file:
        keyless = zoneinfo.ZoneInfo.from_file(file)
    with pytest.raises(SerializationError, match=r"kwargs\['at'\]: .*ZoneInfo has no key"):
        pack_kwargs({"at": datetime(2024, 1, 1, tzinfo=keyless)})


def deeply_nested_tuples(depth: int) -> bytes:
    """Well-formed tuple extensions nested far deeper than pack_kwargs ever writes."""
    value = msgpack.ExtType(2, msgpack.packb([1]))
    for _ in range(depth - 1):
        value = msgpack.ExtType(2, msgpack.packb([value]))
    return msgpack.packb({"a": value})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        pack_kwargs({"a": (1, 2)})[:-1],
        pack_kwargs({"a": 1}) + b"\x00",
        msgpack.packb([1, 2]),
        msgpack.packb({1: 2}),
        msgpack.packb({"a": msgpack.ExtType(99, b"")}),
        msgpack.packb({"a": msgpack.ExtType(5, msgpack.packb([2024, 1, 1, 0, 0, 0, 0, 0, [9]]))}),
        msgpack.packb({"a": msgpack.ExtType(6, msgpack.packb([2024, 13, 1]))}),
        msgpack.packb({"a": msgpack.ExtType(9, b"not a number")}),
        msgpack.packb({"a": {msgpack.ExtType(3, msgpack.packb([])): 1}}),  # a set as a key
        deeply_nested_tuples(3000),
    ],
)
def test_corrupt_data_raises_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError, match="cannot unpack kwargs"):
        unpack_kwargs(data)


def test_hostile_nesting_fails_cleanly_on_a_small_thread_stack() -> None:
    outcome: list[BaseException | Any] = []

    def work() -> None:
        try:
            outcome.append(unpack_kwargs(deeply_nested_tuples(5000)))
        except SerializationError as exc:
            outcome.append(exc)

    previous = threading.stack_size(512 * 1024)
    try:
        thread = threading.Thread(target=work)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    (error,) = outcome
    assert isinstance(error, SerializationError)
    assert "RecursionError" in str(error)


def test_unknown_time_zone_key_says_what_to_install() -> None:
    tz = [2, "Nowhere/Atlantis"]
    data = msgpack.packb({"a": msgpack.ExtType(5, msgpack.packb([2024, 1, 1, 0, 0, 0, 0, 0, tz]))})
    with pytest.raises(SerializationError, match=r"'Nowhere/Atlantis'.*tzdata"):
        unpack_kwargs(data)


# -- fingerprints ------------------------------------------------------------


def test_fingerprint_is_order_independent_at_every_level() -> None:
    one = {"a": 1, "b": [{"x": 1, "y": (2, {"p": 1, "q": 2})}], "c": {3: "three", 4: "four"}}
    two = {"c": {4: "four", 3: "three"}, "b": [{"y": (2, {"q": 2, "p": 1}), "x": 1}], "a": 1}
    assert pack_kwargs(one) != pack_kwargs(two)  # packing keeps insertion order...
    assert kwargs_fingerprint("m.T", one) == kwargs_fingerprint("m.T", two)  # ...the hash not
    digest = kwargs_fingerprint("m.T", one)
    assert len(digest) == 64
    assert digest == digest.lower()
    int(digest, 16)


@pytest.mark.parametrize(
    "changed",
    [
        {"a": 2, "b": [1, 2]},
        {"a": 1.0, "b": [1, 2]},
        {"a": True, "b": [1, 2]},
        {"a": 1, "b": (1, 2)},
        {"a": 1, "b": [2, 1]},
        {"A": 1, "b": [1, 2]},
        {"a": 1, "b": [1, 2], "c": None},
        {"a": 1},
    ],
)
def test_fingerprint_changes_with_any_key_value_or_type(changed: dict[str, Any]) -> None:
    base = {"a": 1, "b": [1, 2]}
    assert kwargs_fingerprint("m.T", changed) != kwargs_fingerprint("m.T", base)


def test_fingerprint_changes_with_classpath() -> None:
    kwargs = {"a": 1}
    assert kwargs_fingerprint("m.T", kwargs) != kwargs_fingerprint("m.U", kwargs)
    assert kwargs_fingerprint("m.T", kwargs) == kwargs_fingerprint("m.T", dict(kwargs))


def test_fingerprint_rejects_a_non_str_classpath() -> None:
    with pytest.raises(SerializationError, match="classpath"):
        kwargs_fingerprint(b"m.T", {})  # type: ignore[arg-type]


def test_a_failed_pack_leaves_nothing_behind_for_the_next_one() -> None:
    # The packer is reused per thread: an error half-way must not leak bytes.
    with pytest.raises(SerializationError):
        pack_kwargs({"a": [1, 2, object()]})
    assert unpack_kwargs(pack_kwargs({"a": [1, 2]})) == {"a": [1, 2]}
    assert pack_kwargs({"a": [1, 2]}) == msgpack.packb({"a": [1, 2]}, use_bin_type=True)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ("\ud800", "not valid Unicode"),
        ({"text": "ok \udfff"}, "not valid Unicode"),
        ("x" * (serde.MAX_EVENT_PAYLOAD_BYTES + 1), "over the limit"),
    ],
)
def test_event_payloads_the_store_cannot_take_raise_one_error_naming_why(
    payload: Any, why: str, native: bool,
) -> None:
    with pytest.raises(serde.SerializationError, match=why):
        serde.pack_event_payload(payload, native=native)


def test_an_event_payload_nested_too_deep_is_refused() -> None:
    deep: Any = "leaf"
    for _ in range(serde.MAX_DEPTH):
        deep = [deep]
    with pytest.raises(serde.SerializationError, match="nested deeper"):
        serde.pack_event_payload(deep)
