"""The fidelity suite: Google's and Microsoft's own SDK tests against the kit's test servers.

``python -m sharedstream.testing.fidelity pubsub|servicebus|all`` downloads
the pinned SDK source distributions (:mod:`.sources`), runs the tests of
theirs that cover what the kit's Pub/Sub and Service Bus servers implement
with fixtures adapted to the servers (:mod:`.suites`, :mod:`.standins`),
and judges the outcome against ``expected_failures.toml``
(:mod:`.verdict`): a listed test that passes, or an unlisted one that
fails, fails the run. See ``docs/testing.md`` (Fidelity).
"""
