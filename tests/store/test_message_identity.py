"""A new message that reused a stored message's name is stored, on every backend (issue 29).

An idempotency key names a broker message (``topic/partition/offset``); a
recreated topic hands the same offsets to new records. The event's
fingerprint tells them apart: same key and same fingerprint is a
redelivery (a duplicate), same key and another fingerprint is stored under
``f"{key}#{fingerprint}"`` and reported in ``WriteResult.renamed``.
"""

from __future__ import annotations

from collections import Counter

from sharedstream.store import MetadataStore, PendingEvent
from sharedstream.store._sqlite_schema import MIGRATIONS
from tests.store.conftest import Backend
from tests.store.test_store import asset, define


def ev(trigger_id: int, key: str, fingerprint: str | None, payload: bytes = b"{}") -> PendingEvent:
    return PendingEvent(trigger_id, key, payload, fingerprint=fingerprint)


def stored_keys(store: MetadataStore) -> list[str | None]:
    return [e.idem_key for e in reversed(store.list_events())]


def test_same_key_same_fingerprint_is_a_duplicate(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    store.write_events([ev(ids["t"], "k", "100-aa")])
    again = store.write_events([ev(ids["t"], "k", "100-aa")])
    assert (again.stored, again.duplicates, again.dag_runs, again.renamed) == (0, 1, (), ())
    assert store.counts()["dag_runs"] == 1


def test_same_key_other_fingerprint_is_stored_under_a_new_key_once(
    store: MetadataStore,
) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    t = ids["t"]
    store.write_events([ev(t, "k1", "100-aa"), ev(t, "k2", "101-bb")])
    new = store.write_events([ev(t, "k1", "900-cc", b'{"new": 1}'), ev(t, "k3", "902-dd")])
    assert (new.stored, new.duplicates, new.asset_events) == (2, 0, 2)
    assert new.renamed == ((t, "k1"),)
    assert len(new.dag_runs) == 2
    assert stored_keys(store) == ["k1", "k2", "k3", "k1#900-cc"]
    # the renamed message's redelivery, and the old one's, are duplicates
    again = store.write_events([ev(t, "k1", "900-cc"), ev(t, "k1", "100-aa")])
    assert (again.stored, again.duplicates, again.renamed) == (0, 2, ())
    assert store.counts() == {"triggers": 1, "trigger_events": 4, "asset_events": 4,
                              "dag_runs": 4}
    trigger = store.get_trigger(t)
    assert trigger is not None
    assert trigger.events_stored == 4
    payloads = {e.idem_key: e.payload for e in store.list_events()}
    assert payloads["k1#900-cc"] == b'{"new": 1}'
    assert payloads["k1"] == b"{}"


def test_renamed_events_get_their_asset_events_and_runs(store: MetadataStore) -> None:
    # two triggers, one watched by two assets; a DAG on each asset and one on both
    ids = define(store, {"a": ["x", "y"], "b": ["y"]},
                 {"on_x": asset("x"), "on_y": asset("y"),
                  "on_both": {"all": [asset("x"), asset("y")]}})
    a, b = ids["a"], ids["b"]
    store.write_events([ev(a, "a1", "1-00"), ev(b, "b1", "1-00")])
    before = store.counts()
    # batch order: a renamed event first, then a fresh one, then another renamed one
    result = store.write_events([ev(a, "a1", "2-01"), ev(b, "b2", "2-02"), ev(b, "b1", "2-03")])
    assert (result.stored, result.duplicates) == (3, 0)
    assert result.renamed == ((a, "a1"), (b, "b1"))
    assert result.asset_events == 2 + 1 + 1
    after = store.counts()
    assert after["asset_events"] - before["asset_events"] == 4
    assert after["dag_runs"] - before["dag_runs"] == len(result.dag_runs)
    by_key = {e.idem_key: e.assets for e in store.list_events()}
    assert by_key["a1#2-01"] == ("x", "y")
    assert by_key["b1#2-03"] == ("y",)
    assert by_key["b2"] == ("y",)
    runs = Counter(run.dag_id for run in store.list_runs())
    assert runs["on_x"] == 2  # a1, then a1#2-01
    assert runs["on_y"] == 2 + 3  # a1, b1, then a1#2-01, b2, b1#2-03
    for trigger_id, events in ((a, 2), (b, 3)):
        row = store.get_trigger(trigger_id)
        assert row is not None
        assert row.events_stored == events


def test_a_stored_event_without_fingerprint_matches_any(store: MetadataStore) -> None:
    ids = define(store, {"t": ["x"]}, {})
    t = ids["t"]
    store.write_events([ev(t, "legacy", None)])
    result = store.write_events([ev(t, "legacy", "5-ab")])
    assert (result.stored, result.duplicates, result.renamed) == (0, 1, ())
    # and an event without one is a duplicate of any stored event of its key
    store.write_events([ev(t, "k", "5-ab")])
    result = store.write_events([ev(t, "k", None)])
    assert (result.stored, result.duplicates, result.renamed) == (0, 1, ())
    assert stored_keys(store) == ["legacy", "k"]


def test_a_key_repeated_within_a_batch_is_a_duplicate_whatever_its_fingerprint(
    store: MetadataStore,
) -> None:
    ids = define(store, {"t": ["x"]}, {"d": asset("x")})
    t = ids["t"]
    first = store.write_events([ev(t, "k", "1-aa"), ev(t, "k", "2-bb"), ev(t, "k", "1-aa")])
    assert (first.stored, first.duplicates, first.renamed) == (1, 2, ())
    # a stored key met twice by one batch of a new message: stored once, renamed once
    again = store.write_events([ev(t, "k", "3-cc"), ev(t, "k", "3-cc"), ev(t, "k", "1-aa")])
    assert (again.stored, again.duplicates, again.renamed) == (1, 2, ((t, "k"),))
    assert stored_keys(store) == ["k", "k#3-cc"]
    assert store.counts()["dag_runs"] == 2


def test_migration_keeps_stored_events_without_fingerprint(backend: Backend) -> None:
    """The fingerprint's migration is version 8; version 7 stores none."""
    with backend.at_version(7):
        trigger_id = backend.insert_old_trigger()
        backend.insert_old_event(trigger_id, "k1")
    with backend.open() as new:
        assert new.migrate() == len(MIGRATIONS)
        assert [e.idem_key for e in new.list_events()] == ["k1"]
        assert backend.query("SELECT idem_key, fingerprint FROM trigger_events") == [
            ("k1", None)]
        # what was stored before is matched by its key alone: no history is duplicated
        result = new.write_events([ev(trigger_id, "k1", "7-ff"), ev(trigger_id, "k2", "7-fe")])
        assert (result.stored, result.duplicates, result.renamed) == (1, 1, ())
        assert backend.query("SELECT idem_key, fingerprint FROM trigger_events ORDER BY id") == [
            ("k1", None), ("k2", "7-fe")]
