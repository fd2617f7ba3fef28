"""Kafka producer and trigger: the conformance suite on Tansu, plus Kafka-specific tests."""

from __future__ import annotations

import asyncio
import importlib
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from functools import partial
from typing import Any, cast

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharedstream import AdvanceItem, AdvanceOutcome, SharedStreamManager, TriggerEvent
from sharedstream.engine.producer import Verdict, annotated_outcome, outcome_with_unseen
from sharedstream.producers.kafka import (
    KafkaCommitError,
    KafkaConfigError,
    KafkaMessage,
    KafkaPayload,
    KafkaProducerError,
    KafkaSettings,
    KafkaSharedStreamProducer,
)
from sharedstream.runtime.serde import pack_event_payload, pack_kwargs, unpack_kwargs
from sharedstream.testing.conformance import ProducerConformance
from sharedstream.testing.harness import Stream
from sharedstream.testing.runner import SupervisedRunner, eventually, eventually_async
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from tests.kafka.conftest import GROUP_SETTINGS, KafkaHarness
from tests.prefilters import assert_prefilters_agree


class TestKafkaConformance(ProducerConformance):
    """The shared producer conformance suite against a real Tansu broker."""


# -- the trigger, without a broker --------------------------------------------------------

BASE: dict[str, Any] = {"bootstrap_servers": "b:9092,a:9092", "topics": ["orders"],
                        "group_id": "g"}


def test_key_holds_consumer_settings_not_filter_settings() -> None:
    plain = KafkaSharedStreamTrigger(**BASE)
    filtered = KafkaSharedStreamTrigger(**{**BASE, "bootstrap_servers": ["a:9092", "b:9092"]},
                                        payload_format="json", match={"json": {"kind": "x"}})
    assert plain.shared_stream_key() == filtered.shared_stream_key()
    for change in ({"group_id": "h"}, {"topics": ["refunds"]}, {"dead_letter_topic": "d"},
                   {"max_redeliveries": 1}, {"client_id": "c"},
                   {"security": {"security_protocol": "SSL"}},
                   {"consumer_overrides": {"session_timeout_ms": 2000}}):
        other = KafkaSharedStreamTrigger(**{**BASE, **change})
        assert other.shared_stream_key() != plain.shared_stream_key(), change


def test_key_does_not_leak_secrets() -> None:
    trigger = KafkaSharedStreamTrigger(**BASE, security={"sasl_plain_password": "hunter2"})
    assert "hunter2" not in repr(trigger.shared_stream_key())


def test_serialize_round_trips() -> None:
    trigger = KafkaSharedStreamTrigger(**BASE, payload_format="msgpack", dead_letter_topic="d",
                                       match={"key": "k"})
    classpath, kwargs = trigger.serialize()
    assert classpath == "sharedstream.triggers.kafka.KafkaSharedStreamTrigger"
    assert KafkaSharedStreamTrigger(**kwargs).serialize() == (classpath, kwargs)


@pytest.mark.parametrize("overrides", [{"enable_auto_commit": True}, {"group_id": "other"}])
def test_lossy_or_conflicting_overrides_are_refused_up_front(overrides: dict[str, Any]) -> None:
    with pytest.raises(KafkaConfigError):
        KafkaSharedStreamTrigger(**BASE, consumer_overrides=overrides)
    with pytest.raises(ValueError, match=r"consumer_overrides|refused"):
        KafkaSharedStreamProducer(KafkaSettings("a:1", ["t"], "g", consumer_overrides=overrides))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="payload_format"):
        KafkaSharedStreamTrigger(**BASE, payload_format="xml")
    with pytest.raises(ValueError, match="match"):
        KafkaSharedStreamTrigger(**BASE, match={"value": 1})
    with pytest.raises(ValueError, match="json"):
        KafkaSharedStreamTrigger(**BASE, match={"json": {"a": 1}})
    with pytest.raises(ValueError, match="topics"):
        KafkaSharedStreamTrigger(**{**BASE, "topics": []})
    assert issubclass(KafkaConfigError, KafkaProducerError)


def message(value: bytes | None, key: bytes | None = None,
            headers: tuple[tuple[str, bytes], ...] = ()) -> KafkaMessage:
    return KafkaMessage("orders", 0, 7, key, value, headers, 1)


def test_decode_and_match() -> None:
    trigger = KafkaSharedStreamTrigger(
        **BASE, payload_format="json",
        match={"key": "eu", "headers": {"src": "web"}, "json": {"order.amount": 5}},
    )
    good = message(b'{"order": {"amount": 5}}', b"eu", (("src", b"web"),))
    assert trigger.matches(trigger.decode(good), good)
    for bad in (message(good.value, b"us", good.headers),
                message(good.value, b"eu", (("src", b"app"),)),
                message(b'{"order": {"amount": 6}}', b"eu", good.headers),
                message(b'{"order": 1}', b"eu", good.headers)):
        assert not trigger.matches(trigger.decode(bad), bad)
    with pytest.raises(ValueError, match="undecodable"):
        trigger.decode(message(b"{nope"))
    packed = KafkaSharedStreamTrigger(**BASE, payload_format="msgpack")
    assert packed.decode(message(msgpack.packb({"a": 1}))) == {"a": 1}
    with pytest.raises(ValueError, match="undecodable"):
        packed.decode(message(b"\xc1"))
    text = KafkaSharedStreamTrigger(**BASE, payload_format="utf-8")
    with pytest.raises(ValueError, match="undecodable"):
        text.decode(message(b"\xff"))


# -- the advance policy, with a recording stand-in for the consumer -----------------------


class FakeConsumer:
    def __init__(self) -> None:
        self.commits: list[int] = []
        self.seeks: list[int] = []

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.extend(offsets.values())

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(offset)


def policy_producer(max_redeliveries: int = 5) -> tuple[KafkaSharedStreamProducer, FakeConsumer]:
    pytest.importorskip("aiokafka")
    producer = KafkaSharedStreamProducer(
        KafkaSettings("a:1", ["t"], "g", max_redeliveries=max_redeliveries)
    )
    consumer = FakeConsumer()
    producer._consumer = consumer
    producer._on_assigned([type("TP", (), {"topic": "t", "partition": 0})()])
    return producer, consumer


CLEAN = AdvanceOutcome(1, 0)
FAILED = AdvanceOutcome(1, 1)
NOBODY = AdvanceOutcome(0, 0)


def batch(producer: KafkaSharedStreamProducer, *items: tuple[int, AdvanceOutcome],
          ) -> Sequence[AdvanceItem]:
    epoch = producer._epoch
    return [AdvanceItem(KafkaPayload("t", 0, offset, epoch, None), outcome)
            for offset, outcome in items]


async def advance(producer: KafkaSharedStreamProducer, items: Sequence[AdvanceItem]) -> None:
    """``advance`` then wait until the commit it asked for (if any) was sent."""
    await producer.advance(items)
    await producer._committer.flush()


async def test_floor_holds_across_batches() -> None:
    producer, consumer = policy_producer()
    await advance(producer, batch(producer, (0, CLEAN), (1, FAILED), (2, CLEAN)))
    assert consumer.commits == [1]
    assert consumer.seeks == [1]
    await advance(producer, batch(producer, (3, CLEAN), (4, CLEAN)))  # a later batch
    assert consumer.commits == [1], "never past the held offset"
    await advance(producer, batch(producer, (1, CLEAN), (2, CLEAN), (3, CLEAN)))
    assert consumer.commits == [1, 4]
    await advance(producer, batch(producer, (4, NOBODY)))  # fanned out to nobody: held
    assert consumer.commits == [1, 4]
    assert consumer.seeks == [1, 4]


async def test_poison_is_discarded_without_dead_letter_topic(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer, consumer = policy_producer(max_redeliveries=1)
    await advance(producer, batch(producer, (0, FAILED), (1, FAILED)))
    await advance(producer, batch(producer, (0, FAILED), (1, CLEAN)))
    assert consumer.commits == [2]
    assert producer.discarded == 1
    assert "no dead_letter_topic" in caplog.text


async def test_unseen_failures_are_not_held_against_a_record() -> None:
    """Collateral failures (subscribers that died on a record of another partition with
    this one still queued) hold the partition but never dead-letter the record."""
    producer, consumer = policy_producer(max_redeliveries=1)
    collateral = outcome_with_unseen(1, 1, 0, unseen=1)
    for _ in range(4):
        await advance(producer, batch(producer, (0, collateral)))
        assert consumer.commits == []  # held, and sought back for redelivery
    assert producer.discarded == 0
    await advance(producer, batch(producer, (0, CLEAN)))
    assert consumer.commits == [1]
    assert consumer.seeks == [0, 0, 0, 0]


async def test_a_record_read_again_is_for_whoever_did_not_ack_it() -> None:
    """Per-watcher redelivery: after a seek back, each record goes to who still needs it."""
    producer, consumer = policy_producer()
    boom, no = Verdict("m", "failed", "RuntimeError: boom"), Verdict("p", "rejected", "no")
    await advance(producer, batch(
        producer,
        (0, CLEAN),
        (1, annotated_outcome(1, 1, 0, verdicts=(boom,), failed_by=("m",))),  # m failed on it
        (2, annotated_outcome(1, 1, 0, unseen=1, failed_by=("m",))),  # fenced off m
        (3, annotated_outcome(1, 0, 1, verdicts=(no,), failed_by=())),  # p must reject it again
        (4, annotated_outcome(2, 0, 0, failed_by=())),  # everyone acked: resolved on reading
        (5, NOBODY),  # went to nobody: whoever is there next time gets it
        (6, FAILED),  # who failed is not known: everyone
    ))
    assert (consumer.commits, consumer.seeks) == ([1], [1])

    def audience(offset: int) -> frozenset[Any] | None:
        return producer.delivery_audience(KafkaPayload("t", 0, offset, producer._epoch, None))

    assert [audience(offset) for offset in range(8)] == [
        None, {"m"}, {"m"}, {"p"}, frozenset(), None, None, None]
    assert audience(1) is None, "an audience is for one reading only"
    await advance(producer, batch(producer, (1, annotated_outcome(1, 1, 0, failed_by=("m",)))))
    assert audience(1) == frozenset({"m"})  # failed again: the next reading is for m again
    await advance(producer, batch(producer, (1, CLEAN), (2, CLEAN)))
    assert not producer._owed, "nothing kept for records resolved"


async def test_stale_epoch_is_ignored() -> None:
    producer, consumer = policy_producer()
    stale = batch(producer, (0, CLEAN))
    producer._on_assigned([type("TP", (), {"topic": "t", "partition": 0})()])
    await advance(producer, stale)
    assert consumer.commits == []


async def test_advance_does_not_wait_for_the_commit() -> None:
    producer, consumer = policy_producer()
    producer._committer.start()
    try:
        await producer.advance(batch(producer, (0, CLEAN), (1, CLEAN)))
        assert consumer.commits == [], "advance returned before any commit was sent"
        assert producer._committer.pending() == {("t", 0): 2}
        await producer._committer.flush()
        assert consumer.commits == [2]
    finally:
        await producer._committer.close()


async def test_a_fatal_commit_error_is_raised_by_the_next_advance() -> None:
    producer, _ = policy_producer()
    committer = producer._committer
    aiokafka_errors: Any = importlib.import_module("aiokafka.errors")

    async def broken(_offsets: dict[Any, int]) -> None:
        raise aiokafka_errors.TopicAuthorizationFailedError  # not retriable

    producer._consumer.commit = broken
    committer.start()
    try:
        await producer.advance(batch(producer, (0, CLEAN)))
        await eventually(lambda: committer.error is not None, what="the commit task to fail")
        with pytest.raises(KafkaCommitError) as caught:
            await producer.advance(batch(producer, (1, CLEAN)))
        assert caught.value.__cause__ is committer.error
    finally:
        await committer.close()


# -- the trigger on a real broker -----------------------------------------------------------


async def test_trigger_decodes_matches_and_rejects(harness: KafkaHarness) -> None:
    stream: Stream = await harness.create_stream()
    manager = SharedStreamManager(ack_timeout=30.0)
    kwargs = harness.trigger_kwargs(stream, payload_format="json")
    big = KafkaSharedStreamTrigger(**kwargs, match={"json": {"kind": "order"},
                                                   "headers": {"src": "web"}})
    everything = KafkaSharedStreamTrigger(**kwargs)
    runners = [SupervisedRunner(manager, big, 1).start(),
               SupervisedRunner(manager, everything, 2).start()]
    try:
        await harness.produce(stream, [json.dumps({"kind": "order", "n": 1}).encode()],
                              headers=[("src", b"web")], key=b"k1")
        await harness.produce(stream, [json.dumps({"kind": "order", "n": 2}).encode()],
                              headers=[("src", b"app")])
        await harness.produce(stream, [b"not json"], headers=[("src", b"web")])
        await eventually(lambda: len(runners[1].events) == 2, what="two decoded events")
        await eventually_async(lambda: harness.committed(stream), 3, what="committed")
        [event] = runners[0].events
        assert event.payload == {
            "value": {"kind": "order", "n": 1}, "topic": stream.name, "partition": 0,
            "offset": 0, "key": b"k1", "headers": [("src", b"web")],
            "timestamp": event.payload["timestamp"],
        }
        letters = await harness.dead_letters(stream)
        assert [(d.value, d.reason) for d in letters] == [(b"not json", "rejected")]
        [record] = await harness.read_all(stream.dead_letter or "")
        assert ("src", b"web") in list(record.headers), "original headers are kept"
    finally:
        for runner in runners:
            await runner.stop()
        await manager.stop_all()


async def test_partitions_are_lanes(harness: KafkaHarness) -> None:
    """A record held on partition 0 does not hold partition 1's commits.

    The producer alone on the real broker, outcomes given by the test: with
    the engine and a single trigger, that trigger's failure on partition 0
    also fails partition 1's records queued behind it in its inbox (see
    docs/kafka.md, Limits), so whether partition 1 gets ahead would depend
    on the order records are fetched in.
    """
    name = f"two-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=None, group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=2)
    await harness.produce(stream, [b"p0-held", b"p0-after"], partition=0)
    await harness.produce(stream, [b"p1-a", b"p1-b"], partition=1)
    producer = KafkaSharedStreamProducer(KafkaSettings(
        harness.bootstrap, [name], stream.group, max_redeliveries=1000,
        consumer_overrides=dict(GROUP_SETTINGS)))
    records = cast(AsyncGenerator[tuple[Any, Any], None], producer.open_stream())
    held = {b"p0-held"}  # fails every time it is delivered, until the test fixes it

    async def consume() -> None:
        async for message, payload in records:
            outcome = FAILED if message.value in held else CLEAN
            await producer.advance([AdvanceItem(payload, outcome)])

    consumer = asyncio.create_task(consume())
    try:
        await eventually_async(lambda: harness.committed(stream, 1), 2, within=30,
                               what="partition 1")
        assert await harness.committed(stream, 0) == 0, "nothing passes the held record"
        held.clear()
        await eventually_async(lambda: harness.committed(stream, 0), 2, within=30,
                               what="partition 0")
    finally:
        consumer.cancel()
        await asyncio.wait([consumer])
        await records.aclose()
        await producer.aclose()


async def test_unreachable_broker_fails_the_group_with_a_wrapped_error() -> None:
    pytest.importorskip("aiokafka")
    settings = KafkaSettings("127.0.0.1:1", ["t"], "g", retries=1, retry_backoff=0.01,
                             consumer_overrides=dict(GROUP_SETTINGS))
    producer = KafkaSharedStreamProducer(settings)
    stream = producer.open_stream()
    with pytest.raises(KafkaProducerError) as caught:
        await anext(stream)
    assert caught.value.__cause__ is not None
    await producer.aclose()
    await producer.aclose()  # once only


async def drain(records: AsyncIterator[Any]) -> None:
    async with asyncio.timeout(10):  # bounded: without the check the stream never ends
        async for _ in records:
            pass


class RefusedCommits(KafkaSharedStreamProducer):
    """The real producer on a real broker, whose commits fail for good."""

    async def _commit_offsets(self, targets: dict[tuple[str, int], int]) -> bool:
        raise KafkaCommitError(f"committing {targets} failed: refused for good")


async def test_a_fatal_commit_error_ends_the_stream(harness: KafkaHarness) -> None:
    """The generator raises it too, so the group ends even if nothing more is advanced."""
    stream = await harness.create_stream(dead_letter=False)
    await harness.produce(stream, [b"a", b"b"])
    producer = RefusedCommits(KafkaSettings(harness.bootstrap, [stream.name], stream.group,
                                            consumer_overrides=dict(GROUP_SETTINGS)))
    records = cast(AsyncGenerator[tuple[Any, Any], None], producer.open_stream())
    try:
        _, payload = await anext(records)
        await producer.advance([AdvanceItem(payload, CLEAN)])  # returns: commits are async
        await eventually(lambda: producer._committer.error is not None,
                         what="the commit task to fail")
        with pytest.raises(KafkaCommitError) as caught:
            await drain(records)  # "b" may come first; the next fetch raises
        assert caught.value.__cause__ is producer._committer.error
    finally:
        await records.aclose()
        await producer.aclose()


def test_a_record_is_decoded_once_for_all_its_filters() -> None:
    calls: list[bytes] = []

    def counting_loads(raw: bytes) -> Any:
        calls.append(raw)
        return json.loads(raw)

    message = KafkaMessage("orders", 0, 1, None, b'{"kind": "order"}', (), 1)
    first = message.decoded("json", counting_loads)
    assert message.decoded("json", counting_loads) is first  # a second filter: cache hit
    assert len(calls) == 1
    broken = KafkaMessage("orders", 0, 2, None, b"{nope", (), 1)
    for _ in range(2):  # the failure is remembered and raised to every filter
        with pytest.raises(ValueError, match="undecodable json value"):
            broken.decoded("json", counting_loads)
    assert len(calls) == 2


def test_prefilter_declines_exactly_what_the_filter_ignores() -> None:
    trigger = KafkaSharedStreamTrigger(
        **BASE, payload_format="json",
        match={"key": "eu", "headers": {"src": "web"}, "json": {"order.amount": 5}},
    )
    accept = trigger.shared_stream_prefilter()
    assert accept is not None
    good = message(b'{"order": {"amount": 5}}', b"eu", (("src", b"web"),))
    assert accept(good)
    for ignored in (message(good.value, b"us", good.headers),
                    message(b'{"order": {"amount": 6}}', b"eu", good.headers),
                    message(None, b"eu", good.headers)):
        assert not accept(ignored)
    assert accept(message(b"{nope", b"eu", good.headers))  # undecodable: the filter rejects it


def test_no_prefilter_when_it_could_not_be_exact_or_would_not_help() -> None:
    class OwnFilter(KafkaSharedStreamTrigger):
        async def filter_shared_stream(
            self, shared_stream: AsyncIterator[Any]
        ) -> AsyncIterator[TriggerEvent]:
            async for raw in shared_stream:  # sees every record, whatever match says
                yield TriggerEvent({"offset": raw.offset})

    class OwnMatch(KafkaSharedStreamTrigger):
        def matches(self, value: Any, message: KafkaMessage) -> bool:
            return message.offset % 2 == 0

    assert OwnFilter(**BASE, match={"key": "eu"}).shared_stream_prefilter() is None
    assert KafkaSharedStreamTrigger(**BASE).shared_stream_prefilter() is None  # matches all
    accept = OwnMatch(**BASE).shared_stream_prefilter()
    assert accept is not None
    assert not accept(message(b"x"))  # offset 7


_KEYS = st.sampled_from([None, b"eu", b"us", b"\xff"])
_HEADERS = st.lists(st.tuples(st.sampled_from(["src", "kind"]),
                              st.sampled_from([b"web", b"app", b"\xff"])), max_size=3)
_VALUES = st.sampled_from([None, b"{nope", b'{"a": 1}', b'{"a": 2, "b": {"c": "x"}}',
                           b'{"b": {"c": "y"}}', b"[1, 2]", b'"text"'])
_MATCHES = st.fixed_dictionaries({}, optional={
    "key": st.sampled_from(["eu", "us"]),
    "headers": st.dictionaries(st.sampled_from(["src", "kind"]), st.sampled_from(["web", "app"]),
                               max_size=2),
    "json": st.dictionaries(st.sampled_from(["a", "b.c", "b"]), st.sampled_from([1, 2, "x"]),
                            max_size=2),
})


@given(matches=st.lists(_MATCHES, min_size=1, max_size=4),
       records=st.lists(st.tuples(_KEYS, _HEADERS, _VALUES), min_size=1, max_size=6))
def test_shared_prefilters_agree_with_decode_and_match(
    matches: list[dict[str, Any]], records: list[tuple[Any, Any, Any]]
) -> None:
    """Watchers of one stream share selections; each still decides exactly as its filter."""
    triggers = [KafkaSharedStreamTrigger(**BASE, payload_format="json", match=m) for m in matches]
    for key, headers, value in records:
        record = partial(KafkaMessage, "orders", 0, 7, key, value, tuple(headers), 1)
        assert_prefilters_agree(triggers, record, (key, headers, value))


_VOUCHED = [
    ("json", b'{"id": 1, "tags": ["a", {"b": null}], "x": 1.5}', (), True),
    ("json", b'{"big": 123456789012345678901234567890}', (), True),  # caught by the packer
    ("json", b"[" * 97 + b"]" * 97, (), False),  # too many brackets to vouch for
    ("json", b'{"a": 1}', (("src", b"web"),), False),  # headers are tuples
    ("utf-8", b"caf\xc3\xa9", (), True),
    ("bytes", b"\x00\x01", (), True),
    ("bytes", None, (), True),
    ("msgpack", msgpack.packb({"a": 1}), (), False),  # may hold ext types
]


@pytest.mark.parametrize(("payload_format", "value", "headers", "vouched"), _VOUCHED)
async def test_the_trigger_vouches_only_for_payloads_it_knows_are_native(
    payload_format: str, value: bytes | None, headers: tuple[tuple[str, bytes], ...],
    vouched: bool,
) -> None:
    """A vouched payload packs to the same bytes as the checked way, and round-trips."""
    trigger = KafkaSharedStreamTrigger(**BASE, payload_format=payload_format)

    async def records() -> AsyncIterator[KafkaMessage]:
        yield message(value, b"k", headers)

    events = [event async for event in trigger.filter_shared_stream(records())]
    assert len(events) == 1
    (event,) = events
    assert trigger.payload_is_native(event) is vouched
    assert not trigger.payload_is_native(TriggerEvent(event.payload))  # only what it built
    packed = pack_event_payload(event.payload, native=vouched)
    assert packed == pack_kwargs({"payload": event.payload})
    assert unpack_kwargs(packed) == {"payload": event.payload}


async def test_subclasses_that_build_their_own_payloads_are_not_vouched_for() -> None:
    class OwnPayload(KafkaSharedStreamTrigger):
        def to_payload(self, value: Any, message: KafkaMessage) -> dict[str, Any]:
            return {"value": value, "when": (message.timestamp,)}

    class OwnDecode(KafkaSharedStreamTrigger):
        def decode(self, message: KafkaMessage) -> Any:
            return bytearray(message.value or b"")

    for trigger in (OwnPayload(**BASE, payload_format="json"), OwnDecode(**BASE)):
        async def records() -> AsyncIterator[KafkaMessage]:
            yield message(b"{}")

        events = [event async for event in trigger.filter_shared_stream(records())]
        assert not trigger.payload_is_native(events[0])
