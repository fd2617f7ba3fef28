"""Records: one fanned-out raw event each, with its resolution counts and verdicts.

An :class:`EventRecord` is created by :meth:`ResolutionBook.broadcast
<sharedstream.engine.resolution.ResolutionBook.broadcast>` and leaves its lane
through ``take_batch``; in between, its counters move only as snapshot
subscribers resolve it (invariant 1 of :mod:`sharedstream.engine.resolution`:
``acked + failed + rejected + pending`` is the snapshot size). Its
:meth:`EventRecord.outcome` is what the producer is handed.

Ownership: one of the resolution modules listed in
:mod:`sharedstream.engine.resolution`, the only modules that change
resolution state. This one defines the record and the
helpers that annotate it; the book decides when they are called.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

from sharedstream.engine.producer import AdvanceOutcome, Verdict, annotated_outcome

__all__ = ["UNNAMED", "EventRecord", "add_failed_by", "add_verdict", "failure_verdict"]

UNNAMED = object()
"""``EventRecord.raw_name`` before anyone asked the producer for it (and for its fingerprint)."""

_new_tuple = tuple.__new__
"""Builds the NamedTuples below without their Python-level ``__new__`` (hot path)."""


class EventRecord:
    """One fanned-out raw event and how far its snapshot got in resolving it."""

    __slots__ = (
        "acked",
        "broker_payload",
        "created_at",
        "failed",
        "failed_by",
        "lane",
        "lane_queue",
        "pending",
        "position",
        "raw",
        "raw_fingerprint",
        "raw_name",
        "rejected",
        "unseen",
        "verdicts",
    )

    def __init__(  # noqa: PLR0917 - built once per raw event on the hot path
        self,
        position: int,
        raw: Any,
        broker_payload: Any,
        lane: Hashable,
        lane_queue: deque[EventRecord],
        created_at: float,
    ) -> None:
        self.position = position
        self.raw = raw
        self.broker_payload = broker_payload
        self.lane = lane
        self.lane_queue = lane_queue
        self.created_at = created_at
        self.pending = 0
        self.acked = 0
        self.failed = 0
        self.rejected = 0
        self.unseen = 0  # failures of subscribers that never pulled it (part of failed)
        self.failed_by: list[Hashable] | None = None  # who is counted in failed, in order
        self.verdicts: list[Verdict] | None = None  # who failed on it or rejected it, and why
        self.raw_name: str | object | None = UNNAMED  # the producer's name, once asked for
        self.raw_fingerprint: str | None = None  # and its fingerprint, asked with the name

    def outcome(self) -> AdvanceOutcome:
        """The resolution counts handed to the producer."""
        if self.failed or self.verdicts:
            return annotated_outcome(
                self.acked, self.failed, self.rejected, unseen=self.unseen,
                verdicts=tuple(self.verdicts or ()), failed_by=tuple(self.failed_by or ()),
            )
        return _new_tuple(AdvanceOutcome, (self.acked, self.failed, self.rejected))

    def __repr__(self) -> str:
        return (
            f"EventRecord(#{self.position}, lane={self.lane!r}, pending={self.pending}, "
            f"acked={self.acked}, failed={self.failed}, rejected={self.rejected})"
        )


def add_failed_by(record: EventRecord, trigger_id: Hashable) -> None:
    """Name one subscriber counted in ``record.failed`` (failure paths only, never hot)."""
    if record.failed_by is None:
        record.failed_by = [trigger_id]
    else:
        record.failed_by.append(trigger_id)


def add_verdict(record: EventRecord, verdict: Verdict) -> None:
    """Name one subscriber's non-clean resolution of ``record`` (in resolution order)."""
    if record.verdicts is None:
        record.verdicts = [verdict]
    else:
        record.verdicts.append(verdict)


def failure_verdict(trigger_id: Hashable, error: BaseException) -> Verdict:
    """The verdict of subscriber ``trigger_id`` failing on a record with ``error``."""
    return Verdict(trigger_id, "failed", _describe(error))


def _describe(error: BaseException) -> str:
    """``"RuntimeError: boom"`` on one line, at most 500 characters."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= 500 else text[:497] + "..."
