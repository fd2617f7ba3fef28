"""Replays: one watcher's catch-up on a stream, as rows of the metadata store.

A replay is asked for (``sharedstream watchers replay``, ``POST /replays``)
by writing a ``pending`` row; a triggerer that serves the watcher's trigger
claims it (``running``), plans it (where each lane starts and ends: a
Kafka partition's offsets), reads the lanes and feeds that trigger's
filter alone, and records its progress in the row: the position reached
in each lane, counts, and whether someone asked to cancel it. The row is
the replay's durable state, so a replay whose triggerer died is claimed
again by another (or the same, restarted) and goes on from the last
position recorded; what was stored after that position is stored again
under the same idempotency keys, i.e. not at all.

States: ``pending`` → ``running`` → ``done`` | ``failed``; a cancel makes a
``pending`` replay ``cancelled`` at once and a ``running`` one
``cancelling`` until its runner sees it (then ``cancelled``). At most one
replay per trigger is *active* (``pending``, ``running`` or
``cancelling``): a second is refused, and a unique index holds that even
between two processes.

Contracts, for every store: every mutation is one transaction; a runner's
updates are fenced by its triggerer id (an update from a runner that lost
its claim changes nothing and says so); times are UTC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

__all__ = [
    "ACTIVE_REPLAY_STATES",
    "FINISHED_REPLAY_STATES",
    "REPLAY_STATES",
    "ReplayProgress",
    "ReplayRow",
    "ReplayStore",
]

ACTIVE_REPLAY_STATES = frozenset({"pending", "running", "cancelling"})
"""A trigger has at most one replay in these states."""
FINISHED_REPLAY_STATES = frozenset({"done", "cancelled", "failed"})
REPLAY_STATES = ACTIVE_REPLAY_STATES | FINISHED_REPLAY_STATES


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """A stored replay (see the module docstring).

    ``request`` is what was asked for, as given (JSON-able: ``from``, ``to``,
    ``offsets``); ``plan`` maps each lane to its ``[start, end)`` positions
    once planned (``None`` before); ``positions`` each lane's next position
    to read. ``total`` is the number of raw events planned, ``done`` those
    read and passed through the filter, ``stored`` the trigger events the
    filter fired that were new in the store, ``matched`` all it fired
    (``matched - stored``: already there), ``rejected`` the raw events the
    filter rejected.
    """

    id: int
    trigger_id: int
    watcher: str
    state: str
    request: Mapping[str, Any]
    plan: Mapping[str, tuple[int, int]] | None
    positions: Mapping[str, int]
    total: int | None
    done: int
    matched: int
    stored: int
    rejected: int
    triggerer_id: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def active(self) -> bool:
        """Still to run, running, or being cancelled."""
        return self.state in ACTIVE_REPLAY_STATES


@dataclass(slots=True)
class ReplayProgress:
    """What a runner records after each stored batch (counts are totals, not increments)."""

    positions: dict[str, int] = field(default_factory=dict)
    done: int = 0
    matched: int = 0
    stored: int = 0
    rejected: int = 0


class ReplayStore(Protocol):
    """The replay methods of a metadata store (see the module docstring for the contracts)."""

    def create_replay(self, trigger_id: int, watcher: str, request: Mapping[str, Any]) -> int:
        """Write a ``pending`` replay of ``trigger_id``; return its id.

        :class:`~sharedstream.store.base.StoreError` naming the active one
        when the trigger already has an active replay, or when the trigger
        does not exist.
        """
        ...

    def claim_replay(
        self, triggerer_id: str, trigger_ids: Sequence[int], threshold: float
    ) -> ReplayRow | None:
        """Claim the oldest active replay of one of ``trigger_ids`` nobody live runs, or ``None``.

        Nobody live: no claim, or a claim whose triggerer's heartbeat is more
        than ``threshold`` seconds old (or gone). A ``pending`` replay
        becomes ``running``; a ``cancelling`` one keeps its state (the
        runner finishes it as ``cancelled``).
        """
        ...

    def plan_replay(
        self, replay_id: int, triggerer_id: str, plan: Mapping[str, tuple[int, int]]
    ) -> bool:
        """Record the plan (and the start positions and total it implies); fenced.

        ``False`` when ``triggerer_id`` no longer holds the replay.
        """
        ...

    def record_replay(
        self, replay_id: int, triggerer_id: str, progress: ReplayProgress
    ) -> str | None:
        """Record progress; return the replay's state (``cancelling``: stop), ``None`` if lost."""
        ...

    def finish_replay(
        self, replay_id: int, triggerer_id: str, state: str, error: str | None = None
    ) -> bool:
        """End the replay as ``done``, ``cancelled`` or ``failed`` (with ``error``); fenced."""
        ...

    def cancel_replay(self, replay_id: int) -> ReplayRow:
        """Ask to cancel: ``pending`` → ``cancelled``, ``running`` → ``cancelling``.

        Returns the row after the change. :class:`~sharedstream.store.base.StoreError`
        for an unknown id or a replay that already ended.
        """
        ...

    def get_replay(self, replay_id: int) -> ReplayRow | None:
        """The replay with this id, or ``None``."""
        ...

    def list_replays(self, limit: int, *, trigger_id: int | None = None,
                     active: bool = False) -> list[ReplayRow]:
        """Replays, newest first; only ``trigger_id``'s, only active ones, when asked."""
        ...
