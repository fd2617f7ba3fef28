"""Definitions of the status page test: three watchers of one memory stream.

``held/slow`` can be held (its lag then grows), ``orders/json`` keeps
orders and rejects what is not JSON, ``everything/raw`` fires for every
record.
"""

from __future__ import annotations

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.testing.memory import MemorySharedStreamTrigger
from tests.ops.held import BROKER, HeldMemoryTrigger

held = Asset("held", watchers=[AssetWatcher("slow", trigger=HeldMemoryTrigger(
    stream="shop", broker=BROKER, poll_timeout=0.05))])
orders = Asset("orders", watchers=[AssetWatcher("json", trigger=MemorySharedStreamTrigger(
    stream="shop", broker=BROKER, poll_timeout=0.05, payload_format="json",
    match={"json": {"kind": "order"}}))])
everything = Asset("everything", watchers=[AssetWatcher("raw", trigger=MemorySharedStreamTrigger(
    stream="shop", broker=BROKER, poll_timeout=0.05))])
ship = Dag("ship", schedule=orders)
audit = Dag("audit", schedule=everything & held)
