"""Definitions of the stream-names test: one topic (``orders``) on two memory "clusters".

``east/json`` decodes JSON (a value that is not JSON is rejected and, with
no dead-letter stream, kept in the store's table); ``west/raw`` fires for
every record. Same topic, different brokers: two streams whose base names
agree, so each name carries its key's digest.
"""

from __future__ import annotations

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.testing.memory import MemorySharedStreamTrigger

EAST, WEST, TOPIC = "names-east", "names-west", "orders"

east = Asset("east", watchers=[AssetWatcher("json", trigger=MemorySharedStreamTrigger(
    stream=TOPIC, broker=EAST, poll_timeout=0.05, payload_format="json"))])
west = Asset("west", watchers=[AssetWatcher("raw", trigger=MemorySharedStreamTrigger(
    stream=TOPIC, broker=WEST, poll_timeout=0.05))])
ship = Dag("ship", schedule=east | west)
