"""Several ``sharedstream triggerer`` processes on one PostgreSQL database (the real CLI)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sharedstream.testing.fixtures import postgres_database, postgres_url
from sharedstream.testing.triggerers import TriggererCluster as Cluster

__all__ = ["Cluster", "postgres_database", "postgres_url", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]


def wait_until(condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``condition`` every 50 ms; the seconds it took (fails after ``within``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(store_url: str, **env: str) -> Cluster:
        made.append(Cluster(tmp_path, store_url, {
            "SHAREDSTREAM__TRIGGERER__JOB_HEARTBEAT_SEC": "0.5",
            "SHAREDSTREAM__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "3", **env,
        }, pythonpath=[ROOT]))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()
