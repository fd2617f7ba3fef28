"""Replaying the dead letters a watcher caused, from the store, through that watcher alone.

A :class:`~sharedstream.engine.replay.ReplaySource` over the store's
``dead_letters`` table (what a producer's dead-letter fallback kept: see
:class:`~sharedstream.engine.producer.DeadLetter`), for
``sharedstream watchers replay WATCHER --dead-letters``. It never touches
the broker: each letter is turned back into the ``(raw_event,
broker_payload)`` the live stream gave by the producer's
:meth:`~sharedstream.engine.producer.SharedStreamProducer.dead_letter_event`.

Terms and invariants:

1. One lane, :data:`LANE`; positions are the letters' row ids. The plan is
   ``(first id, last id + 1)`` of the letters the trigger caused (its id in
   the letter's ``triggers``) when it is made, ``(0, 0)`` when there are
   none: letters kept after the plan are not the replay's.
2. Letters are read in id order, in pages of ``page`` rows; each page is one
   store read through the loop's ``db`` (off the event loop). Ids between
   two letters of the trigger (other watchers' letters, or letters pruned
   by retention) count as ``skipped``, so a finished replay's count reaches
   its total.
3. A letter whose payload the store kept only a prefix of is not fed to the
   filter (its body would not be the message's): one warning names it and
   it counts as skipped. A letter the producer cannot rebuild fails the
   replay with one line naming it.
4. The rebuilt payload's ``raw_event_name`` is the live message's, so the
   replay stores the watcher's events under the live idempotency keys: what
   was stored already is not stored again.

Memory: one page of letters.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import DeadLetter, SharedStreamProducer
from sharedstream.engine.replay import ReplayError, ReplayItem, ReplayPlan, ReplayRequest
from sharedstream.store import MetadataStore
from sharedstream.store.base import DeadLetterRow

__all__ = ["LANE", "DeadLetterReplaySource", "can_rebuild_dead_letters"]

log = key_value_logger("sharedstream.replay")

LANE = "dead-letters"
"""The one lane of a dead-letter replay."""


def can_rebuild_dead_letters(producer: SharedStreamProducer) -> bool:
    """Whether ``producer``'s broker implements :meth:`SharedStreamProducer.dead_letter_event`."""
    return (type(producer).dead_letter_event
            is not SharedStreamProducer.dead_letter_event)


def _letter(row: DeadLetterRow) -> DeadLetter:
    return DeadLetter(stream=row.stream, source=row.source, reason=row.reason,
                      triggers=row.triggers, payload=row.payload, headers=row.headers)


class DeadLetterReplaySource:
    """The dead letters ``trigger_id`` caused, as the live stream gave them (module docstring).

    ``store`` gives the loop's store, ``db(fn, *args)`` runs a store call off
    the event loop, ``producer`` rebuilds each letter, and ``page`` bounds
    one read.
    """

    def __init__(self, *, trigger_id: int, store: Callable[[], MetadataStore],
                 db: Callable[..., Awaitable[Any]], producer: SharedStreamProducer,
                 page: int = 200) -> None:
        self._trigger_id, self._store, self._db = trigger_id, store, db
        self._producer, self._page = producer, page

    async def plan(self, request: ReplayRequest) -> dict[str, tuple[int, int]]:
        """``{LANE: (first id, last id + 1)}`` of the trigger's letters now; ``(0, 0)``: none."""
        if not request.dead_letters:
            raise ReplayError("this source replays dead letters only")
        span = await self._db(self._store().dead_letter_span, self._trigger_id)
        if span is None:
            return {LANE: (0, 0)}
        first, last = span
        return {LANE: (first, last + 1)}

    async def read(self, plan: ReplayPlan,
                   positions: Mapping[str, int]) -> AsyncIterator[ReplayItem]:
        """The letters of the plan from ``positions`` (ids at or after it), in id order."""
        start, end = plan.get(LANE, (0, 0))
        position = reported = max(positions.get(LANE, start), start)
        while position < end:
            rows: list[DeadLetterRow] = await self._db(functools.partial(
                self._store().dead_letters_of, self._trigger_id, self._page,
                after=position - 1, before=end))
            if not rows:
                return
            for row in rows:
                position = row.id + 1
                if row.truncated:
                    log.warning("a dead letter kept only in part is not replayed",
                                letter=row.id, source=row.source, kept=len(row.payload),
                                size=row.payload_size)
                    continue  # counted as skipped by the next letter
                rebuilt = self._producer.dead_letter_event(_letter(row))
                if rebuilt is None:
                    raise ReplayError(f"dead letter {row.id} ({row.stream}, {row.source}) "
                                      "cannot be rebuilt as a message of this stream")
                raw_event, payload = rebuilt
                yield ReplayItem(LANE, position, raw_event, payload, row.id - reported)
                reported = position

    async def aclose(self) -> None:
        """Nothing to close: the store is the loop's."""
