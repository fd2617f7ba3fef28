"""How a subscription's streaming pulls keep ending: the count behind the WARNING and readiness.

Pub/Sub ends a streaming pull now and then, and the producer opens another
(an INFO line). A stream that can never get past something - a message
larger than the channel takes, say - ends the same way again and again,
each time soon after it opened, and the producer would reopen it forever.
:class:`StreamEnds` tells the two apart. It is pure bookkeeping on an
injected clock, run on the event loop only.

Terms: an *end* is a stream that was open and then failed; it *lived* from
:meth:`StreamEnds.opened` to :meth:`StreamEnds.ended`. A *streak* is the
ends in a row that count as the same failure.

Invariants (each checked in ``tests/unit/test_pubsub_stream_ends.py``):

1. Two ends are the same failure when their error texts agree once numbers
   are set aside (``Received message larger than max (9437248 vs.
   4194304)`` names each message's size).
2. An end extends the streak only if its stream lived less than
   ``healthy_after`` seconds and its error is the streak's; otherwise it
   starts a new streak of 1. A failure to open is not an end (the caller's
   retry says it).
3. :meth:`StreamEnds.ended` is true (say it loudly) for the 3rd end of a
   streak, then the 6th, 12th, 24th...: at most ``log2(n / 3) + 1`` lines
   for ``n`` ends in a row, never one per end.
4. :meth:`StreamEnds.failing` is true from the 3rd end of a streak until
   the stream opened after the last end has lived ``healthy_after`` seconds
   (or a new streak starts): a stream that keeps failing is not ready,
   and one that stayed up that long is again.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["LOUD_FROM", "StreamEnds"]

LOUD_FROM = 3
"""Ends in a row after which the streak is a WARNING and the stream is not ready."""

_NUMBER = re.compile(r"\d+")


class StreamEnds:
    """The streak of a producer's streaming pulls that ended the same way.

    ``healthy_after``: seconds a stream must live for its end (or its being
    still open) to count as healthy; choose it above the time a failure
    takes to come back (for Pub/Sub, a lease lapsing: the ack deadline).
    ``clock``: seconds, monotonic (the producer's loop clock). Not
    thread-safe; the producer calls it from its pull loop and reads
    :meth:`failing` from the event loop. Nothing here raises.
    """

    def __init__(self, healthy_after: float, clock: Callable[[], float]) -> None:
        self.healthy_after = healthy_after
        self._clock = clock
        self.error = ""
        """The last end's error, as said (numbers kept)."""
        self.in_a_row = 0
        """Ends in the current streak (0: none yet)."""
        self._same = ""
        self._next_loud = LOUD_FROM
        self._opened_at: float | None = None

    def opened(self) -> None:
        """A stream opened, now."""
        self._opened_at = self._clock()

    def ended(self, error: str) -> bool:
        """The open stream ended with ``error``, now; whether to say so loudly.

        Counts the end into the streak (invariants 1 and 2) and returns true
        on the ends invariant 3 names. Afterwards no stream is open until
        the next :meth:`opened`.
        """
        same = _NUMBER.sub("N", error)
        opened_at = self._opened_at
        lived = 0.0 if opened_at is None else self._clock() - opened_at
        self._opened_at = None
        if same == self._same and lived < self.healthy_after:
            self.in_a_row += 1
        else:
            self._same, self.in_a_row, self._next_loud = same, 1, LOUD_FROM
        self.error = error
        if self.in_a_row < self._next_loud:
            return False
        self._next_loud *= 2
        return True

    def failing(self) -> bool:
        """Whether the streak says the stream keeps failing (invariant 4); cheap.

        Reads the clock only during a streak of :data:`LOUD_FROM` or more.
        """
        if self.in_a_row < LOUD_FROM:
            return False
        opened_at = self._opened_at
        return opened_at is None or self._clock() - opened_at < self.healthy_after
