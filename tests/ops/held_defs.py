"""Definitions of the endpoint tests: two watchers on one memory stream, one of them holdable."""

from __future__ import annotations

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.testing.memory import MemorySharedStreamTrigger
from tests.ops.held import BROKER, STREAM, HeldMemoryTrigger

held = Asset("held", watchers=[AssetWatcher("slow", trigger=HeldMemoryTrigger(
    stream=STREAM, broker=BROKER, poll_timeout=0.05))])
free = Asset("free", watchers=[AssetWatcher("fast", trigger=MemorySharedStreamTrigger(
    stream=STREAM, broker=BROKER, poll_timeout=0.05))])
either = Dag("either", schedule=held | free)
