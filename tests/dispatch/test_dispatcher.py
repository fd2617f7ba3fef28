"""The dispatcher against a real SQLite store: each run delivered once, retries with backoff,
the retry budget, concurrency bounds, follow-ups, wake-ups, and what a stop leaves behind."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from sharedstream.dispatch.target import Delivery, TargetError
from sharedstream.store import PendingEvent
from tests.dispatch.conftest import ScriptedTarget, World, running, settings
from tests.engine.harness import eventually


async def test_every_run_is_delivered_once_with_its_events(world: World) -> None:
    world.fire(20)
    target = ScriptedTarget("t", settings())
    async with running(world.dispatcher(target)):
        await eventually(lambda: world.states() == ["dispatched"] * 20, within=10)
    assert Counter(run.run_id for run in target.delivered).most_common(1)[0][1] == 1
    first = min(target.delivered, key=lambda run: run.run_id)
    assert [event.payload for event in first.events] == [{"n": 0}]
    assert (first.dag_id, first.attempt, first.recovered) == ("d", 1, False)
    assert world.states("e") == ["queued"] * 20  # not this dispatcher's DAG
    assert (target.opened, target.closed) == (1, 1)


async def test_a_retryable_failure_is_retried_with_backoff_then_delivered(world: World) -> None:
    world.fire(1)
    target = ScriptedTarget("t", settings())
    run_id = "asset_triggered__000000000001"
    target.script[run_id] = [TargetError("503 busy", retryable=True),
                             TargetError("connection refused", retryable=True),
                             Delivery("success", detail="ran")]
    dispatcher = world.dispatcher(target)
    async with running(dispatcher):
        await eventually(lambda: world.states() == ["success"], within=10)
    assert [run.attempt for run in target.delivered] == [1, 2, 3]
    (row,) = world.store.list_runs(dag_id="d")
    assert (row.attempts, row.last_error) == (3, "connection refused")
    attempts = world.store.run_attempts(row.id)
    assert [(a.outcome, a.detail) for a in attempts] == [
        ("queued", "503 busy"), ("queued", "connection refused"), ("success", "ran")]
    gaps = [(b.started_at - a.started_at).total_seconds() for a, b in pairwise(attempts)]
    assert gaps[0] >= 0.05  # the first backoff
    assert gaps[1] >= 0.1  # doubled
    stats = dispatcher.stats["t"]
    assert (stats.retried, stats.succeeded, stats.consecutive_failures) == (2, 1, 0)


async def test_the_retry_budget_ends_in_undeliverable(world: World) -> None:
    world.fire(2)
    target = ScriptedTarget("t", settings(max_attempts=3))
    target.default = TargetError("connection refused", retryable=True)
    target.script["asset_triggered__000000000002"] = [
        TargetError("400 bad dag_run_id", retryable=False)]
    dispatcher = world.dispatcher(target)
    async with running(dispatcher):
        await eventually(lambda: world.states() == ["undeliverable"] * 2, within=10)
    tries = Counter(run.run_id for run in target.delivered)
    assert tries == {"asset_triggered__000000000001": 3, "asset_triggered__000000000002": 1}
    errors = {r.run_id: r.last_error for r in world.store.list_runs(dag_id="d")}
    assert errors["asset_triggered__000000000002"] == "400 bad dag_run_id"
    assert dispatcher.health() == [("t", False, "4 attempts failed in a row; last: "
                                          "connection refused")]


async def test_a_person_retrying_an_undeliverable_run_gets_a_new_budget(world: World) -> None:
    world.fire(1)
    target = ScriptedTarget("t", settings(max_attempts=1))
    target.default = TargetError("404 no such DAG", retryable=True)
    async with running(world.dispatcher(target)):
        await eventually(lambda: world.states() == ["undeliverable"], within=10)
        (row,) = world.store.list_runs(dag_id="d")
        target.default = Delivery("success")
        assert world.store.retry_runs([row.id]) == 1
        await eventually(lambda: world.states() == ["success"], within=10)
    assert [run.attempt for run in target.delivered] == [1, 2]


async def test_deliveries_never_exceed_the_targets_concurrency(world: World) -> None:
    world.fire(12)
    target = ScriptedTarget("t", settings(max_concurrency=3))

    async def slow() -> Delivery:
        await asyncio.sleep(0.02)
        return Delivery("success")

    target.default = slow
    async with running(world.dispatcher(target, claim_batch=2)):
        await eventually(lambda: world.states() == ["success"] * 12, within=10)
    assert target.most_busy == 3


async def test_a_wake_claims_new_runs_at_once(world: World) -> None:
    target = ScriptedTarget("t", settings())
    dispatcher = world.dispatcher(target, poll_interval=30.0)
    async with running(dispatcher):
        await asyncio.sleep(0.05)
        world.fire(1)
        dispatcher.wake()
        await eventually(lambda: world.states() == ["dispatched"], within=2.0)


async def test_follow_ups_record_what_became_of_a_run(world: World) -> None:
    world.fire(2)
    target = ScriptedTarget("t", settings())
    async with running(world.dispatcher(target)):
        await eventually(lambda: world.states() == ["dispatched"] * 2, within=10)
        target.status_of["asset_triggered__000000000001"] = Delivery("running")
        target.status_of["asset_triggered__000000000002"] = Delivery("failed", detail="task 1")
        await eventually(lambda: world.states() == ["running", "failed"], within=10)
        target.status_of["asset_triggered__000000000001"] = Delivery("success")
        await eventually(lambda: world.states() == ["success", "failed"], within=10)
    rows = {r.run_id: r for r in world.store.list_runs(dag_id="d")}
    assert rows["asset_triggered__000000000002"].last_error == "task 1"
    assert all(r.ended_at is not None for r in rows.values())


async def test_a_run_taken_over_from_a_dead_triggerer_says_so(world: World) -> None:
    world.fire(1)
    world.store.claim_runs("dead", {"d": "t"}, 10, 30.0)  # claimed, never recorded
    target = ScriptedTarget("t", settings())
    async with running(world.dispatcher(target, threshold=0.0)):
        await eventually(lambda: world.states() == ["dispatched"], within=10)
    (run,) = target.delivered
    assert (run.attempt, run.recovered) == (2, True)


async def test_a_payload_that_cannot_be_read_makes_the_run_undeliverable(world: World) -> None:
    world.store.write_events([PendingEvent(world.trigger, "bad", b"\xc1 not msgpack")])
    target = ScriptedTarget("t", settings())
    async with running(world.dispatcher(target)):
        await eventually(lambda: world.states() == ["undeliverable"], within=10)
    assert target.delivered == []
    (row,) = world.store.list_runs(dag_id="d")
    assert row.last_error is not None
    assert row.last_error.startswith("an event payload cannot be read")


async def test_a_hanging_delivery_is_given_up_after_the_timeout_plus_grace(
        world: World) -> None:
    world.fire(1)
    target = ScriptedTarget("t", settings(timeout=0.05, max_attempts=1))

    async def hang() -> Delivery:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    target.default = hang
    import sharedstream.dispatch.dispatcher as module  # noqa: PLC0415

    grace, module._GRACE = module._GRACE, 0.05  # a short grace for the test
    try:
        async with running(world.dispatcher(target)):
            await eventually(lambda: world.states() == ["undeliverable"], within=10)
    finally:
        module._GRACE = grace
    (row,) = world.store.list_runs(dag_id="d")
    assert row.last_error == "no answer within 0.05 s"


async def test_a_stop_lets_deliveries_under_way_finish_and_records_them(world: World) -> None:
    world.fire(3)
    target = ScriptedTarget("t", settings())
    started = asyncio.Event()

    async def slow() -> Delivery:
        started.set()
        await asyncio.sleep(0.2)
        return Delivery("success")

    target.default = slow
    dispatcher = world.dispatcher(target)
    await dispatcher.open()
    task = asyncio.create_task(dispatcher.run())
    await started.wait()
    dispatcher.begin_stop()
    await asyncio.wait_for(task, 5)
    assert world.states() == ["success"] * 3
    await dispatcher.release()


async def test_a_stop_hands_back_the_runs_claimed_ahead(world: World) -> None:
    world.fire(6)
    target = ScriptedTarget("t", settings(max_concurrency=2))
    release = asyncio.Event()

    async def held() -> Delivery:
        await release.wait()
        return Delivery("success")

    target.default = held
    dispatcher = world.dispatcher(target, claim_ahead=2)
    await dispatcher.open()
    task = asyncio.create_task(dispatcher.run())
    # two under way, two more claimed ahead (dispatching, not started), two still queued
    await eventually(lambda: target.busy == 2 and world.states().count("dispatching") == 4,
                     within=10)
    dispatcher.begin_stop()
    release.set()
    await asyncio.wait_for(task, 5)
    assert world.states() == ["success"] * 2 + ["queued"] * 4
    assert len(target.delivered) == 2
    later = ScriptedTarget("t", settings())
    async with running(world.dispatcher(later, triggerer="t2")):
        await eventually(lambda: world.states() == ["success"] * 2 + ["dispatched"] * 4,
                         within=10)
    assert [(run.attempt, run.recovered) for run in later.delivered] == [(1, False)] * 4


async def test_a_freed_slot_starts_the_next_run_without_waiting_for_a_claim(
        world: World) -> None:
    world.fire(5)
    target = ScriptedTarget("t", settings(max_concurrency=1))
    target.default = Delivery("success")
    claims = 0
    store_slow = asyncio.Event()

    async def slow_claims(fn: Callable[..., Any], *args: Any) -> Any:
        nonlocal claims
        if fn.__name__ == "claim_runs":
            claims += 1
            if claims > 1:
                await store_slow.wait()  # every claim after the first hangs until released
        return await world.db(fn, *args)

    async with running(world.dispatcher(target, db=slow_claims, claim_ahead=1)):
        # the first claim took two (one to start, one ahead): both ran with the next claim stuck
        await eventually(lambda: world.states()[:2] == ["success"] * 2, within=10)
        assert claims == 2
        store_slow.set()
        await eventually(lambda: world.states() == ["success"] * 5, within=10)


async def test_one_claim_serves_the_whole_line(world: World) -> None:
    world.fire(12)
    target = ScriptedTarget("t", settings(max_concurrency=1))
    target.default = Delivery("success")
    claims = 0

    async def counted(fn: Callable[..., Any], *args: Any) -> Any:
        nonlocal claims
        found = await world.db(fn, *args)
        claims += fn.__name__ == "claim_runs" and bool(found)
        return found

    async with running(world.dispatcher(target, db=counted, poll_interval=30.0,
                                        claim_ahead=8)):
        await eventually(lambda: world.states() == ["success"] * 12, within=10)
    assert claims == 2  # 1 + 8 runs, then the 3 left once the line ran out


async def test_a_cancelled_dispatcher_leaves_unfinished_runs_to_be_recovered(
        world: World) -> None:
    world.fire(2)
    target = ScriptedTarget("t", settings())

    async def hang() -> Delivery:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    target.default = hang
    dispatcher = world.dispatcher(target)
    await dispatcher.open()
    task = asyncio.create_task(dispatcher.run())
    await eventually(lambda: target.busy == 2, within=10)
    task.cancel()
    await asyncio.wait({task})
    assert world.states() == ["dispatching"] * 2
    assert target.closed == 1
    second = ScriptedTarget("t", settings())
    async with running(world.dispatcher(second, triggerer="t2", threshold=0.0)):
        await eventually(lambda: world.states() == ["dispatched"] * 2, within=10)
    assert all(run.recovered for run in second.delivered)


async def test_a_long_follow_up_line_is_asked_about_in_turn(world: World) -> None:
    world.fire(5)
    target = ScriptedTarget("t", settings())
    async with running(world.dispatcher(target, claim_batch=2)):
        await eventually(lambda: world.states() == ["dispatched"] * 5, within=10)
        await eventually(lambda: len(set(target.asked)) == 5, within=10)  # not the first two
