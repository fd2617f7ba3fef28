"""Several triggerers on one store, on every backend: heartbeats say what each runs, and
standalone triggers are claimed by one live triggerer at a time, within its capacity."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from sharedstream.store import Claim, MetadataStore, TriggerSpec, WatcherSpec
from tests.store.conftest import Backend


def define(store: MetadataStore, count: int) -> list[int]:
    """``count`` active triggers, each watched by one asset; their ids in order."""
    specs = [TriggerSpec(f"fp-{i}", "pkg.Trigger", b"kw") for i in range(count)]
    watchers = [WatcherSpec(f"asset-{i}", "w", f"fp-{i}") for i in range(count)]
    ids = store.sync_definitions(specs, watchers, [])
    return [ids[f"fp-{i}"] for i in range(count)]


def test_a_heartbeat_records_what_the_triggerer_runs(store: MetadataStore) -> None:
    store.heartbeat("t-1", "host-a", 10, running=[7, 3])
    store.heartbeat("t-2", "host-b", 20)
    rows = store.triggerers()
    assert [(t.id, t.running) for t in rows] == [("t-1", (3, 7)), ("t-2", ())]
    store.heartbeat("t-1", "host-a", 10, running=[3])
    assert store.triggerers()[0].running == (3,)
    now = rows[0].heartbeat_at
    assert rows[0].alive(now + timedelta(seconds=30), 30)
    assert not rows[0].alive(now + timedelta(seconds=30.5), 30)
    assert abs((datetime.now(UTC) - now).total_seconds()) < 5  # the server's clock is ours


def test_claims_share_the_triggers_within_capacity(store: MetadataStore) -> None:
    ids = define(store, 5)
    store.heartbeat("a", "h", 1)
    store.heartbeat("b", "h", 2)
    assert store.claim_triggers("a", ids, 3, 30) == Claim(owned=tuple(ids[:3]), elsewhere=2)
    assert store.claim_triggers("b", ids, 3, 30) == Claim(owned=tuple(ids[3:]), elsewhere=3)
    # idempotent: each keeps what it owns, nothing moves while both are alive
    assert store.claim_triggers("a", ids, 3, 30).owned == tuple(ids[:3])
    assert store.claim_triggers("b", ids, 10, 30).owned == tuple(ids[3:])
    # only candidates, only active triggers
    assert store.claim_triggers("c", ids[:1], 10, 30) == Claim(owned=(), elsewhere=1)
    store.set_trigger_state(ids[0], "finished")
    assert store.claim_triggers("a", ids, 3, 30).owned == tuple(ids[1:3])


def test_a_dead_owners_triggers_are_taken_over_and_a_release_frees_them_at_once(
    store: MetadataStore,
) -> None:
    ids = define(store, 2)
    store.heartbeat("a", "h", 1)
    assert store.claim_triggers("a", ids, 10, 30).owned == tuple(ids)
    store.heartbeat("b", "h", 2)
    assert store.claim_triggers("b", ids, 10, 30).owned == ()  # a is alive
    time.sleep(0.3)
    store.heartbeat("b", "h", 2)
    assert store.claim_triggers("b", ids, 10, 0.2).owned == tuple(ids)  # a is not, by 0.2 s
    assert store.claim_triggers("a", ids, 10, 30) == Claim(owned=(), elsewhere=2)  # a lost them
    store.release_triggers("b")
    assert store.claim_triggers("a", ids, 10, 30).owned == tuple(ids)  # free again at once
    store.release_triggers("nobody")  # idempotent, harmless


def test_signing_off_removes_the_triggerer_and_frees_its_triggers_at_once(
    store: MetadataStore,
) -> None:
    ids = define(store, 2)
    store.heartbeat("a", "h", 1, running=ids)
    store.heartbeat("b", "h", 2)
    assert store.claim_triggers("a", ids, 10, 30).owned == tuple(ids)
    store.sign_off("a")
    assert [t.id for t in store.triggerers()] == ["b"]
    assert store.claim_triggers("b", ids, 10, 30).owned == tuple(ids)
    store.sign_off("a")  # idempotent, harmless
    assert [t.id for t in store.triggerers()] == ["b"]


def test_concurrent_claims_never_give_a_trigger_two_owners(backend: Backend) -> None:
    setup = backend.open()
    setup.migrate()
    ids = define(setup, 40)
    stores = {name: backend.open() for name in ("a", "b", "c", "d")}
    claims: dict[str, tuple[int, ...]] = {}
    start = threading.Barrier(len(stores))

    def claim(name: str, store: MetadataStore) -> None:
        store.heartbeat(name, "h", 1)
        start.wait()
        for _ in range(5):
            claims[name] = store.claim_triggers(name, ids, 15, 30).owned

    threads = [threading.Thread(target=claim, args=item) for item in stores.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    owned = [trigger for each in claims.values() for trigger in each]
    assert sorted(owned) == ids  # each exactly once: no trigger twice, none left over
    assert all(len(each) <= 15 for each in claims.values())
