"""Definitions of the "why it fired or not" test: two watchers of one memory stream.

``orders/json`` decodes JSON and keeps orders (a value that is not JSON is
rejected); ``everything/raw`` fires for every record.
"""

from __future__ import annotations

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.testing.memory import MemorySharedStreamTrigger
from tests.ops.held import BROKER

orders = Asset("orders", watchers=[AssetWatcher("json", trigger=MemorySharedStreamTrigger(
    stream="mixed", broker=BROKER, poll_timeout=0.05, payload_format="json",
    match={"json": {"kind": "order"}}))])
everything = Asset("everything", watchers=[AssetWatcher("raw", trigger=MemorySharedStreamTrigger(
    stream="mixed", broker=BROKER, poll_timeout=0.05))])
ship = Dag("ship", schedule=orders | everything)
