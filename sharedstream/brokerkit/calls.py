"""Counting a producer's broker calls: by operation, and as the OpenTelemetry counter.

Every broker producer counts the API calls it makes (``ReceiveMessage``,
``Acknowledge``, ``Complete``...): tests and benchmarks read the counts from
the producer, operators from the OpenTelemetry counter
``sharedstream.broker.requests`` (attributes ``broker`` and ``operation``).
:class:`BrokerCalls` is both: a ``Counter`` of operations that also adds
each count to the instrument. Called from the owner's event loop.
"""

from __future__ import annotations

from collections import Counter

from sharedstream.engine.telemetry import instruments

__all__ = ["BrokerCalls"]


class BrokerCalls(Counter[str]):
    """Calls made by one producer, by operation (``calls["Acknowledge"]``), also reported."""

    def __init__(self, broker: str) -> None:
        super().__init__()
        self.broker = broker
        self._instrument = instruments().broker_requests

    def count(self, operation: str, n: int = 1) -> None:
        """``n`` more calls of ``operation``."""
        self[operation] += n
        self._instrument.add(n, {"broker": self.broker, "operation": operation})
