"""The standalone-trigger assignment: the store's claims become supervisors, the lease fences."""

from __future__ import annotations

import asyncio

from sharedstream.runtime.assignment import Assignment
from sharedstream.store import Claim


class Supervisors:
    """Fake supervisors: a task per start that runs until cancelled (or told to finish)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.finish: dict[int, asyncio.Event] = {}

    def start(self, trigger_id: int) -> asyncio.Task[None]:
        self.started.append(trigger_id)
        self.finish[trigger_id] = done = asyncio.Event()

        async def supervise() -> None:
            await done.wait()

        return asyncio.get_running_loop().create_task(supervise(), name=f"t{trigger_id}")


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_claims_start_the_owned_and_stop_the_lost() -> None:
    sup = Supervisors()
    assignment = Assignment(sup.start, lease=3.0)
    assert not assignment.idle  # no round yet
    assignment.apply(Claim(owned=(1, 2), elsewhere=1), began=0.0)
    assert (sup.started, assignment.running) == ([1, 2], [1, 2])
    lost = assignment.tasks[0]
    assignment.apply(Claim(owned=(2, 3), elsewhere=1), began=1.0)
    await settle()
    assert lost.cancelled()
    assert (sup.started, assignment.running) == ([1, 2, 3], [2, 3])
    sup.finish[2].set()  # trigger 2 finished: not restarted while the store still lists it
    await settle()
    assignment.apply(Claim(owned=(2, 3), elsewhere=0), began=2.0)
    assert (sup.started, assignment.running) == ([1, 2, 3], [3])
    assignment.apply(Claim(owned=(), elsewhere=0), began=3.0)
    await settle()
    assert assignment.idle


async def test_a_lapsed_lease_stops_everything_until_a_round_succeeds_again() -> None:
    sup = Supervisors()
    assignment = Assignment(sup.start, lease=3.0)
    assignment.apply(Claim(owned=(1,), elsewhere=0), began=10.0)
    assert assignment.expire(12.0) == 1.0  # a second of the lease left
    held = assignment.tasks
    assert assignment.expire(13.0) is None  # the round that began at 10 s is over
    await settle()
    assert all(task.cancelled() for task in held)
    assert assignment.running == []
    assignment.apply(Claim(owned=(1,), elsewhere=0), began=14.0)
    assert (sup.started, assignment.running) == ([1, 1], [1])


async def test_one_triggerer_stores_never_fence_and_a_closed_assignment_starts_nothing() -> None:
    sup = Supervisors()
    assignment = Assignment(sup.start, lease=None)
    assignment.apply(Claim(owned=(1,), elsewhere=0), began=0.0)
    assert assignment.expire(1e9) is None
    assert assignment.running == [1]
    assignment.close()
    assignment.apply(Claim(owned=(1, 2), elsewhere=0), began=1.0)
    assert sup.started == [1]
    assignment.cancel_all()
    await settle()
    assert assignment.running == []
