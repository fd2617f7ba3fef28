from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.engine.harness import FEEDS, Feed


class FakeClock:
    """An injected monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def feed() -> Iterator[Feed]:
    FEEDS["f"] = feed = Feed()
    yield feed
    FEEDS.clear()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def metric_reader() -> InMemoryMetricReader:
    """The real OpenTelemetry SDK, installed once per session (a provider cannot be replaced)."""
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader
