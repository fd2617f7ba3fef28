"""What only the PostgreSQL store promises: several writers at once, from threads or processes.

Two writers (each with a store of its own, as two triggerers have) write
overlapping batches - the same idempotency keys, in different orders, at
the same moment - to one database. Every key must be stored once, every
stored event must have its asset events, no asset event may be consumed
twice by one DAG, no run may exist twice, what the writers report must add
up to what the database holds, and lock ordering must keep them free of
deadlocks (no batch needs a retry).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    StoreError,
    StoreWriteError,
    TriggerSpec,
    WatcherSpec,
    open_store,
)
from sharedstream.testing.brokers import free_port
from tests.store.conftest import Backend

WRITERS = 2
ROUNDS = 30
BATCH = 60
KEYS_PER_ROUND = 80  # each writer takes a random BATCH of these: they overlap a lot


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """This module's tests are PostgreSQL's only (the suite's ``backend`` is parametrized)."""
    with contextlib.ExitStack() as stack:
        yield Backend("postgres", tmp_path, stack, request)


@pytest.fixture
def postgres(backend: Backend) -> Backend:
    return backend


def _define(store: MetadataStore) -> dict[str, int]:
    ids = store.sync_definitions(
        [TriggerSpec("fp-a", "t.A", b"kw"), TriggerSpec("fp-b", "t.B", b"kw")],
        [WatcherSpec("a", "w", "fp-a"), WatcherSpec("b", "w", "fp-b"),
         WatcherSpec("both", "w", "fp-a")],
        [DagSpec("each_a", {"asset": "a"}),
         DagSpec("a_and_b", {"all": [{"asset": "a"}, {"asset": "b"}]}),
         DagSpec("any", {"any": [{"asset": "both"}, {"asset": "b"}]})],
    )
    return {"a": ids["fp-a"], "b": ids["fp-b"]}


def _batches(ids: dict[str, int], writer: int) -> list[list[PendingEvent]]:
    """Per round, BATCH keys of that round's pool, shuffled differently per writer."""
    rng = random.Random(writer)
    rounds = []
    for r in range(ROUNDS):
        keys = rng.sample(range(KEYS_PER_ROUND), BATCH)
        rounds.append([
            PendingEvent(ids["a"] if k % 3 else ids["b"], f"r{r}-k{k}", f"{writer}".encode())
            for k in keys
        ])
    return rounds


def write_rounds(url: str, batches: list[list[PendingEvent]], barrier: Any) -> dict[str, Any]:
    """One writer: its own store, each round started together with the other writer."""
    stored, retries = 0, 0
    runs: list[str] = []
    with open_store(url) as store:
        for batch in batches:
            barrier.wait(timeout=30)
            while True:
                try:
                    result = store.write_events(batch)
                except StoreWriteError:
                    retries += 1  # what the persistence gate would do; counted
                    continue
                break
            stored += result.stored
            runs.extend(result.dag_runs)
    return {"stored": stored, "runs": runs, "retries": retries}


def _executor(kind: str) -> tuple[Executor, Any]:
    if kind == "threads":
        return ThreadPoolExecutor(max_workers=WRITERS), threading.Barrier(WRITERS)
    context = multiprocessing.get_context("spawn")
    manager = context.Manager()
    return ProcessPoolExecutor(max_workers=WRITERS, mp_context=context), manager.Barrier(WRITERS)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_concurrent_writers_store_each_key_once_and_queue_no_run_twice(
    postgres: Backend, store: MetadataStore, kind: str
) -> None:
    ids = _define(store)
    executor, barrier = _executor(kind)
    with executor:
        futures = [executor.submit(write_rounds, postgres.url, _batches(ids, w), barrier)
                   for w in range(WRITERS)]
        results = [future.result(timeout=120) for future in futures]

    keys = {(e.idem_key) for w in range(WRITERS) for b in _batches(ids, w) for e in b}
    counts = store.counts()
    assert counts["trigger_events"] == len(keys) == sum(r["stored"] for r in results)
    assert [r["retries"] for r in results] == [0] * WRITERS, "writers deadlocked"
    # asset events: one per stored event and watching asset (a is watched by a and both)
    per_trigger = dict(postgres.query(
        "SELECT trigger_id, count(*) FROM trigger_events GROUP BY trigger_id"))
    assert counts["asset_events"] == 2 * per_trigger.get(ids["a"], 0) + per_trigger.get(
        ids["b"], 0)
    # every run reported by exactly one writer, and every run in the database reported
    reported = [run for r in results for run in r["runs"]]
    assert len(reported) == len(set(reported)) == counts["dag_runs"]
    assert postgres.query(
        "SELECT r.dag_id, l.asset_event_id FROM dag_run_asset_events l"
        " JOIN dag_runs r ON r.id = l.dag_run_id"
        " GROUP BY r.dag_id, l.asset_event_id HAVING count(*) > 1") == []
    # each_a: one run per event of a; any: one per event (of a through both, or of b)
    runs = dict(postgres.query("SELECT dag_id, count(*) FROM dag_runs GROUP BY dag_id"))
    assert runs["each_a"] == per_trigger[ids["a"]]
    assert runs["any"] == per_trigger[ids["a"]] + per_trigger[ids["b"]]
    # a_and_b: every asset event of a and b is either consumed by one run or still queued
    consumed = postgres.query(
        "SELECT l.asset_event_id FROM dag_run_asset_events l JOIN dag_runs r"
        " ON r.id = l.dag_run_id WHERE r.dag_id = 'a_and_b'")
    queued = postgres.query("SELECT asset_event_id FROM asset_dag_queue WHERE dag_id = 'a_and_b'")
    of_a_and_b = postgres.query(
        "SELECT ae.id FROM asset_events ae JOIN assets s ON s.id = ae.asset_id"
        " WHERE s.name IN ('a', 'b')")
    assert sorted(consumed + queued) == sorted(of_a_and_b)


def test_a_run_id_names_the_largest_event_it_consumed(
    postgres: Backend, store: MetadataStore
) -> None:
    ids = _define(store)
    store.write_events([PendingEvent(ids["a"], "x", b"")])
    run = next(r for r in store.list_runs() if r.dag_id == "each_a")
    assert run.run_id == f"asset_triggered__{max(run.asset_event_ids):012d}"


def test_sync_waits_for_a_batch_being_written_and_the_batch_sees_one_generation(
    postgres: Backend, store: MetadataStore
) -> None:
    ids = _define(store)
    other = postgres.open()
    done: list[str] = []

    def sync_again() -> None:
        _define(other)
        done.append("sync")

    writer = threading.Thread(target=sync_again)
    for n in range(20):
        if n == 5:
            writer.start()
        store.write_events([PendingEvent(ids["a"], f"k{n}", b"")])
    writer.join(timeout=30)
    assert done == ["sync"]
    assert store.counts()["trigger_events"] == 20


def test_a_server_that_does_not_answer_is_one_line_without_the_password() -> None:
    url = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/meta"
    with pytest.raises(StoreError) as info:
        open_store(url, connect_timeout=2)
    message = str(info.value)
    assert message.startswith("cannot connect to postgresql://app:********@127.0.0.1:")
    assert "hunter2" not in message
    assert "\n" not in message


def test_unknown_url_schemes_are_refused() -> None:
    with pytest.raises(StoreError, match=r"unknown store URL 'mysql://u:\*+@db/x'"):
        open_store("mysql://u:secret@db/x")


def test_the_pool_is_bounded_and_shared_between_threads(postgres: Backend) -> None:
    with open_store(postgres.url, pool_size=2) as shared:
        shared.migrate()
        ids = _define(shared)
        errors: list[BaseException] = []

        def write(n: int) -> Callable[[], None]:
            def run() -> None:
                try:
                    for i in range(10):
                        shared.write_events([PendingEvent(ids["b"], f"{n}-{i}", b"")])
                except BaseException as exc:  # noqa: BLE001 - reported by the assert below
                    errors.append(exc)
            return run

        threads = [threading.Thread(target=write(n)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert shared.counts()["trigger_events"] == 40
        assert postgres.query("SELECT count(*) FROM pg_stat_activity"
                              " WHERE datname = current_database()")[0][0] <= 2 + 1
