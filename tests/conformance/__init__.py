"""A reusable conformance suite for ``SharedStreamProducer`` broker modules.

A broker module's tests provide a ``harness`` fixture (an object satisfying
:class:`~tests.conformance.harness.BrokerHarness`) and subclass
:class:`~tests.conformance.suite.ProducerConformance`; every test in the
suite then runs against the real broker, skipping what the broker's
:class:`~tests.conformance.harness.Features` say it does not do.
"""
