"""The definitions file of ``sharedstream demo``: four watchers on one stream, three DAGs.

Every DAG has something to run (``run=``): its runs run here, on the
built-in ``local`` target, and the demo waits for them.

Pass it to ``sharedstream triggerer --definitions`` against your own broker
too; it reads which broker and where from the environment:

* ``SHAREDSTREAM_DEMO_BROKER`` - ``kafka`` (the default), ``pubsub`` or
  ``servicebus``: the trigger class and its connection kwargs come from that
  broker's :meth:`~sharedstream.demo.brokers.DemoBroker.watcher_triggers`
* ``SHAREDSTREAM_DEMO_TOPIC`` - the topic, and on Pub/Sub the subscription, on
  Service Bus the queue (default ``demo.orders``); rejected records go to
  ``<topic>.dlq`` (on Service Bus: the queue's dead-letter sub-queue)
* Kafka: ``SHAREDSTREAM_DEMO_BOOTSTRAP`` - ``host:port`` (default
  ``127.0.0.1:9092``), ``SHAREDSTREAM_DEMO_GROUP`` - the consumer group (default
  ``sharedstream-demo``), ``SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS`` - the group
  session timeout (default 10000)
* Pub/Sub: ``SHAREDSTREAM_DEMO_PROJECT`` (default ``sharedstream-demo``),
  ``SHAREDSTREAM_DEMO_PUBSUB_HOST`` - an emulator's ``host:port`` (default: none,
  Pub/Sub itself)
* Service Bus: ``SHAREDSTREAM_DEMO_SERVICEBUS_CONNECTION_STRING`` - the
  namespace's connection string

The records are JSON objects ``{"id": n, "kind": "order"|"refund", "amount": n}``
of a region (``eu``, ``us``, ``apac``: the Kafka key, the Pub/Sub ``region``
attribute, the Service Bus ``region`` application property). All four
watchers share one consumer: they differ only in what they match.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.demo.brokers import demo_broker
from sharedstream.dispatch import RunDocument

BIG_ORDER = 500
"""An order is big from this amount on."""

TRIGGERS = demo_broker(os.environ.get("SHAREDSTREAM_DEMO_BROKER", "kafka")).watcher_triggers(
    os.environ)
COMMON: dict[str, Any] = TRIGGERS.common
WatcherTrigger: Any = TRIGGERS.base  # the broker's trigger class (a BrokerTrigger)


class MinAmountTrigger(WatcherTrigger):  # type: ignore[misc]  # the broker picks the base
    """A custom filter a ``match`` dict cannot express: ``amount >= min_amount``."""

    def __init__(self, *, min_amount: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_amount = min_amount

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The broker trigger's kwargs, plus ``min_amount``."""
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "min_amount": self.min_amount}

    def matches(self, value: Any, message: Any) -> bool:
        """The ``match`` dict, and an integer ``amount`` of at least ``min_amount``."""
        amount = value.get("amount") if isinstance(value, dict) else None
        return (bool(super().matches(value, message)) and isinstance(amount, int)
                and amount >= self.min_amount)


orders = Asset("orders", watchers=[AssetWatcher("all", trigger=WatcherTrigger(
    **COMMON, match={"json": {"kind": "order"}},
))])
big_orders = Asset("big_orders", watchers=[AssetWatcher("over_min", trigger=MinAmountTrigger(
    **COMMON, match={"json": {"kind": "order"}}, min_amount=BIG_ORDER,
))])
eu_orders = Asset("eu_orders", watchers=[AssetWatcher("eu", trigger=WatcherTrigger(
    **COMMON, match={**TRIGGERS.region("eu"), "json": {"kind": "order"}},
))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=WatcherTrigger(
    **COMMON, match={"json": {"kind": "refund"}},
))])



# What each DAG's run does. They run here, in the triggerer (the built-in local target);
# what they return is kept with the run (`sharedstream runs show ship RUN_ID`). To run
# them in an Apache Airflow instead, give the Dags target="airflow" (docs/dispatch.md).
def ship_order(run: RunDocument) -> str:
    """Ship the order that triggered the run."""
    order = run.events[0].payload["value"]  # the broker trigger's payload: value + metadata
    return f"shipped order {order['id']} ({order['amount']})"


def reconcile_books(run: RunDocument) -> str:
    """Reconcile the orders and refunds that came in since the last reconciliation."""
    kinds = Counter(event.asset for event in run.events)
    return f"reconciled {kinds['orders']} orders and {kinds['refunds']} refunds"


def notify_team(run: RunDocument) -> str:
    """Tell the team about a big order or a refund."""
    event = run.events[-1]
    return f"notified: {event.asset} {event.payload['value']['id']}"


ship = Dag("ship", schedule=orders, run=ship_order)  # one run per order
reconcile = Dag("reconcile", schedule=[orders, refunds], run=reconcile_books)  # all of them
notify = Dag("notify", schedule=big_orders | refunds, run=notify_team)  # any of them
