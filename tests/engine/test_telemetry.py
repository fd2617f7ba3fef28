"""The engine's OpenTelemetry measurements reach an installed SDK."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from sharedstream import SharedStreamManager
from tests.engine.harness import Feed, FeedTrigger, Runner, eventually


@pytest.fixture
def reader(metric_reader: InMemoryMetricReader) -> InMemoryMetricReader:
    return metric_reader


def points(reader: InMemoryMetricReader, name: str) -> dict[str, float]:
    data = reader.get_metrics_data()
    found: dict[str, float] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        label = str(point.attributes.get("outcome", "")) if point.attributes else ""
                        if isinstance(point, HistogramDataPoint):
                            found[label] = float(point.count)
                        else:
                            found[label] = float(getattr(point, "value", 0))
    return found


async def test_advance_outcomes_and_latency_are_measured(
    feed: Feed, reader: InMemoryMetricReader
) -> None:
    manager = SharedStreamManager()
    Runner(manager, FeedTrigger("f", "picky", rejects=[1]), 1).start()
    feed.push(0, 1, 2)
    await eventually(lambda: len(feed.advanced()) == 3)
    await manager.stop_all()
    outcomes = points(reader, "sharedstream.advance.outcomes")
    assert outcomes["clean"] >= 2
    assert outcomes["rejected"] >= 1
    assert points(reader, "sharedstream.advance.duration")[""] >= 1
    assert points(reader, "sharedstream.advance.events")[""] >= 3


async def test_outstanding_events_and_head_of_line_age_are_observed(
    feed: Feed, reader: InMemoryMetricReader
) -> None:
    manager = SharedStreamManager()
    held = Runner(manager, FeedTrigger("f", "held"), 1, auto_confirm=False).start()
    feed.push(0, 1, 2)
    await eventually(lambda: len(held.unconfirmed) == 3)
    outstanding = points(reader, "sharedstream.engine.events.outstanding")
    assert outstanding[""] == 3  # nothing advanced while the store has not confirmed
    assert points(reader, "sharedstream.engine.events.head_of_line_age")[""] >= 0
    held.confirm_all()
    await eventually(lambda: len(feed.advanced()) == 3)
    assert points(reader, "sharedstream.engine.events.outstanding")[""] == 0
    await manager.stop_all()


def test_broker_calls_are_counted_by_operation_and_reported(
    reader: InMemoryMetricReader,
) -> None:
    """The kit's call counter: readable from the producer, and the OpenTelemetry counter."""
    from sharedstream.brokerkit.calls import BrokerCalls  # noqa: PLC0415

    calls = BrokerCalls("kit-test")
    calls.count("Receive")
    calls.count("Complete", 3)
    assert calls == {"Receive": 1, "Complete": 3}
    data = reader.get_metrics_data()
    assert data is not None
    reported = {
        str(point.attributes["operation"]): getattr(point, "value", 0)
        for resource in data.resource_metrics for scope in resource.scope_metrics
        for metric in scope.metrics if metric.name == "sharedstream.broker.requests"
        for point in metric.data.data_points
        if point.attributes and point.attributes.get("broker") == "kit-test"
    }
    assert reported == {"Receive": 1, "Complete": 3}
