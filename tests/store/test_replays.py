"""Replays as store rows, on both backends (schema version 10; see ``sharedstream.store.replays``).

One active replay per trigger; a triggerer claims one nobody live runs,
plans it, records progress fenced by its id, and ends it; a cancel stops a
pending replay at once and asks a running one's runner to stop; a replay
whose triggerer died is claimed again with its positions.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from sharedstream.store import StoreError
from sharedstream.store.base import MetadataStore
from sharedstream.store.replays import ReplayProgress
from tests.store.conftest import LATEST, Backend


def _trigger(backend: Backend) -> int:
    return backend.insert_old_trigger("orders")


def test_one_active_replay_per_trigger_and_its_lifecycle(backend: Backend) -> None:
    with backend.open() as store:
        store.migrate()
        trigger = _trigger(backend)
        first = store.create_replay(trigger, "orders/w", {"from": "2026-11-27T00:00:00+00:00"})
        with pytest.raises(StoreError, match=rf"already has replay {first} \(pending\)"):
            store.create_replay(trigger, "orders/w", {})
        with pytest.raises(StoreError, match="no trigger with id 999"):
            store.create_replay(999, "x/y", {})

        store.heartbeat("t1", "host", 1)
        assert store.claim_replay("t1", [trigger + 1], 30) is None, "not a trigger it serves"
        claimed = store.claim_replay("t1", [trigger], 30)
        assert claimed is not None
        assert (claimed.id, claimed.state, claimed.triggerer_id) == (first, "running", "t1")
        assert claimed.request == {"from": "2026-11-27T00:00:00+00:00"}
        assert claimed.plan is None
        assert claimed.total is None
        assert store.claim_replay("t1", [trigger], 30) is None, "one claim at a time"

        assert store.plan_replay(first, "t1", {"orders/0": (3, 10), "orders/1": (5, 5)})
        planned = store.get_replay(first)
        assert planned is not None
        assert planned.plan == {"orders/0": (3, 10), "orders/1": (5, 5)}
        assert planned.positions == {"orders/0": 3, "orders/1": 5}
        assert planned.total == 7

        progress = ReplayProgress({"orders/0": 8, "orders/1": 5}, done=5, matched=4, stored=3)
        assert store.record_replay(first, "t1", progress) == "running"
        assert store.record_replay(first, "t2", progress) is None, "fenced by the triggerer id"
        assert store.finish_replay(first, "t1", "done")
        ended = store.get_replay(first)
        assert ended is not None
        assert (ended.state, ended.done, ended.matched, ended.stored) == ("done", 5, 4, 3)
        assert ended.positions == {"orders/0": 8, "orders/1": 5}
        assert ended.finished_at is not None
        assert not ended.active
        assert store.record_replay(first, "t1", progress) is None, "an ended replay stays ended"

        second = store.create_replay(trigger, "orders/w", {})  # the first one ended: allowed
        assert [r.id for r in store.list_replays(10)] == [second, first]
        assert [r.id for r in store.list_replays(10, active=True)] == [second]
        assert store.list_replays(10, trigger_id=trigger + 1) == []


def test_a_cancel_ends_a_pending_replay_and_asks_a_running_one(store: MetadataStore,
                                                               backend: Backend) -> None:
    trigger = _trigger(backend)
    pending = store.create_replay(trigger, "orders/w", {})
    assert store.cancel_replay(pending).state == "cancelled"
    with pytest.raises(StoreError, match=f"replay {pending} already ended: cancelled"):
        store.cancel_replay(pending)
    with pytest.raises(StoreError, match="no replay with id 12345"):
        store.cancel_replay(12345)

    running = store.create_replay(trigger, "orders/w", {})
    store.heartbeat("t1", "host", 1)
    assert store.claim_replay("t1", [trigger], 30) is not None
    assert store.cancel_replay(running).state == "cancelling"
    assert store.record_replay(running, "t1", ReplayProgress()) == "cancelling"
    assert store.finish_replay(running, "t1", "cancelled")
    with pytest.raises(StoreError, match="a replay ends"):
        store.finish_replay(running, "t1", "running")


def test_a_replay_whose_triggerer_died_is_claimed_again_where_it_was(
    store: MetadataStore, backend: Backend,
) -> None:
    trigger = _trigger(backend)
    replay = store.create_replay(trigger, "orders/w", {})
    store.heartbeat("t1", "host", 1)
    store.heartbeat("t2", "host", 2)
    assert store.claim_replay("t1", [trigger], 30) is not None
    store.plan_replay(replay, "t1", {"orders/0": (0, 100)})
    store.record_replay(replay, "t1", ReplayProgress({"orders/0": 40}, done=40))
    assert store.claim_replay("t2", [trigger], 30) is None, "t1 is alive"
    time.sleep(1.2)
    store.heartbeat("t2", "host", 2)
    taken = store.claim_replay("t2", [trigger], 1.0)
    assert taken is not None
    assert (taken.triggerer_id, taken.state, taken.positions, taken.done) == (
        "t2", "running", {"orders/0": 40}, 40)
    assert store.record_replay(replay, "t1", ReplayProgress()) is None, "t1 lost it"


def test_a_store_at_version_9_gets_the_table(backend: Backend) -> None:
    with backend.at_version(9) as old, pytest.raises(StoreError):
        old.list_replays(10)
    with backend.open() as new:
        assert new.migrate() == LATEST == 10
        assert new.list_replays(10) == []


def test_retention_prunes_ended_replays_and_never_an_active_one(backend: Backend) -> None:
    with backend.open() as store:
        store.migrate()
        trigger = _trigger(backend)
        ended = store.create_replay(trigger, "orders/w", {})
        store.heartbeat("t1", "host", 1)
        assert store.claim_replay("t1", [trigger], 30) is not None
        assert store.finish_replay(ended, "t1", "done")
        active = store.create_replay(trigger, "orders/w", {})  # the next one: pending
        row = store.get_replay(ended)
        assert row is not None
        assert row.finished_at is not None
        assert store.prune(row.finished_at - timedelta(seconds=1)).replays == 0, "not yet"
        later = datetime.now(UTC) + timedelta(days=1)
        result = store.prune(later)
        assert result.replays == 1
        assert result.total() >= 1
        assert store.get_replay(ended) is None
        assert store.get_replay(active) is not None, "a pending replay is never pruned"
