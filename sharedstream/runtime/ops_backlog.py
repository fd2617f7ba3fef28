"""The brokers' own backlog of each stream, asked every ``[api] backlog_interval`` seconds.

``sharedstream_watcher_lag`` counts raw events queued inside this process;
what a platform engineer means by lag is what the *broker* still holds for
the stream: a Kafka group's lag per partition, a queue's message counts.
Producers tell it through :meth:`SharedStreamProducer.broker_backlog
<sharedstream.engine.producer.SharedStreamProducer.broker_backlog>`; a
:class:`BacklogPoller` asks every live stream's producer, keeps the last
answer per stream as a :class:`BacklogReading`, and the operations
endpoint's metrics and status read those (never the broker) at scrape
time.

Invariants:

1. Off the hot path: one task, owned by the endpoint's ``serve``, asks
   each stream at most once per interval, the streams concurrently, each
   call bounded by :attr:`BacklogPoller.timeout`. No raw event waits on it.
2. A reading is the last poll's answer or nothing: a stream whose poll
   failed shows ``unknown`` (never the numbers of an earlier poll as if
   current); a broker that cannot tell shows ``n/a`` (never 0).
3. Quiet failures: a stream's failure is logged once, as a warning, when
   it starts (or its kind of error changes), and its recovery once; ``n/a``
   is logged once at info. A broker that stays away logs nothing more.
4. Streams no longer in use are forgotten at the next poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sharedstream.engine.errors import BacklogUnavailable
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import BrokerBacklog

if TYPE_CHECKING:
    from sharedstream.engine.manager import SharedStreamManager

__all__ = ["PENDING", "BacklogPoller", "BacklogReading", "BacklogState"]

log = key_value_logger("sharedstream.runtime.backlog")

BacklogState = Literal["pending", "ok", "n/a", "unknown"]
"""``pending``: not asked yet; ``ok``: the last poll answered; ``n/a``: the broker cannot
tell; ``unknown``: the last poll failed or timed out (``detail`` says how)."""


@dataclass(frozen=True)
class BacklogReading:
    """One stream's last backlog poll: its state, the counts when ``ok``, and why when not."""

    state: BacklogState
    lanes: BrokerBacklog = field(default_factory=dict)
    detail: str = ""
    at: float = 0.0
    """When it was read (the poller's clock; 0 while ``pending``)."""


PENDING = BacklogReading("pending")
"""The reading of a stream not asked yet."""


class BacklogPoller:
    """Asks every live stream's producer for its broker backlog (see the module docstring).

    ``manager`` is what has :meth:`~SharedStreamManager.streams` (a
    stand-in in unit tests); ``interval`` is the seconds between polls;
    ``timeout`` bounds each stream's call; ``label`` names a stream in log
    lines; ``clock`` stamps readings. Used on one event loop; :meth:`run`
    until cancelled.
    """

    def __init__(
        self, manager: SharedStreamManager, *, interval: float, timeout: float = 10.0,
        label: Callable[[Hashable], str] = str, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._manager = manager
        self.interval = interval
        self.timeout = timeout
        self._label = label
        self.clock = clock
        """The poller's clock: readings' ``at`` is on it."""
        self._readings: dict[Hashable, BacklogReading] = {}
        self.polls = 0
        """Polls completed (every stream asked once)."""

    def reading(self, key: Hashable) -> BacklogReading:
        """The last reading of the stream ``key`` (``pending`` before its first poll)."""
        return self._readings.get(key, PENDING)

    async def run(self) -> None:
        """Poll every ``interval`` seconds, until cancelled. Never raises otherwise.

        The first poll comes one interval after the start, not at once: the
        streams' consumers are still connecting then, and a warning about
        that would be noise.
        """
        while True:
            await asyncio.sleep(self.interval)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Ask every stream in use once (concurrently) and replace its reading."""
        streams = self._manager.streams()
        async with asyncio.TaskGroup() as tasks:
            for key, group, _members in streams:
                tasks.create_task(self._poll(key, group), name=f"sharedstream-backlog[{key!r}]")
        in_use = {key for key, _group, _members in streams}
        for key in [key for key in self._readings if key not in in_use]:
            del self._readings[key]
        self.polls += 1

    async def _poll(self, key: Hashable, group: Any) -> None:
        reading = await self._ask(group)
        previous = self._readings.get(key, PENDING)
        self._readings[key] = reading
        self._report(self._label(key), previous, reading)

    async def _ask(self, group: Any) -> BacklogReading:
        now = self.clock()
        if group is None:
            return BacklogReading("unknown", detail="the stream's poll is restarting", at=now)
        try:
            async with asyncio.timeout(self.timeout):
                lanes = await group.broker_backlog()
        except BacklogUnavailable as exc:
            return BacklogReading("n/a", detail=str(exc), at=now)
        except TimeoutError:
            return BacklogReading("unknown", detail=f"no answer within {self.timeout:g}s", at=now)
        except Exception as exc:  # noqa: BLE001 - a count for operators; delivery is untouched
            return BacklogReading("unknown", detail=f"{type(exc).__name__}: {exc}", at=now)
        return BacklogReading("ok", {lane: dict(kinds) for lane, kinds in lanes.items()}, at=now)

    @staticmethod
    def _report(stream: str, previous: BacklogReading, reading: BacklogReading) -> None:
        """Log a change of state once (see invariant 3)."""
        if reading.state == "unknown":
            if previous.state != "unknown" or _kind(previous) != _kind(reading):
                log.warning("broker backlog unknown (shown as unknown until it answers; "
                            "logged again only when that changes)", stream=stream,
                            error=reading.detail)
        elif reading.state == "n/a":
            if previous.state != "n/a":
                log.info("broker backlog not available", stream=stream, reason=reading.detail)
        elif previous.state == "unknown":
            log.info("broker backlog answers again", stream=stream)


def _kind(reading: BacklogReading) -> str:
    """The kind of a failure: its detail up to the first colon (the error's name)."""
    return reading.detail.split(":", 1)[0]
