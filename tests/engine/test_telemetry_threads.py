"""The metric callbacks are read-only and safe on an SDK reader's own thread.

OpenTelemetry SDK readers (``PeriodicExportingMetricReader``) run the
observable-gauge callbacks from their own thread while the event loop fans
out and resolves. Here a thread collects through the real SDK
(``InMemoryMetricReader.get_metrics_data``) in a tight loop, with a tiny GIL
switch interval so it interleaves with the loop as often as possible, while
a group fans out thousands of raw events over many lanes to many
subscribers. Nothing a callback does may raise (the SDK would log it and
drop the measurement), change what is resolved or advanced, or report an
implausible value.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData

from sharedstream import AdvanceOutcome, SharedStreamManager
from sharedstream.engine.names import stream_name
from tests.engine.conftest import FakeClock
from tests.engine.harness import Feed, FeedTrigger, Runner, eventually

EVENTS = 4000
LANES = 32
SUBSCRIBERS = 12
HELD = 3  # subscribers whose events a slow "store" confirms in batches
STREAM = stream_name(("feed", "f"))  # the OpenTelemetry attribute: the stream's name
GAUGES = (
    "sharedstream.engine.events.outstanding",
    "sharedstream.engine.events.head_of_line_age",
    "sharedstream.subscriber.lag",
    "sharedstream.lane.outstanding",
)


@dataclass
class Sample:
    """What one collection reported for the test's stream: (gauge, attributes, value)."""

    points: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    clock: float = 0.0  # the injected clock right after the collection


class Collector(threading.Thread):
    """Collects from the SDK reader in a loop, from its own thread, until stopped."""

    def __init__(self, reader: InMemoryMetricReader, clock: FakeClock) -> None:
        super().__init__(name="metric-collector", daemon=True)
        self.reader, self.clock = reader, clock
        self.stopping = threading.Event()
        self.samples: list[Sample] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                data = self.reader.get_metrics_data()
            except Exception as exc:  # noqa: BLE001 - the test asserts there is none
                self.errors.append(exc)
                continue
            self.samples.append(Sample(ours(data), self.clock.now))

    def __enter__(self) -> Collector:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self.join(timeout=10)


def ours(data: MetricsData | None) -> list[tuple[str, dict[str, Any], float]]:
    found: list[tuple[str, dict[str, Any], float]] = []
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in GAUGES:
                    continue
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if attributes.get("stream") == STREAM:
                        found.append((metric.name, attributes, float(getattr(point, "value", 0))))
    return found


class SdkComplaints(logging.Handler):
    """Every warning the SDK logs (a failing callback is logged, not raised)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def sdk_complaints() -> Iterator[SdkComplaints]:
    handler = SdkComplaints()
    logger = logging.getLogger("opentelemetry")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads every 50 us: the collector lands inside the loop's mutations often."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@dataclass
class Result:
    by_lane: dict[int, list[tuple[int, AdvanceOutcome]]]
    emitted: list[int]


async def fan_out_and_resolve(feed: Feed, clock: FakeClock) -> Result:
    """Many raw events, lanes and subscribers; some reject, some confirm late, in batches."""
    feed.lane_of = lambda payload: payload % LANES
    manager = SharedStreamManager(max_subscriber_queue=EVENTS + 1, clock=clock)
    runners = [
        Runner(manager, FeedTrigger("f", f"t{i}", rejects=[i, i + 500] if i % 4 == 1 else []), i,
               auto_confirm=i >= HELD).start()
        for i in range(SUBSCRIBERS)
    ]
    feed.push(*range(EVENTS))

    async def slow_store() -> None:
        while True:
            for _ in range(5):
                await asyncio.sleep(0)
            for runner in runners[:HELD]:
                runner.confirm_all()
            clock.advance(0.01)

    store = asyncio.get_running_loop().create_task(slow_store())
    await eventually(lambda: len(feed.advanced()) == EVENTS, within=30)
    store.cancel()
    await asyncio.wait([store])
    by_lane: dict[int, list[tuple[int, AdvanceOutcome]]] = {}
    for payload, outcome in feed.advanced():
        by_lane.setdefault(payload % LANES, []).append((payload, outcome))
    result = Result(by_lane, [len(runner.events) for runner in runners])
    assert all(runner.failure() is None for runner in runners)
    await manager.stop_all()
    return result


@pytest.mark.usefixtures("busy_switching")
async def test_collecting_from_another_thread_under_load_is_safe_and_changes_nothing(
    feed: Feed, clock: FakeClock, metric_reader: InMemoryMetricReader,
    sdk_complaints: SdkComplaints,
) -> None:
    started_at = clock.now
    quiet = await fan_out_and_resolve(feed, clock)
    feed.batches.clear()
    with Collector(metric_reader, clock) as collector:
        watched = await fan_out_and_resolve(feed, clock)
    elapsed = clock.now - started_at

    # Collecting changed nothing: the same outcomes, each lane in fan-out order.
    assert watched == quiet
    for lane, advanced in watched.by_lane.items():
        assert [payload for payload, _ in advanced] == list(range(lane, EVENTS, LANES))

    # No callback raised (the SDK logs and swallows it), nothing else failed.
    assert collector.errors == []
    assert [record.getMessage() for record in sdk_complaints.records] == []

    # It really ran alongside: many collections saw the stream mid-flight.
    busy = [sample for sample in collector.samples if sample.points]
    assert len(busy) >= 5, f"only {len(busy)} of {len(collector.samples)} collections overlapped"
    outstanding = [value for sample in busy for name, _, value in sample.points
                   if name == "sharedstream.engine.events.outstanding"]
    assert max(outstanding) > 0

    # Plausible values: counts within what was fanned out; ages on the injected clock.
    for sample in busy:
        for name, attributes, value in sample.points:
            if name == "sharedstream.engine.events.head_of_line_age":
                assert 0 <= value <= elapsed, (value, elapsed)
            else:
                assert 0 <= value <= EVENTS, (name, value)
                assert value == int(value)
            if name == "sharedstream.lane.outstanding":
                assert attributes["lane"] in {repr(lane) for lane in range(LANES)}
            if name == "sharedstream.subscriber.lag":
                assert attributes["trigger"] in {str(i) for i in range(SUBSCRIBERS)}


async def test_collecting_does_not_touch_the_books(
    feed: Feed, clock: FakeClock, metric_reader: InMemoryMetricReader
) -> None:
    """A paused group reads the same before and after hundreds of collections."""
    feed.lane_of = lambda payload: payload % 4
    manager = SharedStreamManager(clock=clock)
    held = Runner(manager, FeedTrigger("f", "held"), 1, auto_confirm=False).start()
    quick = Runner(manager, FeedTrigger("f", "quick"), 2).start()
    feed.push(*range(40))
    await eventually(lambda: len(held.events) == 40 and len(quick.events) == 40)
    held.confirm_all()  # the head records resolve; the last window stays open
    held.gate = asyncio.Event()
    feed.push(40, 41)
    await eventually(lambda: len(held.events) == 41 and len(feed.advanced()) == 40)
    clock.advance(7.0)
    [group] = manager._groups.values()  # the state under test
    book = group.book
    assert book is not None

    def state() -> Any:
        subs = {
            trigger_id: (sub.current and sub.current.position, len(sub.inbox), list(sub.ledger),
                         sub.window_seqs, sub.interrupt)
            for trigger_id, sub in book.subscribers.items()
        }
        records = [(r.position, r.pending, r.acked, r.failed, r.rejected)
                   for r in book._timeline]
        lanes = {lane: [r.position for r in q] for lane, q in book.lanes.items()}
        return subs, records, lanes, dict(book.ready)

    before = state()
    samples: list[list[tuple[str, dict[str, Any], float]]] = []
    worker = threading.Thread(
        target=lambda: samples.extend(ours(metric_reader.get_metrics_data()) for _ in range(200))
    )
    worker.start()
    await asyncio.to_thread(worker.join)
    assert state() == before
    last = {(name, tuple(sorted(attrs.items()))): value for name, attrs, value in samples[-1]}
    assert last[("sharedstream.engine.events.outstanding", (("stream", STREAM),))] == 2
    assert last[("sharedstream.engine.events.head_of_line_age", (("stream", STREAM),))] == 7.0
    assert last[("sharedstream.subscriber.lag", (("stream", STREAM), ("trigger", "1")))] == 1
    held.gate.set()
    held.confirm_all()
    await manager.stop_all()
