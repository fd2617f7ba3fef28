"""Exact accounting of a triggerer run on the demo definitions (shared by the Kafka chaos cases).

Given where each demo record landed, the store must hold exactly one event
per (watcher's asset, record) the demo's filters match, one ``ship`` run per
order and one ``notify`` run per big order or refund, and the dead-letter
topic exactly the malformed records.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from sharedstream.demo import demo_message, matching_assets
from sharedstream.testing.harness import DeadLetter
from tests.cli import TriggererCli


def check_demo_outcome(
    cli: TriggererCli, topic: str, at: dict[tuple[int, int], int], dead: list[DeadLetter],
    context: str,
) -> None:
    """Assert nothing lost, nothing twice, the runs and the dead letters; ``at``: where -> index."""
    records = {where: demo_message(index) for where, index in at.items()}
    wanted = Counter((asset, p, o) for (p, o), (key, value) in records.items()
                     for asset in matching_assets(key, value))
    events: list[dict[str, Any]] = json.loads(
        cli.run("events", "list", "--json", "--limit", "1000000"))
    stored = Counter((asset, e["payload"]["partition"], e["payload"]["offset"])
                     for e in events for asset in e["assets"])
    assert not wanted - stored, f"{context}; missing: {sorted(wanted - stored)[:20]}"
    assert not stored - wanted, f"{context}; twice or unexpected: {sorted(stored - wanted)[:20]}"
    assert len(events) == sum(wanted.values()), context

    per_asset = Counter(asset for asset, _, _ in wanted.elements())
    ship = json.loads(cli.run("runs", "list", "--json", "--dag", "ship", "--limit", "1000000"))
    assert len(ship) == per_asset["orders"], context  # one run per order
    assert all(len(run["asset_events"]) == 1 for run in ship), context
    assert len({e for run in ship for e in run["asset_events"]}) == per_asset["orders"]
    notify = json.loads(cli.run("runs", "list", "--json", "--dag", "notify", "--limit", "1000000"))
    assert len(notify) == per_asset["big_orders"] + per_asset["refunds"], context

    malformed = {f"{topic}/{p}/{o}" for (p, o), record in records.items()
                 if not matching_assets(*record)}
    # A set: a crash between the dead-letter write and the commit writes it again.
    lettered = {letter.source for letter in dead}
    assert lettered == malformed, (
        f"{context}; not dead-lettered: {sorted(malformed - lettered)[:10]}, "
        f"dead-lettered but not malformed: {sorted(lettered - malformed)[:10]}")
