"""Two consumer-group members on a real broker: partitions move, commits stay exact.

Two :class:`SharedStreamManager`\\ s in this process are two members of one
Kafka group on a 2-partition Tansu topic. The second member joins while the
first still owes a commit (its commit task is held, like a slow broker
answer), and later the first leaves. A separate consumer watches the group's
committed offsets throughout; every successful commit call is logged with
what the members had seen by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sharedstream import SharedStreamManager, TriggerEvent
from sharedstream.engine.producer import SharedStreamProducer
from sharedstream.producers.kafka import KafkaSharedStreamProducer
from sharedstream.testing.harness import Stream
from sharedstream.testing.runner import SupervisedRunner, eventually
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from tests.kafka.conftest import KafkaHarness, aiokafka

PER_PHASE = 40
"""Records produced in each phase, alternating between the two partitions."""


@dataclass
class Member:
    """What the test sees of one group member (one manager, one producer)."""

    name: str
    commits_open: asyncio.Event = field(default_factory=asyncio.Event)
    """While clear, the member's commit task waits before each commit (a slow broker)."""
    held: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a commit of the commit task waited because ``commits_open`` was clear."""
    revoking: asyncio.Event = field(default_factory=asyncio.Event)
    assigned: list[set[int]] = field(default_factory=list)
    seen: list[tuple[int, int]] = field(default_factory=list)
    """``(partition, offset)`` of every record its trigger received, in order."""


@dataclass(frozen=True)
class CommitRecord:
    member: str
    partition: int
    offset: int
    seen_prefix: int
    """Offsets ``0 .. seen_prefix - 1`` of the partition had reached some member by then."""


MEMBERS: dict[str, Member] = {}
COMMITS: list[CommitRecord] = []


def seen_prefix(partition: int) -> int:
    """The contiguous prefix of ``partition`` that some member has received."""
    seen = {offset for m in MEMBERS.values() for p, offset in m.seen if p == partition}
    prefix = 0
    while prefix in seen:
        prefix += 1
    return prefix


class ObservedProducer(KafkaSharedStreamProducer):
    """The real Kafka producer, logging its commits; its commit task can be held."""

    def __init__(self, member: Member, *args: Any) -> None:
        super().__init__(*args)
        self.member = member

    async def _commit_offsets(self, targets: dict[tuple[str, int], int]) -> bool:
        member = self.member
        task = asyncio.current_task()
        if not member.commits_open.is_set() and task is not None and task.get_name(
                ).startswith("sharedstream-kafka-commit"):
            member.held.set()
            await member.commits_open.wait()
        committed = await super()._commit_offsets(targets)
        if committed:
            COMMITS.extend(CommitRecord(member.name, p, offset, seen_prefix(p))
                           for (_, p), offset in targets.items())
        return committed

    async def _on_revoked(self, revoked: Any) -> None:
        if revoked:  # aiokafka calls this with nothing at the first join too
            self.member.revoking.set()
        await super()._on_revoked(revoked)

    def _on_assigned(self, assigned: Any) -> None:
        super()._on_assigned(assigned)
        self.member.assigned.append({tp.partition for tp in assigned})


class MemberTrigger(KafkaSharedStreamTrigger):
    """Emits every record and notes it for its member."""

    def __init__(self, *, member: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.member = member

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "member": self.member}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return ObservedProducer(MEMBERS[kwargs["member"]], cls._settings_from(kwargs))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[
        TriggerEvent
    ]:
        seen = MEMBERS[self.member].seen
        async for message in shared_stream:
            seen.append((message.partition, message.offset))
            yield TriggerEvent(self.to_payload(message.value, message))


class RunningMember:
    def __init__(self, harness: KafkaHarness, stream: Stream, name: str) -> None:
        MEMBERS[name] = self.member = Member(name)
        self.member.commits_open.set()
        self.stopped = False
        self.manager = SharedStreamManager(ack_timeout=30.0)
        trigger = MemberTrigger(member=name, **harness.trigger_kwargs(stream))
        self.runner = SupervisedRunner(self.manager, trigger, 1).start()

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self.runner.stop()
        await self.manager.stop_all()


async def watch_commits(harness: KafkaHarness, stream: Stream,
                        history: dict[int, list[int]]) -> None:
    """Record every change of the group's committed offsets, as a separate consumer sees them."""
    reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=harness.bootstrap, group_id=stream.group,
                                       enable_auto_commit=False)
    await reader.start()
    try:
        while True:
            for partition, seen in history.items():
                offset = await reader.committed(aiokafka.TopicPartition(stream.name, partition))
                value = int(offset) if offset is not None and offset >= 0 else 0
                if not seen or seen[-1] != value:
                    seen.append(value)
            await asyncio.sleep(0.01)
    finally:
        await reader.stop()


async def test_partitions_move_between_members_without_loss_duplicates_or_stale_commits(
    harness: KafkaHarness,
) -> None:
    MEMBERS.clear()
    COMMITS.clear()
    name = f"rebalance-{uuid.uuid4().hex[:10]}"
    stream = Stream(name=name, dead_letter=None, group=f"g-{name}")
    await harness.create_topics(stream.name, partitions=2)
    ends = {0: 0, 1: 0}
    history: dict[int, list[int]] = {0: [], 1: []}

    async def produce(phase: str) -> None:
        for i in range(PER_PHASE):
            partition = i % 2
            await harness.produce(stream, [f"{phase}-{i}".encode()], partition=partition)
            ends[partition] += 1

    def all_seen() -> bool:
        return all(seen_prefix(p) >= ends[p] for p in ends)

    def committed_to_ends() -> bool:
        return all(history[p] and history[p][-1] == ends[p] for p in ends)

    watcher = asyncio.create_task(watch_commits(harness, stream, history))
    first = RunningMember(harness, stream, "first")
    second: RunningMember | None = None
    try:
        # 1. One member owns both partitions.
        await produce("alone")
        await eventually(committed_to_ends, within=30, what="the first member's commits")
        assert first.member.assigned[-1] == {0, 1}

        # 2. Its commit task is held (a slow broker answer) with the targets of "held" in
        #    flight while it resolves "owed" too: when the second member joins, the first
        #    has a commit in flight and owes a newer one.
        first.member.commits_open.clear()
        await produce("held")
        await eventually(all_seen, what="the first member to receive the held records")
        await eventually(first.member.held.is_set, what="a held commit")
        await produce("owed")
        await eventually(all_seen, what="the first member to receive the owed records")
        assert [h[-1] for h in history.values()] == [PER_PHASE // 2] * 2, "still held"

        second = RunningMember(harness, stream, "second")
        await eventually(first.member.revoking.is_set, within=30, what="the first revocation")
        first.member.commits_open.set()  # the commit in flight may now finish
        await eventually(lambda: bool(second and second.member.assigned)
                         and len(first.member.assigned) == 2, within=30,
                         what="both members' new assignments")
        assert first.member.assigned[-1] | second.member.assigned[-1] == {0, 1}
        assert not first.member.assigned[-1] & second.member.assigned[-1]

        # 3. Both members consume their partition.
        await produce("shared")
        await eventually(lambda: all_seen() and committed_to_ends(), within=30,
                         what="both partitions committed to their ends")

        # 4. The first member leaves: the second takes both partitions.
        await first.stop()
        await eventually(lambda: bool(second and second.member.assigned[-1] == {0, 1}),
                         within=30, what="the second member to own both partitions")
        await produce("after")
        await eventually(lambda: all_seen() and committed_to_ends(), within=30,
                         what="everything committed by the second member")
    finally:
        if second is not None:
            await second.stop()
        await first.stop()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

    # Every record reached exactly one member: a partition's new owner starts exactly where
    # its previous owner's last commit (flushed on revocation) left off.
    deliveries = Counter(record for m in MEMBERS.values() for record in m.seen)
    produced = {(p, o) for p in ends for o in range(ends[p])}
    assert set(deliveries) == produced, f"never delivered: {sorted(produced - set(deliveries))}"
    twice = sorted(record for record, n in deliveries.items() if n > 1)
    assert not twice, f"delivered again after a handoff: {twice}; commits: {COMMITS}"
    # No commit went backwards (as the broker showed them, and as the members made them)...
    for partition, offsets in history.items():
        assert offsets == sorted(offsets), (partition, offsets)
        made = [c.offset for c in COMMITS if c.partition == partition]
        assert made == sorted(made), (partition, COMMITS)
    # ... or past a record no member had received yet.
    assert all(c.offset <= c.seen_prefix for c in COMMITS), COMMITS
    assert {c.member for c in COMMITS} == {"first", "second"}
