"""The testing kit: what a broker package and a trigger author test with.

Import what you need from its modules; none of them is imported by the
``sharedstream`` core, and none imports a broker SDK until a function needs it.

* :mod:`sharedstream.testing.conformance` - :class:`ProducerConformance`, the
  producer conformance suite as a pytest base class: subclass it and provide
  a ``harness`` fixture (pytest and pytest-asyncio needed).
* :mod:`sharedstream.testing.harness` - :class:`Features` (what a broker
  promises), :class:`BrokerHarness` (what a harness provides), :class:`Stream`,
  :class:`DeadLetter`.
* :mod:`sharedstream.testing.scripts` - scripted filters for a harness's
  trigger (:class:`Script`, :func:`act`, :func:`pace`, :class:`ScriptedFailure`).
* :mod:`sharedstream.testing.runner` - :class:`SupervisedRunner` (a trigger run
  as the triggerer runs it), :func:`eventually`, :func:`eventually_async`.
* :mod:`sharedstream.testing.memory` - an in-memory broker with the reference
  producer and trigger (cumulative or per-message acknowledgements, lanes,
  dead letters, redelivery); :mod:`sharedstream.testing.memory_harness` - its
  conformance harness.
* :mod:`sharedstream.testing.brokers` - real brokers on this machine as context
  managers (Tansu, moto, fauxqs; Kafka and LocalStack containers when Docker
  answers); :mod:`sharedstream.testing.fixtures` - the same as pytest fixtures
  (opt in with ``pytest_plugins = ["sharedstream.testing.fixtures"]``).
* :mod:`sharedstream.testing.triggerers` - :class:`TriggererCluster`: several
  ``sharedstream triggerer`` processes (the real CLI) on one store.
* :mod:`sharedstream.testing.latency_proxy` - :class:`LatencyProxy` and
  :func:`latency_proxy`: a TCP proxy that delays every byte, to put a real
  network's round trip between a client and a local broker.
"""

from __future__ import annotations

import sys

from sharedstream.testing.harness import BrokerHarness, DeadLetter, Features, Stream

__all__ = ["BrokerHarness", "DeadLetter", "Features", "Stream"]

_pytest = sys.modules.get("pytest")
if _pytest is not None:  # under pytest: the suite's plain asserts explain their failures
    _pytest.register_assert_rewrite(
        "sharedstream.testing.conformance", "sharedstream.testing.memory_harness")
