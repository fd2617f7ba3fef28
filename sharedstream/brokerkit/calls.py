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

__all__ = ["PROCESS_CALLS", "BrokerCalls"]

PROCESS_CALLS: Counter[tuple[str, str]] = Counter()
"""Calls made by every producer of this process, by ``(broker, operation)``.

Read by the operations endpoint's ``/metrics`` at scrape time (on the loop).
"""


class BrokerCalls(Counter[str]):
    """Calls made by one producer, by operation (``calls["Acknowledge"]``), also reported."""

    def __init__(self, broker: str) -> None:
        super().__init__()
        self.broker = broker
        self._instrument = instruments().broker_requests

    def count(self, operation: str, n: int = 1) -> None:
        """``n`` more calls of ``operation``."""
        self[operation] += n
        PROCESS_CALLS[self.broker, operation] += n
        self._instrument.add(n, {"broker": self.broker, "operation": operation})
