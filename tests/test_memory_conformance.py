"""The producer conformance suite against the testing kit's in-memory reference producer.

Both acknowledgement modes: ``cumulative`` (Kafka-like, every feature) and
``per-message`` (SQS-like: no cumulative lanes, no kept order). A broker
package's own conformance module looks like this one with its harness.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sharedstream.testing.conformance import ProducerConformance
from sharedstream.testing.memory_harness import MemoryHarness


class TestMemoryConformance(ProducerConformance):
    """The shared producer conformance suite against the in-memory broker."""


@pytest.fixture(params=["cumulative", "per-message"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[MemoryHarness]:
    harness = MemoryHarness(acks=request.param)
    try:
        yield harness
    finally:
        await harness.close()
