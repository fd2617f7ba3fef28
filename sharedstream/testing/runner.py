"""Run a trigger the way the triggerer does, and wait for what a test expects.

:class:`SupervisedRunner` is the triggerer in miniature: a durable member of
the shared stream whose events are stored at once, restarted after a
:class:`~.scripts.ScriptedFailure`. :func:`eventually` and
:func:`eventually_async` poll for a condition with a deadline, so a test
fails with a message saying what it waited for instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from sharedstream.engine.errors import FilterEnded
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.manager import SharedStreamManager
from sharedstream.engine.trigger import BaseEventTrigger
from sharedstream.testing.scripts import ScriptedFailure

__all__ = ["SupervisedRunner", "eventually", "eventually_async"]


class SupervisedRunner:
    """Runs one trigger the way the triggerer does: a durable member, restarted when it raises.

    Each attempt is one :meth:`~sharedstream.engine.membership.Membership.run_attempt`
    (the triggerer's restart, gap-free). Events are stored at once (confirmed
    as soon as taken). On a :class:`ScriptedFailure` only the message the
    filter was on fails and, after ``backoff`` seconds away (capped at half the
    ack timeout), a new attempt picks up where it stopped; messages fanned out
    meanwhile wait for it. A filter that returns ends the runner; any other
    exception (an ``AckTimeout`` of a hung filter included) ends it too, and
    :meth:`stop` raises it.

    The runner owns one task (started by :meth:`start`, named after the
    trigger id); :meth:`stop` cancels and awaits it, then leaves the stream.
    Call it at shutdown, before or after the manager's ``stop_all``: as in
    Airflow, a filter of a stopped stream waits for that cancellation
    (it sees ``CancelledError``, never an exception).
    """

    def __init__(
        self, manager: SharedStreamManager, trigger: BaseEventTrigger, trigger_id: int,
        *, backoff: float = 0.0,
    ) -> None:
        self.manager, self.trigger, self.trigger_id = manager, trigger, trigger_id
        self.key: Hashable = trigger.shared_stream_key()
        self.backoff = backoff
        self.events: list[TriggerEvent] = []
        """Every event emitted, redeliveries included, in order."""
        self.names: list[str | None] = []
        """The raw event key of each event (``None`` when the producer names none)."""
        self.identities: list[tuple[str, str | None] | None] = []
        """Each event's ``(raw event key, fingerprint)`` (``Membership.raw_event_identity``)."""
        self.errors: list[BaseException] = []
        """The scripted failures the filter raised."""
        self.task: asyncio.Task[None] | None = None
        self.member = manager.join(trigger_id=trigger_id, trigger=trigger, key=self.key)

    def start(self) -> SupervisedRunner:
        """Start the filter loop in a task of the running loop; returns ``self``."""
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"supervised-runner-{self.trigger_id}")
        return self

    async def _run(self) -> None:
        delay = 0.0
        while True:
            try:
                await self.member.run_attempt(self._consume, delay=delay)
            except ScriptedFailure as exc:
                self.errors.append(exc)  # run_attempt failed only the message it was on
                delay = self.backoff
            except FilterEnded:
                return  # the filter returned: the runner is done

    async def _consume(self, stream: AsyncIterator[Any]) -> None:
        """One attempt: the filter, with each event stored (confirmed) as it is taken."""
        member = self.member
        async for event in self.trigger.filter_shared_stream(stream):
            seq = member.bind()
            self.names.append(member.raw_event_key())
            self.identities.append(member.raw_event_identity())
            self.events.append(event)
            if seq is not None:
                self.manager.confirm_persisted([seq])

    def values(self) -> list[Any]:
        """``payload["value"]`` of every event, in order (redeliveries included)."""
        return [event.payload["value"] for event in self.events]

    async def stop(self) -> None:
        """Cancel the loop, leave the stream; raise ``AssertionError`` if the loop had failed."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])
            if not self.task.cancelled() and self.task.exception() is not None:
                raise AssertionError("runner failed") from self.task.exception()
        await self.member.leave()


async def eventually(
    predicate: Callable[[], Any], within: float = 10.0, what: str = "condition",
) -> None:
    """Poll ``predicate`` (sync) every 10 ms until true; ``AssertionError`` after ``within`` s."""
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 - state spread over several objects
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def eventually_async(
    probe: Callable[[], Any], expected: Any, within: float = 10.0, what: str = "value",
) -> None:
    """Poll an async ``probe`` every 50 ms until it returns ``expected`` (``within`` s at most)."""
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
