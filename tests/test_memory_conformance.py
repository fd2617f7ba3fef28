"""The producer conformance suite against the testing kit's in-memory reference producer.

Both acknowledgement modes: ``cumulative`` (Kafka-like, every feature) and
``per-message`` (SQS-like: no cumulative lanes, no kept order). A broker
package's own conformance module looks like this one with its harness; the
tests after the suite check what only the memory module adds (leases, source
claims).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sharedstream.testing.conformance import ProducerConformance, Session, values
from sharedstream.testing.memory import (
    MemoryConfigError,
    MemorySettings,
    MemorySharedStreamProducer,
)
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.memory_harness import MemoryHarness
from sharedstream.testing.runner import eventually_async
from sharedstream.testing.scripts import Script


class TestMemoryConformance(ProducerConformance):
    """The shared producer conformance suite against the in-memory broker."""


@pytest.fixture(params=["cumulative", "per-message"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[MemoryHarness]:
    harness = MemoryHarness(acks=request.param)
    try:
        yield harness
    finally:
        await harness.close()


# -- what only the memory broker module adds: leases and source claims ----------------------


def test_a_lapsed_lease_makes_the_record_visible_again() -> None:
    """Per-message reading: a lease not renewed in time frees the record; a stale one is inert."""
    now = [0.0]
    broker = MemoryBroker("leases", clock=lambda: now[0])
    broker.produce("s", [b"a"])
    first = broker.receive("s", lease=5.0)
    assert first is not None
    assert broker.receive("s", lease=5.0) is None  # leased out
    assert broker.renew([first], lease=5.0) == [first]
    now[0] = 9.0  # renewed at 0: expires at 5
    second = broker.receive("s", lease=5.0)
    assert second is not None
    assert (second.record, second.receipt) == (first.record, 2)
    assert broker.renew([first], lease=5.0) == []  # the first receipt is stale
    broker.release(first)  # ignored: the record stays leased under the second
    assert broker.receive("s", lease=5.0) is None
    broker.delete(second)
    now[0] = 100.0
    assert broker.receive("s", lease=5.0) is None
    assert broker.settled("s") == 1


async def test_leases_are_renewed_while_a_filter_works() -> None:
    """A record outlasting its lease in a slow filter is renewed, not delivered twice."""
    harness = MemoryHarness(acks="per-message")
    stream = await harness.create_stream()
    session = Session(harness, stream)
    try:
        slow = session.run(Script(delay=0.7), lease=0.6)
        await harness.produce(stream, values(2))
        await eventually_async(lambda: harness.committed(stream), 2, within=5, what="committed")
        await asyncio.sleep(0.8)  # a copy redelivered by a lapsed lease would be filtered by now
        assert slow.values() == values(2)
    finally:
        await session.close()
        await harness.close()


async def test_a_stream_is_consumed_with_one_set_of_settings() -> None:
    """A second producer of a stream with other settings is refused until the first closes."""
    broker_name = "claims"
    MemoryBroker.named(broker_name).produce("s", [b"a"])
    first = MemorySharedStreamProducer(MemorySettings(stream="s", broker=broker_name))
    other = MemorySettings(stream="s", broker=broker_name, max_in_flight=7)
    records = first.open_stream()
    try:
        record, _ = await anext(records)
        assert record.value == b"a"
        with pytest.raises(MemoryConfigError, match="already consumed"):
            await anext(MemorySharedStreamProducer(other).open_stream())
    finally:
        await records.aclose()
        await first.aclose()
    second = MemorySharedStreamProducer(other)
    records = second.open_stream()
    try:
        record, _ = await anext(records)
        assert record.value == b"a"  # nothing was committed: it comes again
    finally:
        await records.aclose()
        await second.aclose()
        MemoryBroker.forget(broker_name)
