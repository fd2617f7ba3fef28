"""The outbox (``sharedstream.store.outbox``) on every backend: claims, results, the fence,
takeover from a dead triggerer, paused DAGs, retries, marks, manual runs, counts and pruning."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from sharedstream.engine.producer import DeadLetter
from sharedstream.store import (
    DagSpec,
    DispatchResult,
    MetadataStore,
    PendingEvent,
    StoreError,
    TriggerSpec,
    WatcherSpec,
)
from tests.store.conftest import Backend

TARGETS = {"ship": "local", "audit": "airflow"}


def define(store: MetadataStore) -> int:
    """Trigger ``t`` watched by asset ``a``; DAGs ``ship`` and ``audit`` each run on ``a``."""
    ids = store.sync_definitions(
        [TriggerSpec("fp", "pkg.T", b"kw")], [WatcherSpec("a", "w", "fp")],
        [DagSpec("ship", {"asset": "a"}, target={"name": "local"}),
         DagSpec("audit", {"asset": "a"}, target={"name": "airflow", "options": {"mode": "x"}})])
    return ids["fp"]


def fire(store: MetadataStore, trigger: int, *keys: str) -> None:
    store.write_events([PendingEvent(trigger, key, f'{{"k": "{key}"}}'.encode()) for key in keys])


def alive(store: MetadataStore, *triggerers: str) -> None:
    for name in triggerers:
        store.heartbeat(name, "host", 1)


def states(store: MetadataStore, dag_id: str | None = None) -> list[str]:
    return [r.state for r in reversed(store.list_runs(dag_id=dag_id))]


def test_a_claim_takes_due_runs_in_order_with_their_events(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1", "k2")
    alive(store, "t1")
    claimed = store.claim_runs("t1", {"ship": "local"}, 10, 30.0)
    assert [(r.dag_id, r.run_id, r.attempt, r.tries, r.state, r.target) for r in claimed] == [
        ("ship", "asset_triggered__000000000001", 1, 1, "dispatching", "local"),
        ("ship", "asset_triggered__000000000002", 1, 1, "dispatching", "local"),
    ]
    (event,) = claimed[0].events
    assert (event.asset, event.asset_event_id, event.payload) == ("a", 1, b'{"k": "k1"}')
    assert not claimed[0].recovered
    assert states(store, "ship") == ["dispatching", "dispatching"]
    assert states(store, "audit") == ["queued", "queued"]  # not asked for
    assert store.claim_runs("t1", {"ship": "local"}, 10, 30.0) == []  # nothing twice
    (attempt,) = store.run_attempts(claimed[0].id)
    assert (attempt.attempt, attempt.triggerer_id, attempt.target, attempt.outcome) == (
        1, "t1", "local", None)


def test_results_move_a_run_on_and_release_it_when_it_finishes(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1")
    (run,) = store.claim_runs("t1", {"audit": "airflow"}, 10, 30.0)
    applied = store.record_dispatch("t1", [DispatchResult(
        run.id, "dispatched", attempt=1, detail="200 created", external_id="x",
        external_url="http://af/x")])
    assert applied == 1
    (row,) = store.list_runs(dag_id="audit")
    assert (row.state, row.external_id, row.external_url, row.attempts) == (
        "dispatched", "x", "http://af/x", 1)
    assert row.dispatched_at is not None
    assert row.ended_at is None
    (followed,) = store.follow_runs("t1", {"audit": "airflow"}, 10, 30.0)
    assert (followed.id, followed.state, followed.events) == (run.id, "dispatched", ())
    store.record_dispatch("t1", [DispatchResult(run.id, "running")])
    store.record_dispatch("t1", [DispatchResult(run.id, "success")])
    (row,) = store.list_runs(dag_id="audit")
    assert (row.state, row.ended_at is not None) == ("success", True)
    assert store.follow_runs("t1", {"audit": "airflow"}, 10, 30.0) == []
    (attempt,) = store.run_attempts(run.id)
    assert (attempt.outcome, attempt.detail) == ("dispatched", "200 created")


def test_a_retry_waits_for_its_time_and_keeps_the_error(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1")
    (run,) = store.claim_runs("t1", {"ship": "local"}, 10, 30.0)
    later = datetime.now(UTC) + timedelta(seconds=0.5)
    store.record_dispatch("t1", [DispatchResult(run.id, "queued", attempt=1,
                                                detail="connection refused",
                                                next_attempt_at=later)])
    (row,) = store.list_runs(dag_id="ship")
    assert (row.state, row.last_error) == ("queued", "connection refused")
    assert store.claim_runs("t1", {"ship": "local"}, 10, 30.0) == []
    time.sleep(0.6)
    (again,) = store.claim_runs("t1", {"ship": "local"}, 10, 30.0)
    assert (again.attempt, again.tries) == (2, 2)
    assert [a.outcome for a in store.run_attempts(run.id)] == ["queued", None]


def test_a_result_from_a_triggerer_that_lost_the_run_is_fenced_out(
        store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1")
    (run,) = store.claim_runs("t1", {"ship": "local"}, 10, 30.0)
    assert store.record_dispatch("t2", [DispatchResult(run.id, "success", attempt=1)]) == 0
    assert states(store, "ship") == ["dispatching"]
    assert store.mark_runs([run.id], "failed", "given up by hand") == 1
    assert store.record_dispatch("t1", [DispatchResult(run.id, "success", attempt=1)]) == 0
    (row,) = store.list_runs(dag_id="ship")
    assert (row.state, row.last_error) == ("failed", "given up by hand")


def test_a_dead_triggerers_runs_are_recovered_by_another(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1", "k2")
    alive(store, "t1", "t2")
    first = store.claim_runs("t1", {"ship": "local"}, 1, 30.0)
    (delivered,) = store.claim_runs("t1", {"audit": "airflow"}, 1, 30.0)
    store.record_dispatch("t1", [DispatchResult(delivered.id, "dispatched", attempt=1)])
    # t1 is alive: t2 takes nothing of it
    (other,) = store.claim_runs("t2", {"ship": "local"}, 10, 30.0)
    assert other.id != first[0].id
    assert store.follow_runs("t2", {"audit": "airflow"}, 10, 30.0) == []
    time.sleep(0.3)
    alive(store, "t2")  # t1 is silent from now on
    (recovered,) = store.claim_runs("t2", {"ship": "local"}, 10, 0.2)
    assert (recovered.id, recovered.recovered, recovered.attempt) == (first[0].id, True, 2)
    assert [(a.triggerer_id, a.outcome) for a in store.run_attempts(recovered.id)] == [
        ("t1", "unknown"), ("t2", None)]
    (followed,) = store.follow_runs("t2", {"audit": "airflow"}, 10, 0.2)
    assert followed.id == delivered.id
    assert store.record_dispatch("t1", [DispatchResult(delivered.id, "failed")]) == 0
    assert store.record_dispatch("t2", [DispatchResult(delivered.id, "success")]) == 1


def test_a_graceful_stop_hands_followed_runs_over_at_once(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1", "t2")
    (run,) = store.claim_runs("t1", {"audit": "airflow"}, 1, 30.0)
    store.record_dispatch("t1", [DispatchResult(run.id, "dispatched", attempt=1)])
    store.release_runs("t1")
    assert [r.id for r in store.follow_runs("t2", {"audit": "airflow"}, 10, 30.0)] == [run.id]


def test_runs_claimed_ahead_and_never_started_are_handed_back(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1", "k2")
    alive(store, "t1", "t2")
    first, second = store.claim_runs("t1", {"ship": "local"}, 2, 30.0)
    store.record_dispatch("t1", [DispatchResult(first.id, "success", attempt=1)])
    # the finished run and a pair naming another attempt are left alone; t2 holds no claim
    assert store.unclaim_runs("t2", [(second.id, 1)]) == 0
    assert store.unclaim_runs("t1", [(first.id, 1), (second.id, 2)]) == 0
    assert store.unclaim_runs("t1", [(first.id, 1), (second.id, 1)]) == 1
    assert store.unclaim_runs("t1", [(second.id, 1)]) == 0  # idempotent
    assert store.run_attempts(second.id) == []
    (again,) = store.claim_runs("t2", {"ship": "local"}, 10, 30.0)
    assert (again.id, again.attempt, again.tries, again.recovered) == (second.id, 1, 1, False)
    assert [(a.attempt, a.triggerer_id) for a in store.run_attempts(second.id)] == [(1, "t2")]


def test_a_paused_dags_runs_wait(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1")
    assert store.set_dag_paused("ship", True) is True
    assert store.set_dag_paused("nope", True) is False
    assert store.claim_runs("t1", TARGETS, 10, 30.0)[0].dag_id == "audit"
    assert store.claim_runs("t1", TARGETS, 10, 30.0) == []
    assert [d.paused for d in store.list_dags()] == [False, True]  # audit, ship
    define(store)  # a restart's sync keeps the pause
    assert [d.paused for d in store.list_dags()] == [False, True]
    store.set_dag_paused("ship", False)
    assert [r.dag_id for r in store.claim_runs("t1", TARGETS, 10, 30.0)] == ["ship"]


def test_dags_keep_their_target(store: MetadataStore) -> None:
    define(store)
    assert {d.dag_id: d.target for d in store.list_dags()} == {
        "audit": {"name": "airflow", "options": {"mode": "x"}}, "ship": {"name": "local"}}


def test_retry_starts_a_new_budget_and_mark_ends_a_run(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1")
    (run,) = store.claim_runs("t1", {"ship": "local"}, 1, 30.0)
    store.record_dispatch("t1", [DispatchResult(run.id, "undeliverable", attempt=1,
                                                detail="404 no such DAG")])
    assert store.retry_runs([run.id, 999]) == 1
    assert store.retry_runs([run.id]) == 0  # queued now: not finished
    (again,) = store.claim_runs("t1", {"ship": "local"}, 1, 30.0)
    assert (again.attempt, again.tries) == (2, 1)
    assert store.mark_runs([again.id], "success", "ran it by hand") == 1
    (row,) = store.list_runs(dag_id="ship")
    assert (row.state, row.last_error) == ("success", "ran it by hand")
    assert store.run_attempts(run.id)[-1].outcome == "unknown"
    with pytest.raises(StoreError, match="marked success or failed"):
        store.mark_runs([run.id], "queued", "no")


def test_a_manual_run_is_queued_once_with_its_conf(store: MetadataStore) -> None:
    define(store)
    assert store.queue_manual_run("ship", "manual__1", {"why": "test", "n": [1]}) is True
    assert store.queue_manual_run("ship", "manual__1", {"other": 1}) is False
    with pytest.raises(StoreError, match="no DAG 'nope'"):
        store.queue_manual_run("nope", "manual__1", {})
    (row,) = store.list_runs(dag_id="ship")
    assert (row.run_type, row.state, row.conf) == ("manual", "queued", {"why": "test", "n": [1]})
    alive(store, "t1")
    (run,) = store.claim_runs("t1", {"ship": "local"}, 1, 30.0)
    assert (run.run_type, run.conf, run.events) == ("manual", {"why": "test", "n": [1]}, ())
    found = store.get_run("ship", "manual__1")
    assert found is not None
    assert found.conf == {"why": "test", "n": [1]}
    assert store.get_run("ship", "manual__2") is None


def test_runs_are_listed_by_state_and_counted_while_unfinished(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1", "k2")
    alive(store, "t1")
    (run, _) = store.claim_runs("t1", {"ship": "local"}, 10, 30.0)
    store.record_dispatch("t1", [DispatchResult(run.id, "success", attempt=1)])
    assert [r.run_id for r in store.list_runs(state="success")] == [run.run_id]
    assert len(store.list_runs(state="queued")) == 2
    with pytest.raises(ValueError, match="no run state 'done'"):
        store.list_runs(state="done")
    assert store.run_counts() == {("ship", "local", "dispatching"): 1,
                                  ("audit", "", "queued"): 2}


def test_prune_deletes_only_what_finished_before_the_cutoff(
        store: MetadataStore, backend: Backend) -> None:
    trigger = define(store)
    fire(store, trigger, "k1", "k2")
    alive(store, "t1")
    claimed = store.claim_runs("t1", {"ship": "local", "audit": "airflow"}, 10, 30.0)
    finished = [r for r in claimed if r.run_id == "asset_triggered__000000000001"]
    store.record_dispatch("t1", [DispatchResult(r.id, "success", attempt=1) for r in finished])
    store.add_dead_letter(DeadLetter(stream="s", source="src", reason="r", triggers=(),
                                     payload=b"x"))
    assert store.prune(datetime.now(UTC) - timedelta(hours=1)).total() == 0
    result = store.prune(datetime.now(UTC) + timedelta(seconds=1))
    # both runs of event k1 finished: they, their links, and event k1 go; k2's runs wait
    assert (result.dag_runs, result.trigger_events, result.asset_events, result.dead_letters,
            result.triggerers) == (2, 1, 1, 1, 1)
    assert sorted(r.run_id for r in store.list_runs()) == ["asset_triggered__000000000002"] * 2
    assert [e.idem_key for e in store.list_events()] == ["k2"]
    assert store.dead_letters(10) == []
    assert backend.query("SELECT count(*) FROM dag_run_attempts") == [(2,)]


def test_concurrent_claimers_never_share_a_run(backend: Backend) -> None:
    store = backend.open()
    store.migrate()
    trigger = define(store)
    for start in range(0, 200, 50):
        fire(store, trigger, *(f"k{i}" for i in range(start, start + 50)))
    names = ("t1", "t2", "t3")
    alive(store, *names)
    got: dict[str, list[int]] = {name: [] for name in names}
    stores = {name: backend.open() for name in names}

    def claim(name: str) -> None:
        while batch := stores[name].claim_runs(name, TARGETS, 7, 30.0):
            got[name] += [r.id for r in batch]

    threads = [threading.Thread(target=claim, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    every = [run for runs in got.values() for run in runs]
    assert len(every) == len(set(every)) == 400


def test_a_run_running_in_place_is_recovered_one_a_target_took_is_not(
        store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, "k1")
    alive(store, "t1")
    (local,) = store.claim_runs("t1", {"ship": "local"}, 1, 30.0)
    (taken,) = store.claim_runs("t1", {"audit": "airflow"}, 1, 30.0)
    store.record_dispatch("t1", [
        DispatchResult(local.id, "running"),  # running in place: its attempt is open
        DispatchResult(taken.id, "running", attempt=1),  # the target has it: attempt over
    ])
    time.sleep(0.3)
    alive(store, "t2")
    (again,) = store.claim_runs("t2", TARGETS, 10, 0.2)
    assert (again.id, again.recovered, again.attempt) == (local.id, True, 2)
    assert [r.id for r in store.follow_runs("t2", {"audit": "airflow"}, 10, 0.2)] == [taken.id]


def test_prune_takes_a_bounded_bite_and_says_there_is_more(store: MetadataStore) -> None:
    trigger = define(store)
    fire(store, trigger, *(f"k{i}" for i in range(5)))
    alive(store, "t1")
    claimed = store.claim_runs("t1", TARGETS, 100, 30.0)
    store.record_dispatch("t1", [DispatchResult(r.id, "success", attempt=1) for r in claimed])
    later = datetime.now(UTC) + timedelta(seconds=1)
    first = store.prune(later, limit=4)
    assert (first.dag_runs, first.more) == (4, True)
    rest = [store.prune(later, limit=4) for _ in range(3)]
    assert [r.dag_runs for r in rest] == [4, 2, 0]
    assert rest[-1].more is False
    assert store.counts() == {"triggers": 1, "trigger_events": 0, "asset_events": 0,
                              "dag_runs": 0}


# -- batched DAGs (Airflow 3.4's batch_asset_events = True, bounded) ----------------------


def batched(store: MetadataStore, batching: dict[str, object],
            schedule: dict[str, object] | None = None) -> dict[str, int]:
    """Triggers ``a`` and ``b`` watched by assets ``a``, ``b``; DAG ``d`` batched on ``a``."""
    ids = store.sync_definitions(
        [TriggerSpec(f"fp-{t}", f"pkg.{t}", b"kw") for t in "ab"],
        [WatcherSpec(t, "w", f"fp-{t}") for t in "ab"],
        [DagSpec("d", schedule or {"asset": "a"}, batching=batching),
         DagSpec("each", {"asset": "a"})])
    return {t: ids[f"fp-{t}"] for t in "ab"}


def consumed(store: MetadataStore, dag_id: str = "d") -> list[tuple[int, ...]]:
    return [r.asset_event_ids for r in reversed(store.list_runs(dag_id=dag_id))]


def test_a_batched_dag_only_queues_and_a_pass_makes_one_run_of_the_queue(
        store: MetadataStore) -> None:
    ids = batched(store, {"max_events": None, "max_wait": None})
    fire(store, ids["a"], "k1", "k2", "k3")
    assert consumed(store) == []
    assert len(consumed(store, "each")) == 3  # an unbatched DAG: one run per event
    assert store.release_batches() == ["d/asset_triggered__000000000003"]
    assert consumed(store) == [(1, 2, 3)]
    assert store.release_batches() == []
    (row,) = store.list_dags()[:1]
    assert row.batching == {"max_events": None, "max_wait": None}


def test_max_events_makes_full_batches_and_the_rest_waits_for_max_wait(
        store: MetadataStore) -> None:
    ids = batched(store, {"max_events": 2, "max_wait": 0.4})
    fire(store, ids["a"], *(f"k{i}" for i in range(5)))
    assert store.release_batches() == ["d/asset_triggered__000000000002",
                                       "d/asset_triggered__000000000004"]
    assert store.release_batches() == []  # the fifth waits for its batch, or max_wait
    time.sleep(0.5)
    assert store.release_batches() == ["d/asset_triggered__000000000005"]
    assert consumed(store) == [(1, 2), (3, 4), (5,)]


def test_a_batch_waits_for_its_whole_condition(store: MetadataStore) -> None:
    ids = batched(store, {"max_events": None, "max_wait": None},
                  schedule={"all": [{"asset": "a"}, {"asset": "b"}]})
    fire(store, ids["a"], "a1", "a2")
    assert store.release_batches() == []
    fire(store, ids["b"], "b1")
    assert store.release_batches() == ["d/asset_triggered__000000000003"]
    assert consumed(store) == [(1, 2, 3)]


def test_concurrent_passes_consume_each_event_once(backend: Backend) -> None:
    store = backend.open()
    store.migrate()
    ids = batched(store, {"max_events": 3, "max_wait": None})
    fire(store, ids["a"], *(f"k{i}" for i in range(60)))
    others = [backend.open() for _ in range(3)]
    made: list[str] = []

    def release(s: MetadataStore) -> None:
        made.extend(s.release_batches())

    threads = [threading.Thread(target=release, args=(s,)) for s in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(made) == len(set(made)) == 20
    every = [i for run in consumed(store) for i in run]
    assert sorted(every) == list(range(1, 61))
