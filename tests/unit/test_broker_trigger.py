"""The broker kit's trigger base class, through a tiny broker of notes (no real broker).

``NoteTrigger`` provides only the broker hooks; everything checked here -
the option checks, decode / match, rejecting what does not decode, the
prefilter and vouching for payloads - comes from ``BrokerTrigger``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Hashable, Mapping
from functools import partial
from typing import Any, ClassVar

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharedstream.brokerkit.codecs import AS_HELD, JSON, MSGPACK, UTF8, DecodeCache, PayloadFormat
from sharedstream.brokerkit.trigger import MAX_VOUCHED_BRACKETS, BrokerTrigger
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.runtime.serde import MAX_DEPTH
from tests.log_lines import fields_of, text_of
from tests.prefilters import assert_prefilters_agree


class Note(DecodeCache):
    """The broker's message: a body, a key, tags, and where it came from."""

    __slots__ = ("body", "key", "tags", "where")

    def __init__(self, body: bytes | None, key: bytes | None = None,
                 tags: tuple[tuple[str, bytes], ...] = (), where: str = "notes/1") -> None:
        super().__init__()
        self.body, self.key, self.tags, self.where = body, key, tags, where

    def raw_bytes(self) -> bytes | None:
        return self.body


class NoteTrigger(BrokerTrigger):
    """A broker trigger with nothing but the broker hooks."""

    payload_formats: ClassVar[Mapping[str, PayloadFormat]] = {
        "raw": AS_HELD, "text": UTF8, "json": JSON, "msgpack": MSGPACK}
    match_key_field = "key"
    match_named_field = "tags"

    def __init__(self, *, board: str = "b", payload_format: str = "raw",
                 match: dict[str, Any] | None = None) -> None:
        super().__init__(payload_format=payload_format, match=match)
        self.board = board

    def consumer_kwargs(self) -> dict[str, Any]:
        return {"board": self.board}

    def message_body(self, message: Note) -> bytes | None:
        return message.body

    def message_key(self, message: Note) -> bytes | None:
        return message.key

    def message_named_values(self, message: Note) -> Mapping[str, bytes]:
        return dict(message.tags)

    def message_fields_native(self, message: Note) -> bool:
        return not message.tags  # tags travel as tuples, like Kafka headers

    def describe_message(self, message: Note) -> str:
        return message.where

    def to_payload(self, value: Any, message: Note) -> dict[str, Any]:
        return {"value": value, "where": message.where,
                "tags": [(name, raw) for name, raw in message.tags]}

    def shared_stream_key(self) -> Hashable:
        return ("notes", self.board)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        raise NotImplementedError("no broker in these tests")


async def run_filter(trigger: BrokerTrigger, notes: list[Note],
                     monkeypatch: pytest.MonkeyPatch) -> tuple[list[TriggerEvent], list[str]]:
    """The events ``trigger``'s filter yields for ``notes``, and the reasons it rejected."""
    reasons: list[str] = []
    monkeypatch.setattr("sharedstream.brokerkit.trigger.reject_shared_stream_event",
                        reasons.append)

    async def stream() -> AsyncIterator[Note]:
        for note in notes:
            yield note

    return [event async for event in trigger.filter_shared_stream(stream())], reasons


# -- the options, checked where the trigger is declared ----------------------------------------


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"payload_format": "xml"},
     "payload_format must be one of ('raw', 'text', 'json', 'msgpack'), got 'xml'"),
    ({"match": "key=eu"}, "match must be a dict, got str"),
    ({"match": {"value": 1}}, "unknown match fields ['value']; use ['json', 'key', 'tags']"),
    ({"match": {"json": {"a": 1}}},
     "match['json'] needs payload_format 'json' or 'msgpack', got 'raw'"),
    ({"match": {"tags": ["src"]}}, "match['tags'] must be a dict, got list"),
    ({"payload_format": "json", "match": {"json": {"": 1}}},
     "match['json'] keys must be non-empty str, got ''"),
])
def test_bad_options_are_one_line_naming_the_option(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError) as caught:  # noqa: PT011 - the message is compared whole
        NoteTrigger(**kwargs)
    assert str(caught.value) == problem


def test_match_is_compiled_once_and_serialized_as_declared() -> None:
    trigger = NoteTrigger(payload_format="json", match={"key": "eu", "json": {"a": 1}})
    classpath, kwargs = trigger.serialize()
    assert kwargs == {"board": "b", "payload_format": "json",
                      "match": {"key": "eu", "json": {"a": 1}}}
    assert NoteTrigger(**kwargs).serialize() == (classpath, kwargs)
    note = Note(b'{"a": 1}', b"eu")
    trigger.match["key"] = "us"  # too late: the match was compiled when the trigger was built
    assert trigger.matches(trigger.decode(note), note)


async def test_run_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="NoteTrigger runs on the shared stream only"):
        await anext(NoteTrigger().run())


# -- decoding, matching, rejecting -------------------------------------------------------------


def test_each_format_decodes_the_body() -> None:
    assert NoteTrigger().decode(Note(b"\xff")) == b"\xff"
    assert NoteTrigger(payload_format="text").decode(Note("café".encode())) == "café"
    assert NoteTrigger(payload_format="msgpack").decode(Note(msgpack.packb([1]))) == [1]
    for payload_format in ("text", "json"):
        assert NoteTrigger(payload_format=payload_format).decode(Note(None)) is None
    note = Note(b'{"a": [1]}')
    assert NoteTrigger(payload_format="json").decode(note) is NoteTrigger(
        payload_format="json").decode(note)  # decoded once, shared by every trigger


async def test_what_does_not_decode_is_rejected_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    trigger = NoteTrigger(payload_format="json", match={"json": {"ok": True}})
    notes = [Note(b"{nope", where="notes/1"), Note(b'{"ok": true}', where="notes/2"),
             Note(b'{"ok": false}', where="notes/3"), Note(b"\xff", where="notes/4")]
    with caplog.at_level(logging.WARNING):
        events, reasons = await run_filter(trigger, notes, monkeypatch)
    assert [event.payload["where"] for event in events] == ["notes/2"]
    assert len(reasons) == 2
    assert all(reason.startswith("undecodable json value: ") for reason in reasons)
    assert [text_of(r) for r in caplog.records] == ["rejecting a message that does not decode"] * 2
    assert [fields_of(r)["source"] for r in caplog.records] == ["notes/1", "notes/4"]
    assert all(isinstance(fields_of(r)["error"], ValueError) for r in caplog.records)


def test_key_tags_and_paths_must_all_hold() -> None:
    trigger = NoteTrigger(payload_format="json", match={
        "key": b"eu", "tags": {"src": "web"}, "json": {"order.amount": 5, "kind": "x"}})
    good = Note(b'{"order": {"amount": 5}, "kind": "x"}', b"eu", (("src", b"web"),))
    assert trigger.matches(trigger.decode(good), good)
    for bad in (Note(good.body, b"us", good.tags), Note(good.body, None, good.tags),
                Note(good.body, b"eu", (("src", b"app"),)), Note(good.body, b"eu"),
                Note(b'{"order": {"amount": 5}}', b"eu", good.tags), Note(b"[]", b"eu", good.tags)):
        assert not trigger.matches(trigger.decode(bad), bad)


# -- the prefilter agrees with the filter --------------------------------------------------------

_KEYS = st.sampled_from([None, b"eu", b"us", b"\xff"])
_TAGS = st.lists(st.tuples(st.sampled_from(["src", "kind"]),
                           st.sampled_from([b"web", b"app", b"\xff"])), max_size=3)
_BODIES = st.sampled_from([None, b"{nope", b'{"a": 1}', b'{"a": 2, "b": {"c": "x"}}',
                           b'{"b": {"c": "y"}}', b"[1, 2]", b'"text"', b"\xff"])
_MATCHES = st.fixed_dictionaries({}, optional={
    "key": st.sampled_from(["eu", "us", b"eu"]),
    "tags": st.dictionaries(st.sampled_from(["src", "kind"]), st.sampled_from(["web", b"app"]),
                            max_size=2),
    "json": st.dictionaries(st.sampled_from(["a", "b.c", "b"]), st.sampled_from([1, 2, "x"]),
                            max_size=2),
})


@given(matches=st.lists(_MATCHES, min_size=1, max_size=4),
       notes=st.lists(st.tuples(_KEYS, _TAGS, _BODIES), min_size=1, max_size=6))
def test_prefilters_agree_with_the_filter(
    matches: list[dict[str, Any]], notes: list[tuple[Any, Any, Any]]
) -> None:
    """Alone or through the fan-out, a prefilter passes exactly what the filter fires or rejects."""
    triggers = [NoteTrigger(payload_format="json", match=m) for m in matches]
    for key, tags, body in notes:
        assert_prefilters_agree(triggers, partial(Note, body, key, tuple(tags)),
                                (key, tags, body))


def test_custom_filters_get_an_exact_prefilter_or_none() -> None:
    class OwnFilter(NoteTrigger):
        async def filter_shared_stream(
            self, shared_stream: AsyncIterator[Any]
        ) -> AsyncIterator[TriggerEvent]:
            async for note in shared_stream:  # sees every note, whatever match says
                yield TriggerEvent({"where": note.where})

    class OwnMatch(NoteTrigger):
        def matches(self, value: Any, message: Note) -> bool:
            return message.where.endswith("/2")

    assert OwnFilter(match={"key": "eu"}).shared_stream_prefilter() is None
    assert NoteTrigger().shared_stream_prefilter() is None  # an empty match: everything fires
    accept = OwnMatch(payload_format="json").shared_stream_prefilter()
    assert accept is not None
    assert not accept(Note(b"{}", where="notes/1"))
    assert accept(Note(b"{}", where="notes/2"))
    assert accept(Note(b"{nope", where="notes/1"))  # undecodable: the filter rejects it


# -- vouching for payloads ------------------------------------------------------------------------


def test_the_bracket_limit_is_serdes() -> None:
    assert MAX_VOUCHED_BRACKETS == MAX_DEPTH - 3


@pytest.mark.parametrize(("payload_format", "body", "tags", "vouched"), [
    ("json", b'{"id": 1, "tags": ["a", {"b": null}]}', (), True),
    ("json", b"[" * 97 + b"]" * 97, (), False),  # too many brackets to vouch for
    ("json", b"[" * 96 + b"]" * 96, (), True),
    ("json", b'{"a": 1}', (("src", b"web"),), False),  # the broker says: tags are tuples
    ("text", b"caf\xc3\xa9", (), True),
    ("raw", None, (), True),
    ("msgpack", msgpack.packb({"a": 1}), (), False),  # may hold ext types
])
async def test_vouched_only_for_what_the_base_class_built(
    payload_format: str, body: bytes | None, tags: tuple[tuple[str, bytes], ...],
    vouched: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    trigger = NoteTrigger(payload_format=payload_format)
    (event,), _ = await run_filter(trigger, [Note(body, tags=tags)], monkeypatch)
    assert trigger.payload_is_native(event) is vouched
    assert not trigger.payload_is_native(TriggerEvent(event.payload))  # only what it built


async def test_custom_payloads_and_decoders_are_not_vouched_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class OwnPayload(NoteTrigger):
        def to_payload(self, value: Any, message: Note) -> dict[str, Any]:
            return {"value": value, "where": (message.where,)}

    class OwnDecode(NoteTrigger):
        def decode(self, message: Note) -> Any:
            return bytearray(message.body or b"")

    for trigger in (OwnPayload(payload_format="json"), OwnDecode()):
        (event,), _ = await run_filter(trigger, [Note(b"{}")], monkeypatch)
        assert not trigger.payload_is_native(event)
