"""A definitions file for the Pub/Sub crash tests: three watchers on one subscription, one DAG.

The subscription comes from the environment (``PUBSUB_TEST_PROJECT``,
``PUBSUB_TEST_SUBSCRIPTION``, ``PUBSUB_TEST_DLQ``); the server from
``PUBSUB_EMULATOR_HOST`` only (no ``emulator_host`` here: that path is what
the tests exercise). Messages are JSON objects ``{"id": n, "kind":
"order"|"refund"}`` with a ``region`` attribute; a body that is not JSON is
rejected (dead-lettered) by every watcher.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger

COMMON: dict[str, Any] = {
    "project": os.environ.get("PUBSUB_TEST_PROJECT", "sharedstream-test"),
    "subscription": os.environ.get("PUBSUB_TEST_SUBSCRIPTION", "orders"),
    "dead_letter_topic": os.environ.get("PUBSUB_TEST_DLQ") or None,
    "ack_deadline": 10,  # a killed triggerer's leases lapse quickly
    "max_in_flight": 200,
    "payload_format": "json",
}

orders = Asset("orders", watchers=[AssetWatcher("all", trigger=PubSubSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}},
))])
eu_orders = Asset("eu_orders", watchers=[AssetWatcher("eu", trigger=PubSubSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}, "attributes": {"region": "eu"}},
))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=PubSubSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "refund"}},
))])

ship = Dag("ship", schedule=orders)  # one run per order
