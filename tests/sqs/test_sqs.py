"""SQS producer and trigger: the conformance suite on moto, plus SQS-specific tests."""

from __future__ import annotations

from tests.conformance.suite import ProducerConformance


class TestSqsConformance(ProducerConformance):
    """The shared producer conformance suite against moto (standard and FIFO queues)."""
