"""SQS producer and trigger: the conformance suite on moto, plus SQS-specific tests."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharedstream import AdvanceItem, AdvanceOutcome, TriggerEvent
from sharedstream.engine.producer import outcome_with_unseen
from sharedstream.producers.sqs import (
    SqsConfigError,
    SqsMessage,
    SqsPayload,
    SqsSettings,
    SqsSharedStreamProducer,
)
from sharedstream.testing.conformance import ProducerConformance, Session, values
from sharedstream.testing.conformance import unique_ids as _ids
from sharedstream.testing.harness import Stream, opened
from sharedstream.testing.runner import SupervisedRunner, eventually, eventually_async
from sharedstream.testing.scripts import Script
from sharedstream.triggers.sqs import SqsSharedStreamTrigger
from tests.prefilters import assert_prefilters_agree
from tests.sqs.conftest import ConformanceSqsTrigger, SqsHarness
from tests.traced import assert_continues, traced_process_span


class TestSqsConformance(ProducerConformance):
    """The shared producer conformance suite against moto (standard and FIFO queues)."""


# -- SQS specifics, on moto ---------------------------------------------------------------


class SlowTrigger(ConformanceSqsTrigger):
    """Holds each message ``hold`` seconds before emitting it (a slow but alive filter)."""

    def __init__(self, *, hold: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold = hold

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "hold": self.hold}

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[
        TriggerEvent
    ]:
        async for message in shared_stream:
            await asyncio.sleep(self.hold)
            yield TriggerEvent(self.to_payload(message.body.encode(), message))


@pytest.fixture
async def standard(sqs_endpoint: str) -> AsyncIterator[SqsHarness]:
    async with opened(SqsHarness(sqs_endpoint, fifo=False)) as harness:
        yield harness


@pytest.fixture
async def fifo(sqs_endpoint: str) -> AsyncIterator[SqsHarness]:
    async with opened(SqsHarness(sqs_endpoint, fifo=True)) as harness:
        yield harness


def producer_of(stream: Stream) -> SqsSharedStreamProducer:
    producer = ConformanceSqsTrigger.last[stream.name.rsplit("/", 1)[-1]]
    assert isinstance(producer, SqsSharedStreamProducer)
    return producer


async def test_deletes_are_batched(standard: SqsHarness) -> None:
    stream = await standard.create_stream()
    await standard.produce(stream, values(60))  # there before the receiver starts
    session = Session(standard, stream)
    try:
        first, second = session.run(), session.run()
        await eventually_async(lambda: standard.committed(stream), 60, what="all deleted")
        # Standard queues deliver at least once (moto may hand one message to two
        # concurrent receives): each trigger saw every message, the store dedups by id.
        assert set(first.values()) == set(second.values()) == set(values(60))
        calls = producer_of(stream).calls
        # 60 messages in receive batches of up to 10: a handful of delete calls, never 60.
        assert 6 <= calls["DeleteMessageBatch"] <= 12, calls
        assert calls["DeleteMessage"] == 0
    finally:
        await session.close()


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_visibility_is_renewed_for_a_slow_subscriber(standard: SqsHarness) -> None:
    stream = await standard.create_stream()
    session = Session(standard, stream)
    try:
        slow = SlowTrigger(hold=5.0, script="slow", **standard.trigger_kwargs(
            stream, visibility_timeout=2))
        session.runners.append(SupervisedRunner(session.manager, slow, next(_ids)).start())
        await standard.produce(stream, [b"slow"])
        await eventually_async(lambda: standard.counts(stream.name), (0, 1, 0),
                               what="received (in flight)")
        await asyncio.sleep(3.5)  # past the 2 s visibility the message was received with
        assert await standard.counts(stream.name) == (0, 1, 0), "still hidden: renewed"
        await eventually_async(lambda: standard.committed(stream), 1, what="deleted")
        runner = session.runners[0]
        assert [e.payload["receive_count"] for e in runner.events] == [1], "received once"
        assert producer_of(stream).calls["ChangeMessageVisibilityBatch"] >= 1
    finally:
        await session.close()


async def test_failure_is_redelivered_with_a_higher_receive_count(standard: SqsHarness) -> None:
    stream = await standard.create_stream()
    session = Session(standard, stream)
    try:
        healthy = session.run()  # keeps the group (and its receiver) alive
        flaky = session.run(Script(fail={b"m0": 1}))
        await standard.produce(stream, values(1))
        await eventually_async(lambda: standard.committed(stream), 1, what="deleted")
        assert [e.payload["receive_count"] for e in flaky.events] == [2]
        assert [e.payload["receive_count"] for e in healthy.events] == [1, 2]
        # Shown again at once (failure_visibility 0), not after the 5 s visibility lapsed.
        assert producer_of(stream).calls["ChangeMessageVisibilityBatch"] == 1
    finally:
        await session.close()


async def test_fifo_groups_keep_their_order_through_a_failure(fifo: SqsHarness) -> None:
    stream = await fifo.create_stream()
    session = Session(fifo, stream)
    try:
        flaky = session.run(Script(fail={b"a1": 1}))
        healthy = session.run()
        for group in "abc":
            await fifo.produce(stream, [f"{group}{i}".encode() for i in range(3)], group=group)
        await eventually_async(lambda: fifo.committed(stream), 9, what="everything deleted")
        for seen in (flaky.values(), healthy.values()):
            for group in "abc":
                mine = [v for v in seen if v.startswith(group.encode())]
                expected = [f"{group}{i}".encode() for i in range(3)]
                # In order; a redelivery repeats a suffix of the group, in order again.
                assert mine[:3] == expected, (group, mine)
                assert mine[3:] == expected[len(expected) - len(mine[3:]):], (group, mine)
        assert [v for v in flaky.values() if v.startswith(b"a")] == [b"a0", b"a1", b"a2"]
    finally:
        await session.close()


async def test_disagreeing_settings_on_one_queue_are_refused(standard: SqsHarness) -> None:
    stream = await standard.create_stream(dead_letter=False)
    first = SqsSharedStreamProducer(SqsSharedStreamTrigger(
        **standard.trigger_kwargs(stream)).settings())
    other = SqsSharedStreamProducer(SqsSharedStreamTrigger(
        **standard.trigger_kwargs(stream, visibility_timeout=60)).settings())
    polling = asyncio.ensure_future(anext(first.open_stream()))
    try:
        await eventually(lambda: first.calls["ReceiveMessage"] > 0, what="first receiving")
        with pytest.raises(SqsConfigError, match="already consumed in this process"):
            await anext(other.open_stream())
    finally:
        polling.cancel()
        await asyncio.wait([polling])
        await first.aclose()
        await other.aclose()


async def test_missing_queue_is_a_clear_error(standard: SqsHarness) -> None:
    producer = SqsSharedStreamProducer(SqsSharedStreamTrigger(
        **{**standard.trigger_kwargs(Stream("no-such-queue", None, "")), "queue": "nope"}
    ).settings())
    try:
        with pytest.raises(SqsConfigError, match="does not exist"):
            await anext(producer.open_stream())
    finally:
        await producer.aclose()


# -- the trigger, without a broker --------------------------------------------------------

BASE: dict[str, Any] = {"queue": "https://sqs.eu-west-1.amazonaws.com/1234/orders",
                        "region_name": "eu-west-1"}


def test_key_holds_consumer_settings_not_filter_settings() -> None:
    plain = SqsSharedStreamTrigger(**BASE)
    by_name = SqsSharedStreamTrigger(**{**BASE, "queue": "orders"}, payload_format="json",
                                     match={"json": {"kind": "x"}})
    assert plain.shared_stream_key() == by_name.shared_stream_key()
    for change in ({"queue": "refunds"}, {"region_name": "us-east-1"},
                   {"endpoint_url": "http://127.0.0.1:1"}, {"visibility_timeout": 60},
                   {"dead_letter_queue": "dlq"}, {"max_redeliveries": 1},
                   {"receive_concurrency": 1}, {"credentials": {"aws_access_key_id": "a"}}):
        other = SqsSharedStreamTrigger(**{**BASE, **change})
        assert other.shared_stream_key() != plain.shared_stream_key(), change


def test_key_does_not_leak_secrets() -> None:
    trigger = SqsSharedStreamTrigger(**BASE, credentials={
        "aws_access_key_id": "AKIA", "aws_secret_access_key": "hunter2"})
    assert "hunter2" not in repr(trigger.shared_stream_key())


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"payload_format": "xml"}, "payload_format must be one of"),
    ({"match": {"key": "x"}}, "unknown match fields"),
    ({"match": {"json": {"a": 1}}}, "needs payload_format 'json' or 'msgpack'"),
    ({"visibility_timeout": 0}, "visibility_timeout must be within"),
    ({"max_messages": 11}, "max_messages must be within 1..10"),
    ({"wait_time_seconds": 21}, "wait_time_seconds must be within 0..20"),
    ({"dead_letter_queue": "orders"}, "must not be the consumed queue"),
    ({"credentials": {"password": "x"}}, "unknown credential fields"),
    # The client does not validate requests itself: types are checked here.
    ({"visibility_timeout": 30.5}, "visibility_timeout must be an int, got float"),
    ({"wait_time_seconds": True}, "wait_time_seconds must be an int, got bool"),
    ({"max_in_flight": "500"}, "max_in_flight must be an int, got str"),
    ({"region_name": 1}, "region_name must be a str, got int"),
])
def test_bad_settings_are_refused_with_the_reason(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SqsSharedStreamTrigger(**{**BASE, **kwargs})


def test_serialize_round_trips() -> None:
    trigger = SqsSharedStreamTrigger(**BASE, payload_format="json", match={"json": {"a": 1}},
                                     dead_letter_queue="dlq", visibility_timeout=45)
    classpath, kwargs = trigger.serialize()
    assert classpath == "sharedstream.triggers.sqs.SqsSharedStreamTrigger"
    again = SqsSharedStreamTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert again.shared_stream_key() == trigger.shared_stream_key()


def sqs_message(body: str, **attributes: str) -> SqsMessage:
    return SqsMessage("https://sqs/1234/orders", {
        "MessageId": "id-1", "ReceiptHandle": "h", "Body": body,
        "Attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1700000000000"},
        "MessageAttributes": {k: {"DataType": "String", "StringValue": v}
                              for k, v in attributes.items()},
    })


async def filtered(trigger: SqsSharedStreamTrigger, messages: list[SqsMessage]) -> tuple[
    list[TriggerEvent], int
]:
    """Run ``trigger``'s filter over ``messages``; its events and how many it rejected."""
    rejected = 0

    async def stream() -> AsyncIterator[SqsMessage]:
        for message in messages:
            yield message

    events: list[TriggerEvent] = []
    with pytest.MonkeyPatch.context() as patch:
        def count_reject(_reason: str | None = None) -> None:
            nonlocal rejected
            rejected += 1
        patch.setattr("sharedstream.brokerkit.trigger.reject_shared_stream_event", count_reject)
        events = [event async for event in trigger.filter_shared_stream(stream())]
    return events, rejected


async def test_filter_decodes_matches_and_rejects() -> None:
    trigger = SqsSharedStreamTrigger(**BASE, payload_format="json", match={
        "attributes": {"region": "eu"}, "json": {"order.kind": "big"}})
    messages = [
        sqs_message('{"order": {"kind": "big"}}', region="eu"),
        sqs_message('{"order": {"kind": "big"}}', region="us"),
        sqs_message('{"order": {"kind": "small"}}', region="eu"),
        sqs_message("{not json", region="eu"),
    ]
    events, rejected = await filtered(trigger, messages)
    assert rejected == 1
    assert [e.payload for e in events] == [{
        "value": {"order": {"kind": "big"}}, "message_id": "id-1",
        "attributes": {"region": "eu"}, "receive_count": 3, "group_id": None,
        "sent_timestamp": 1700000000000,
    }]


async def test_msgpack_bodies_are_base64_and_decoded_once_for_all_filters() -> None:
    body = base64.b64encode(msgpack.packb({"n": 1})).decode()
    message = sqs_message(body)
    first = SqsSharedStreamTrigger(**BASE, payload_format="msgpack")
    second = SqsSharedStreamTrigger(**BASE, payload_format="msgpack", match={"json": {"n": 1}})
    assert first.decode(message) == {"n": 1}
    assert second.decode(message) is first.decode(message)  # one decode, shared
    events, rejected = await filtered(second, [message, sqs_message("%%%")])
    assert (len(events), rejected) == (1, 1)


async def test_prefilter_declines_exactly_what_the_filter_ignores() -> None:
    trigger = SqsSharedStreamTrigger(**BASE, payload_format="json", match={
        "attributes": {"region": "eu"}, "json": {"order.kind": "big"}})
    accept = trigger.shared_stream_prefilter()
    assert accept is not None
    for body, region in (('{"order": {"kind": "big"}}', "eu"), ('{"order": {"kind": "big"}}', "us"),
                         ('{"order": {"kind": "small"}}', "eu"), ("{not json", "eu"),
                         ('"order"', "eu")):
        message = sqs_message(body, region=region)
        events, rejected = await filtered(trigger, [message])
        assert accept(message) == bool(events or rejected), (body, region)
    assert SqsSharedStreamTrigger(**BASE).shared_stream_prefilter() is None  # matches all


_ATTRIBUTE_VALUES = st.sampled_from([{"StringValue": "eu"}, {"StringValue": "us"},
                                     {"BinaryValue": b"eu"}, {"BinaryValue": b"\xff"}])
_SQS_MATCHES = st.fixed_dictionaries({}, optional={
    "attributes": st.dictionaries(st.sampled_from(["region", "kind"]),
                                  st.sampled_from(["eu", "us", b"eu"]), max_size=2),
    "json": st.dictionaries(st.sampled_from(["a", "b.c"]), st.sampled_from([1, "x"]), max_size=2),
})


@given(matches=st.lists(_SQS_MATCHES, min_size=1, max_size=4),
       bodies=st.lists(st.tuples(
           st.sampled_from(["{nope", '{"a": 1}', '{"a": 1, "b": {"c": "x"}}', "[1]", '"t"']),
           st.dictionaries(st.sampled_from(["region", "kind"]), _ATTRIBUTE_VALUES, max_size=2)),
           min_size=1, max_size=6))
def test_shared_prefilters_agree_with_decode_and_match(
    matches: list[dict[str, Any]], bodies: list[tuple[str, dict[str, Any]]]
) -> None:
    """Watchers of one queue share a selection; each still decides exactly as its filter."""
    triggers = [SqsSharedStreamTrigger(**BASE, payload_format="json", match=m) for m in matches]
    for body, attributes in bodies:
        assert_prefilters_agree(triggers, partial(_attributed, body, attributes),
                                (body, attributes))


def _attributed(body: str, attributes: dict[str, Any]) -> SqsMessage:
    return SqsMessage("orders", {"MessageId": "m", "Body": body, "MessageAttributes": {
        name: {"DataType": "Binary" if "BinaryValue" in v else "String", **v}
        for name, v in attributes.items()}})


def test_only_a_message_s_own_failures_count_toward_max_redeliveries() -> None:
    """A failure counts only when it was the message's own (not of subscribers that died on
    another message while it was queued for them), and only the failures this process saw:
    a receive count says nothing of why the earlier receives ended (a killed triggerer's
    receives count too; a message received too often is judged on arrival, by the store)."""
    message = sqs_message("{}")  # ApproximateReceiveCount 3: one past max_redeliveries
    payload = SqsPayload(message.message_id, "h", ("receive", 1), message)
    producer = SqsSharedStreamProducer(SqsSettings(queue="orders", max_redeliveries=2))

    def sort(outcome: AdvanceOutcome) -> tuple[Any, ...]:
        return producer._sort([AdvanceItem(payload, outcome)])

    assert sort(outcome_with_unseen(1, 1, 0, unseen=1)) == ([], [payload], [], [])  # collateral
    assert sort(AdvanceOutcome(1, 1, 0)) == ([], [payload], [], [])  # its own: 1
    assert sort(AdvanceOutcome(1, 1, 0)) == ([], [payload], [], [])  # 2
    assert sort(AdvanceOutcome(1, 1, 0)) == ([], [], [], [(payload, "max_redeliveries", ())])


def test_dead_letter_batches_keep_within_send_message_batch_limits() -> None:
    """Ten entries and 1 MiB at most per call; a big entry alone still gets its own call."""
    from sharedstream.producers.sqs import MAX_BATCH_BYTES, _sized_chunks  # noqa: PLC0415

    def entry(size: int) -> dict[str, Any]:
        return {"Id": "x", "MessageBody": "b" * size, "MessageAttributes": {
            "sharedstream.reason": {"DataType": "String", "StringValue": "rejected"}}}

    pairs = [(n, entry(600_000)) for n in range(3)] + [(n, entry(10)) for n in range(3, 25)]
    chunks = _sized_chunks(pairs)
    assert [item for chunk in chunks for item, _ in chunk] == list(range(25))  # order kept
    assert all(len(chunk) <= 10 for chunk in chunks)
    assert [len(chunk) for chunk in chunks][:2] == [1, 1]  # two 600 KB copies never share
    sizes = [sum(len(e["MessageBody"]) for _, e in chunk) for chunk in chunks]
    assert all(size <= MAX_BATCH_BYTES for size in sizes)
    assert _sized_chunks([(0, entry(2_000_000))]) == [[(0, entry(2_000_000))]]


async def test_a_message_s_trace_context_is_continued(standard: SqsHarness) -> None:
    """``traceparent`` as a message attribute: the ``process`` span continues its trace."""
    stream = await standard.create_stream()
    process, spans = await traced_process_span(standard, stream, lambda traceparent: (
        standard.produce(stream, values(1), attributes={"traceparent": traceparent})))
    assert_continues(process, "aws_sqs")
    queue = stream.name.rsplit("/", 1)[1]
    assert {s.name for s in spans} == {f"process {queue}", f"fan-out {queue}", "filter",
                                       f"settle {queue}"}
