"""Replay: reading a bounded part of a stream again, for one watcher, beside the live consumer.

A producer that can replay returns a :class:`ReplaySource` from
:meth:`~sharedstream.engine.producer.SharedStreamProducer.replay_source`.
The runtime (:mod:`sharedstream.runtime.replay_loop`) asks it for a *plan*
- each lane's ``[start, end)`` positions - once, stores the plan, then
reads the lanes from the positions it reached with :meth:`ReplaySource.read`
and feeds one trigger's filter alone. A replay of a watcher's dead letters
(:attr:`ReplayRequest.dead_letters`) reads the store's instead, with a
source of the runtime's; the producer only rebuilds each letter
(:meth:`~sharedstream.engine.producer.SharedStreamProducer.dead_letter_event`).

Contracts of a source:

- It never changes what the live consumer reads or commits: no group
  membership, no commits, no acks (a reader of its own).
- The plan ends where the live consumer's committed position was when it
  was made, so a replay and the live stream never overlap and leave no gap:
  what the live consumer advanced past is the replay's, the rest is live.
- :meth:`ReplaySource.read` yields lanes' items in position order within a
  lane, each with the position to resume *after* it, and returns once every
  lane reached its end. The raw event and payload are those the live
  stream would give for the same message, so the producer's
  ``raw_event_name`` and ``raw_event_fingerprint`` give the same idempotency
  key and fingerprint as live.
- Memory is bounded by the source's fetch size, whatever the plan's size.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from sharedstream.engine.errors import SharedStreamError

__all__ = ["ReplayError", "ReplayItem", "ReplayPlan", "ReplayRequest", "ReplaySource"]

ReplayPlan = Mapping[str, tuple[int, int]]
"""Lane → ``(start, end)``: positions ``start`` to ``end - 1`` are replayed."""


class ReplayError(SharedStreamError):
    """A replay cannot be planned or read: one line naming the problem."""


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What a person asked to replay.

    ``since``: from the first message at or after this time, in every lane;
    ``offsets``: from these positions (lane → position; lanes not named
    replay nothing); ``dead_letters``: the dead letters the watcher caused,
    as the store keeps them (neither ``since`` nor ``offsets`` then);
    exactly one of the three. ``until``: stop before the first message
    after this time (``None``: up to the live consumer's committed
    position; not with ``dead_letters``).
    """

    since: datetime | None = None
    offsets: Mapping[str, int] | None = None
    until: datetime | None = None
    dead_letters: bool = False

    def __post_init__(self) -> None:
        starts = (self.since is not None) + (self.offsets is not None) + self.dead_letters
        if starts != 1:
            raise ReplayError("a replay starts from a time, from offsets, or replays the dead "
                              "letters (exactly one)")
        if self.dead_letters and self.until is not None:
            raise ReplayError("a replay of dead letters takes no end time")


class ReplayItem(NamedTuple):
    """One message read again: its lane, the position after it, and what the live stream gives.

    ``skipped``: positions of the lane passed over just before this item
    that hold nothing for this replay (another watcher's dead letters); they
    count as done, so a finished replay's count reaches its plan's total.
    """

    lane: str
    next_position: int
    raw_event: Any
    broker_payload: Any
    skipped: int = 0


class ReplaySource(Protocol):
    """A producer's bounded reader of its stream (see the module docstring)."""

    async def plan(self, request: ReplayRequest) -> dict[str, tuple[int, int]]:
        """Each lane's ``(start, end)``; :class:`ReplayError` when it cannot be planned."""
        ...

    def read(self, plan: ReplayPlan, positions: Mapping[str, int]) -> AsyncIterator[ReplayItem]:
        """Read every lane of ``plan`` from ``positions`` (or its start) to its end."""
        ...

    async def aclose(self) -> None:
        """Close the source's clients; idempotent."""
        ...
