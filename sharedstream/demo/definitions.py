"""The definitions file of ``sharedstream demo``: four Kafka watchers on one topic, three DAGs.

Pass it to ``sharedstream triggerer --definitions`` against your own broker
too; it reads where the broker is from the environment:

* ``SHAREDSTREAM_DEMO_BOOTSTRAP`` - ``host:port`` (default ``127.0.0.1:9092``)
* ``SHAREDSTREAM_DEMO_TOPIC`` - the topic (default ``demo.orders``); rejected
  records go to ``<topic>.dlq``
* ``SHAREDSTREAM_DEMO_GROUP`` - the consumer group (default ``sharedstream-demo``)
* ``SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS`` - the group session timeout (default 10000)

The records are JSON objects ``{"id": n, "kind": "order"|"refund", "amount": n}``
keyed by region (``eu``, ``us``, ``apac``). All four watchers share one consumer:
they differ only in what they match.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.producers.kafka import KafkaMessage
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

BIG_ORDER = 500
"""An order is big from this amount on."""

_SESSION_MS = int(os.environ.get("SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS", "10000"))
_TOPIC = os.environ.get("SHAREDSTREAM_DEMO_TOPIC", "demo.orders")
COMMON: dict[str, Any] = {
    "bootstrap_servers": os.environ.get("SHAREDSTREAM_DEMO_BOOTSTRAP", "127.0.0.1:9092"),
    "topics": [_TOPIC],
    "group_id": os.environ.get("SHAREDSTREAM_DEMO_GROUP", "sharedstream-demo"),
    "dead_letter_topic": f"{_TOPIC}.dlq",
    "payload_format": "json",
    "consumer_overrides": {
        "session_timeout_ms": _SESSION_MS,
        "heartbeat_interval_ms": max(100, _SESSION_MS // 5),
    },
}


class MinAmountTrigger(KafkaSharedStreamTrigger):
    """A custom filter a ``match`` dict cannot express: ``amount >= min_amount``."""

    def __init__(self, *, min_amount: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_amount = min_amount

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The Kafka trigger's kwargs, plus ``min_amount``."""
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "min_amount": self.min_amount}

    def matches(self, value: Any, message: KafkaMessage) -> bool:
        """The ``match`` dict, and an integer ``amount`` of at least ``min_amount``."""
        amount = value.get("amount") if isinstance(value, dict) else None
        return (super().matches(value, message) and isinstance(amount, int)
                and amount >= self.min_amount)


orders = Asset("orders", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}},
))])
big_orders = Asset("big_orders", watchers=[AssetWatcher("over_min", trigger=MinAmountTrigger(
    **COMMON, match={"json": {"kind": "order"}}, min_amount=BIG_ORDER,
))])
eu_orders = Asset("eu_orders", watchers=[AssetWatcher("eu", trigger=KafkaSharedStreamTrigger(
    **COMMON, match={"key": "eu", "json": {"kind": "order"}},
))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "refund"}},
))])

ship = Dag("ship", schedule=orders)                       # one run per order
reconcile = Dag("reconcile", schedule=[orders, refunds])  # all of: new orders and a new refund
notify = Dag("notify", schedule=big_orders | refunds)     # any of: a big order or a refund
