"""What a broker must provide to run the conformance suite, and the scripted filter.

Triggers under test consult :func:`act` with their ``script`` name and the
raw value (bytes) to decide what to do with each message: emit, skip,
reject, or raise (fail). Scripts live in :data:`SCRIPTS` because a trigger
is rebuilt from its kwargs and can only carry the script's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sharedstream import BaseEventTrigger, SharedStreamManager, TriggerEvent


@dataclass(frozen=True)
class Features:
    """What a broker module promises; the suite skips tests for what it does not."""

    ordered_lanes: bool = True
    """Commits are cumulative per lane: a held message blocks every later commit of it."""
    supports_dlq: bool = True
    """Rejected messages can go to a dead-letter destination, with their origin attached."""
    redelivers_in_session: bool = True
    """A failed message is delivered again without restarting the consumer."""
    dead_letters_poison: bool = True
    """A message that keeps failing is dead-lettered after ``max_redeliveries``."""
    names_raw_events: bool = True
    """``raw_event_name`` is stable across redeliveries."""
    refuses_lossy_settings: bool = True
    """A setting that would acknowledge too early (auto-commit) is refused up front."""
    ordered_delivery: bool = True
    """Messages of one lane reach each subscriber in the order they were produced."""


@dataclass
class Stream:
    """One test's stream: where messages go, where dead letters go, the consumer group."""

    name: str
    dead_letter: str | None
    group: str


@dataclass(frozen=True)
class DeadLetter:
    value: bytes | None
    source: str
    """The raw event name of the message it came from (as ``raw_event_name`` names it)."""
    reason: str
    triggers: str = ""
    """The trigger ids that rejected it or kept failing on it, comma-separated."""


class BrokerHarness(Protocol):
    """A running broker plus the helpers the suite needs (one instance per test)."""

    features: Features

    async def create_stream(self, *, dead_letter: bool = True) -> Stream: ...

    async def produce(self, stream: Stream, values: Sequence[bytes]) -> None:
        """Append ``values`` in order to one lane (e.g. one partition)."""

    def trigger(
        self, stream: Stream, *, script: str, max_redeliveries: int = 5,
    ) -> BaseEventTrigger:
        """A trigger of the module under test whose filter follows :func:`act`."""

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:
        """Build a trigger with a lossy consumer setting (must raise ``ValueError``)."""

    async def committed(self, stream: Stream) -> int:
        """How many messages of the lane are committed (the next position to read)."""

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        """Everything in the stream's dead-letter destination so far."""

    def producers_created(self, stream: Stream) -> int:
        """How many producers (broker consumers) the module built for the stream."""

    async def consumers_in_group(self, stream: Stream) -> int | None:
        """Members the broker sees in the stream's consumer group (``None``: cannot tell)."""

    def raw_event_name(self, stream: Stream, index: int) -> str:
        """The expected name of the ``index``-th message produced to the stream."""


@dataclass
class Script:
    """What a scripted filter does with each value; unknown values are emitted."""

    reject: set[bytes] = field(default_factory=set)
    skip: set[bytes] = field(default_factory=set)
    fail: dict[bytes, int] = field(default_factory=dict)
    """Value -> how many more times to raise on it (-1: always)."""
    failures: int = 0
    delay: float = 0.0
    """Seconds the filter spends on each message (a slow watcher)."""


async def pace(script: str) -> None:
    """Spend the script's ``delay`` on one message (call it first in a scripted filter)."""
    delay = SCRIPTS[script].delay
    if delay:
        await asyncio.sleep(delay)


SCRIPTS: dict[str, Script] = {}


def act(script: str, value: bytes | None) -> str:
    """``"emit"``, ``"skip"``, ``"reject"`` or ``"fail"`` for ``value`` under ``script``."""
    rules = SCRIPTS[script]
    if value is None:
        return "emit"
    remaining = rules.fail.get(value, 0)
    if remaining:
        if remaining > 0:
            rules.fail[value] = remaining - 1
        rules.failures += 1
        return "fail"
    if value in rules.reject:
        return "reject"
    if value in rules.skip:
        return "skip"
    return "emit"


class ScriptedFailure(RuntimeError):
    """Raised by a scripted filter told to fail on a value."""


class SupervisedRunner:
    """Runs one trigger the way the triggerer does: a durable member, restarted when it raises.

    Events are stored at once (confirmed as soon as taken). On a filter error
    the member's attempt is failed (only the message it was on fails) and,
    after ``backoff`` seconds away, a new attempt picks up where it stopped;
    messages fanned out meanwhile wait for it.
    """

    def __init__(
        self, manager: SharedStreamManager, trigger: BaseEventTrigger, trigger_id: int,
        *, backoff: float = 0.0,
    ) -> None:
        self.manager, self.trigger, self.trigger_id = manager, trigger, trigger_id
        self.key: Hashable = trigger.shared_stream_key()
        self.backoff = backoff
        self.events: list[TriggerEvent] = []
        self.names: list[str | None] = []
        self.errors: list[BaseException] = []
        self.task: asyncio.Task[None] | None = None
        self.member = manager.join(trigger_id=trigger_id, trigger=trigger, key=self.key)

    def start(self) -> SupervisedRunner:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        member = self.member
        while True:
            try:
                async for event in self.trigger.filter_shared_stream(member.stream()):
                    seq = member.bind()
                    self.names.append(member.raw_event_key())
                    self.events.append(event)
                    if seq is not None:
                        self.manager.confirm_persisted([seq])
            except ScriptedFailure as exc:
                self.errors.append(exc)
                member.fail(exc)
                if self.backoff:
                    await asyncio.sleep(self.backoff)
            else:
                return

    def values(self) -> list[Any]:
        return [event.payload["value"] for event in self.events]

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])
            if not self.task.cancelled() and self.task.exception() is not None:
                raise AssertionError("runner failed") from self.task.exception()
        await self.member.leave()


async def eventually(
    predicate: Callable[[], Any], within: float = 10.0, what: str = "condition",
) -> None:
    """Poll ``predicate`` (sync) until true, failing after ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 - state spread over several objects
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def eventually_async(
    probe: Callable[[], Any], expected: Any, within: float = 10.0, what: str = "value",
) -> None:
    """Poll an async ``probe`` until it returns ``expected``."""
    last: Any = None
    try:
        async with asyncio.timeout(within):
            while True:
                last = await probe()
                if last == expected:
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what}: expected {expected!r}, last saw {last!r}") from None
