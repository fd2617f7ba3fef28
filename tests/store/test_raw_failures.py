"""Each raw event's own failures, counted durably by every store backend (schema version 7).

The count a producer asks about a message the broker delivered too often
(see ``sharedstream.brokerkit.redelivery.PoisonCheck``): it survives the
store being closed and opened again, adds up across calls and within one,
and retention prunes the counts nobody updated since its cutoff.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sharedstream.store import StoreError
from sharedstream.store.base import MetadataStore
from tests.store.conftest import LATEST, Backend


def test_failures_add_up_and_survive_a_reopen(backend: Backend) -> None:
    with backend.open() as store:
        store.migrate()
        assert store.raw_failures(["orders/1"]) == {}
        store.add_raw_failures(["orders/1", "orders/2", "orders/1"])  # listed twice: two
        store.add_raw_failures(["orders/1"])
        store.add_raw_failures([])
    with backend.open() as again:
        assert again.raw_failures(["orders/1", "orders/2", "orders/3"]) == {
            "orders/1": 3, "orders/2": 1}
        assert again.raw_failures([]) == {}


def test_retention_prunes_counts_not_updated_since_the_cutoff(store: MetadataStore) -> None:
    store.add_raw_failures(["old"])
    assert store.prune(datetime.now(UTC) - timedelta(hours=1)).failure_counts == 0
    cutoff = datetime.now(UTC) + timedelta(seconds=1)
    first = store.prune(cutoff, limit=1)
    assert (first.failure_counts, first.more) == (1, True)
    assert store.raw_failures(["old"]) == {}
    assert store.prune(cutoff, limit=1).more is False


def test_a_store_at_version_6_gets_the_table(backend: Backend) -> None:
    with backend.at_version(6) as old, pytest.raises(StoreError):
        old.raw_failures(["orders/1"])
    with backend.open() as new:
        assert new.migrate() == LATEST
        new.add_raw_failures(["orders/1"])
        assert new.raw_failures(["orders/1"]) == {"orders/1": 1}


def test_a_closed_store_refuses(backend: Backend) -> None:
    store = backend.open()
    store.migrate()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.add_raw_failures(["orders/1"])
    with pytest.raises(StoreError, match="closed"):
        store.raw_failures(["orders/1"])
