"""The coalesced committer against a scripted commit function (no broker, no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sharedstream.brokerkit.coalesced_commits import CoalescedCommitter
from sharedstream.engine.errors import SharedStreamError


class Broker:
    """Records commits; a commit can be held in flight until the test releases it."""

    def __init__(self) -> None:
        self.commits: list[dict[str, int]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.refuse = False
        self.fail: SharedStreamError | None = None

    async def commit(self, offsets: dict[str, int]) -> bool:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.entered.set()
            if self.hold:
                await self.release.wait()
            if self.fail is not None:
                raise self.fail
            if self.refuse:
                return False
            self.commits.append(dict(offsets))
            return True
        finally:
            self.in_flight -= 1


async def settle() -> None:
    """Let every ready task run until none has anything left to do without the test."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
async def committer(broker: Broker) -> AsyncIterator[CoalescedCommitter[str]]:
    fatal: list[BaseException] = []
    committer: CoalescedCommitter[str] = CoalescedCommitter(
        broker.commit, name="test-commit", on_fatal=fatal.append, close_timeout=5.0)
    committer.open("a", 1)
    committer.open("b", 1)
    committer.start()
    yield committer
    broker.hold = False
    broker.release.set()
    await committer.close()


async def test_targets_arriving_during_a_commit_go_out_together_in_the_next(
    broker: Broker, committer: CoalescedCommitter[str],
) -> None:
    broker.hold = True
    committer.want("a", 1, 5)
    await broker.entered.wait()  # {a: 5} is in flight
    for offset in (6, 7, 9):
        committer.want("a", 1, offset)
    committer.want("b", 1, 3)
    committer.want("a", 1, 8)  # below the target: ignored
    broker.hold = False
    broker.release.set()
    await settle()
    assert broker.commits == [{"a": 5}, {"a": 9, "b": 3}]
    assert broker.most_in_flight == 1
    assert committer.pending() == {}


async def test_revoke_waits_for_the_commit_in_flight_then_commits_what_is_owed(
    broker: Broker, committer: CoalescedCommitter[str],
) -> None:
    broker.hold = True
    committer.want("a", 1, 5)
    await broker.entered.wait()
    committer.want("a", 1, 7)
    committer.want("b", 1, 2)
    revoking = asyncio.create_task(committer.revoke(["a"]))
    await settle()
    assert not revoking.done(), "revoke returns only after the commit in flight"
    broker.hold = False
    broker.release.set()
    await revoking
    assert broker.commits[:2] == [{"a": 5}, {"a": 7}], "revoke committed a's last target"
    committer.want("a", 1, 10)  # a record of the revoked assignment, advanced late
    committer.open("a", 2)  # reassigned
    committer.want("a", 1, 11)  # still the old epoch
    await committer.flush()
    assert all(commit.get("a", 0) <= 7 for commit in broker.commits), broker.commits
    assert broker.commits[-1] == {"b": 2}
    assert broker.most_in_flight == 1


async def test_a_refused_commit_leaves_its_targets_pending(
    broker: Broker, committer: CoalescedCommitter[str],
) -> None:
    broker.refuse = True
    committer.want("a", 1, 4)
    await settle()
    assert committer.pending() == {"a": 4}
    broker.refuse = False
    committer.want("b", 1, 1)
    await settle()
    assert broker.commits == [{"a": 4, "b": 1}]


async def test_a_fatal_error_stops_committing_and_is_reported(broker: Broker) -> None:
    fatal: list[BaseException] = []
    committer: CoalescedCommitter[str] = CoalescedCommitter(
        broker.commit, name="test-commit", on_fatal=fatal.append, close_timeout=5.0)
    committer.open("a", 1)
    committer.start()
    broker.fail = SharedStreamError("gone for good")
    committer.want("a", 1, 1)
    await settle()
    assert committer.error is broker.fail
    assert fatal == [broker.fail]
    broker.fail = None
    committer.want("a", 1, 2)
    await settle()
    assert broker.commits == [], "nothing is committed after a fatal error"
    await committer.close()


async def test_close_commits_the_final_targets_once(
    broker: Broker, committer: CoalescedCommitter[str],
) -> None:
    broker.hold = True
    committer.want("a", 1, 3)
    await broker.entered.wait()
    committer.want("a", 1, 6)
    closing = asyncio.create_task(committer.close())
    await settle()
    assert not closing.done()
    broker.hold = False
    broker.release.set()
    await closing
    assert broker.commits == [{"a": 3}, {"a": 6}]
    await committer.close()
    assert len(broker.commits) == 2
