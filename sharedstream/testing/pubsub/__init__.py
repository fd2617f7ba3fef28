"""A Google Pub/Sub test server: a subset of the service, for the real client, over gRPC.

Not an emulator: it covers what sharedstream's Pub/Sub module and its tests
use, and refuses (``UNIMPLEMENTED``) or lacks the rest; docs/testing.md lists
both. The real, unmodified ``google-cloud-pubsub`` client reaches it through
``PUBSUB_EMULATOR_HOST=127.0.0.1:<port>``.

* :mod:`.rules` - what Pub/Sub refuses: malformed names, messages past
  its limits (pure functions);
* :mod:`.state` - topics, subscriptions, leases, ordering keys, flow control,
  dead letters and backoff, as a synchronous state machine with injected
  clocks (no gRPC, no Google import);
* :mod:`.service` - the ``google.pubsub.v1.Publisher`` and ``.Subscriber``
  gRPC services over that state (needs ``google-cloud-pubsub``);
* :mod:`.state_file` - the optional ``--state-file`` that keeps topics,
  subscriptions and unsettled messages across a restart;
* :mod:`.server` - :func:`~.server.serve` and the command line
  ``python -m sharedstream.testing.pubsub --port N [--state-file PATH]``.

Start it from tests with :func:`sharedstream.testing.brokers.pubsub_server`
or the ``pubsub_emulator_host`` fixture. Importing this package imports no
gRPC or Google module; :mod:`.service` and :mod:`.server` do.
"""
