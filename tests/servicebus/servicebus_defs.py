"""A definitions file for the Service Bus crash tests: three watchers on one queue, one DAG.

The queue and the server come from the environment
(``SERVICEBUS_TEST_CONNECTION_STRING``, ``SERVICEBUS_TEST_QUEUE``,
``SERVICEBUS_TEST_SESSIONS=1`` for a session-enabled queue). Messages are
JSON objects ``{"id": n, "kind": "order"|"refund"}`` with a ``region``
application property; all three watchers share one receiver.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger

COMMON: dict[str, Any] = {
    "connection_string": os.environ.get("SERVICEBUS_TEST_CONNECTION_STRING", ""),
    "queue": os.environ.get("SERVICEBUS_TEST_QUEUE", "orders"),
    "sessions": os.environ.get("SERVICEBUS_TEST_SESSIONS") == "1",
    "lock_duration": 5,  # the queue's is shorter: renewal follows what the messages show
    "max_wait_time": 1.0,
    "max_in_flight": 200,
    "payload_format": "json",
}

orders = Asset("orders", watchers=[AssetWatcher("all", trigger=ServiceBusSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}},
))])
eu_orders = Asset("eu_orders", watchers=[AssetWatcher("eu", trigger=ServiceBusSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}, "properties": {"region": "eu"}},
))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=ServiceBusSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "refund"}},
))])

ship = Dag("ship", schedule=orders)  # one run per order
