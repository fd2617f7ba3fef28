"""Definitions of the dispatch endpoint test: one memory stream, a DAG run here, one sent away.

``ran`` runs on the built-in local target; ``hooks`` goes to the webhook target
``hooks`` of the test's configuration, whose receiver never answers.
"""

from __future__ import annotations

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.dispatch import RunDocument
from sharedstream.testing.memory import MemorySharedStreamTrigger
from tests.ops.held import BROKER, STREAM


def noted(run: RunDocument) -> str:
    """A run of ``ran``: nothing to do but say so."""
    return f"ran {run.run_id}"


free = Asset("free", watchers=[AssetWatcher("fast", trigger=MemorySharedStreamTrigger(
    stream=STREAM, broker=BROKER, poll_timeout=0.05))])
ran = Dag("ran", schedule=free, run=noted)
hooks = Dag("hooks", schedule=free, target="hooks")
