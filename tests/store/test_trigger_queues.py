"""A trigger's queue (Airflow 3.4's trigger queues) is stored with it, on every backend."""

from __future__ import annotations

from sharedstream.store import MetadataStore, TriggerSpec, WatcherSpec
from tests.store.conftest import LATEST, Backend


def queues(store: MetadataStore) -> dict[str, str | None]:
    return {row.fingerprint: row.queue for row in store.list_triggers()}


def test_the_queue_is_stored_and_follows_the_definitions(store: MetadataStore) -> None:
    watchers = [WatcherSpec("a", "w", "fp-a"), WatcherSpec("b", "w", "fp-b")]
    store.sync_definitions([TriggerSpec("fp-a", "pkg.T", b"a", queue="team-a"),
                            TriggerSpec("fp-b", "pkg.T", b"b")], watchers, [])
    assert queues(store) == {"fp-a": "team-a", "fp-b": None}
    assert {row.fingerprint: row.queue for row in store.active_triggers(10)} == queues(store)
    # moved to another queue, and out of any; a pinned trigger's queue moves too
    store.sync_definitions([TriggerSpec("fp-a", "pkg.T", b"a"),
                            TriggerSpec("fp-b", "pkg.T", b"b", pinned=True, queue="team-b")],
                           watchers, [])
    assert queues(store) == {"fp-a": None, "fp-b": "team-b"}
    (row,) = [r for r in store.list_triggers() if r.fingerprint == "fp-b"]
    got = store.get_trigger(row.id)
    assert got is not None
    assert got.queue == "team-b"


def test_triggers_stored_before_queues_have_none(backend: Backend) -> None:
    with backend.at_version(LATEST - 1):
        backend.insert_old_trigger("a")
    with backend.open() as new:
        assert new.migrate() == LATEST
        assert queues(new) == {"fp": None}
