"""Dead letters: the reasons, the annotations, and the dead-letter-or-discard policy.

A message is dead-lettered when a subscriber rejected it
(:data:`REASON_REJECTED`) or it failed more than ``max_redeliveries`` times
(:data:`REASON_MAX_REDELIVERIES`). The broker module sends it to its
broker's dead-letter destination (a topic, a queue) with the annotations of
:func:`dead_letter_annotations`; when there is none, or the broker refuses it for good
(too big, say), :class:`DeadLetterDesk` hands it to the engine's
``dead_letter_fallback`` (the runtime's dead-letter table); with neither, it
is discarded with a warning. Either way the broker is then advanced past it,
so it is neither lost silently nor left to stall its lane.

Invariants:

* every message handed to :meth:`DeadLetterDesk.sent` or kept by
  :meth:`DeadLetterDesk.keep` adds one to the owner's ``dead_lettered``
  (which the engine totals), every discarded one to ``discarded``;
* :meth:`DeadLetterDesk.keep` returns only once the fallback stored the
  letter, or after counting a discard; if the fallback raises, nothing is
  counted and the error propagates: the caller must not advance past it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.engine.producer import (
    DeadLetter,
    SharedStreamProducer,
    Verdict,
    verdict_detail,
    verdict_triggers,
)

__all__ = [
    "ANNOTATION_DETAIL",
    "ANNOTATION_REASON",
    "ANNOTATION_TRIGGERS",
    "REASON_MAX_REDELIVERIES",
    "REASON_REJECTED",
    "DeadLetterDesk",
    "dead_letter_annotations",
]

REASON_REJECTED = "rejected"
"""A subscriber refused the message for good."""
REASON_MAX_REDELIVERIES = "max_redeliveries"
"""The message failed more than ``max_redeliveries`` times (a poison message)."""

ANNOTATION_REASON = "sharedstream.reason"
ANNOTATION_TRIGGERS = "sharedstream.triggers"
ANNOTATION_DETAIL = "sharedstream.detail"
"""Header or attribute names on a dead-lettered copy: the reason, the ids of the
triggers that rejected it or kept failing on it (comma-separated) and what they
said (``; ``-separated). Each broker adds its own source coordinates."""


def dead_letter_annotations(reason: str, verdicts: Sequence[Verdict]) -> dict[str, str]:
    """The ``sharedstream.*`` annotations of a dead-lettered copy, empty ones left out."""
    found = {
        ANNOTATION_REASON: reason,
        ANNOTATION_TRIGGERS: ",".join(verdict_triggers(verdicts)),
        ANNOTATION_DETAIL: verdict_detail(verdicts),
    }
    return {name: value for name, value in found.items() if value}


def _said(verdicts: Sequence[Verdict], prefix: str) -> str:
    detail = verdict_detail(verdicts)
    return f"{prefix}{detail}" if detail else ""


def _detail(verdicts: Sequence[Verdict]) -> dict[str, str]:
    """The ``detail`` key-value of a log line, when the verdicts give one."""
    detail = verdict_detail(verdicts)
    return {"detail": detail} if detail else {}


class DeadLetterDesk:
    """Counts a producer's dead letters and keeps those its broker will not take.

    Owned by one producer (``owner``): it adds to ``owner.dead_lettered`` and
    reads ``owner.dead_letter_fallback`` and ``owner.stream_name`` at each
    call (the engine sets them before ``open_stream``); the stream's name
    goes in letters and logs (``"kafka orders (group g)"``, see
    :mod:`sharedstream.engine.names`). ``setting`` is the option that
    configures the broker's dead-letter destination, named in warnings.
    Called from the owner's event loop.
    """

    def __init__(self, owner: SharedStreamProducer, *, setting: str,
                 logger: KeyValueLogger) -> None:
        self.owner, self.setting, self.log = owner, setting, logger
        self.discarded = 0
        """Messages dropped because there was no dead-letter destination and no fallback."""

    @property
    def stream(self) -> str:
        """The stream's name, as the engine gave it to the owner."""
        return self.owner.stream_name

    def sent(self, source: str, destination: str, reason: str,
             verdicts: Sequence[Verdict]) -> None:
        """The broker's dead-letter destination acknowledged the copy of ``source``: count it."""
        self.owner.dead_lettered += 1
        self.log.warning("dead-lettered", source=source, stream=self.stream,
                         destination=destination, reason=reason, **_detail(verdicts))

    async def keep(
        self,
        *,
        source: str,
        reason: str,
        cause: str,
        verdicts: Sequence[Verdict],
        payload: bytes,
        headers: tuple[tuple[str, bytes], ...],
        history: str,
    ) -> None:
        """Keep ``source`` through the fallback, or discard it when there is none.

        ``cause`` says why the broker's destination was not used (``"no
        dead_letter_topic configured"``, ``"the dead-letter topic refused
        it: ..."``); ``history`` how often it came (for the discard warning).
        Returns once it is stored or counted as discarded; raises what the
        fallback raises (then the caller must leave the message to come again).
        """
        keep = self.owner.dead_letter_fallback
        if keep is None:
            self.discarded += 1
            self.log.warning("discarding a message: no dead-letter destination", source=source,
                             stream=self.stream, reason=reason, history=history,
                             **_detail(verdicts), cause=cause)
            return
        await keep(DeadLetter(
            stream=self.stream,
            source=source,
            reason=f"{reason}; {cause}{_said(verdicts, ': ')}",
            triggers=verdict_triggers(verdicts),
            payload=payload,
            headers=headers,
        ))
        self.owner.dead_lettered += 1
        self.log.debug("handed to the dead-letter fallback", source=source, reason=reason,
                       cause=cause)

    def unconfigured(self) -> str:
        """The ``cause`` to give :meth:`keep` when no dead-letter destination is set."""
        return f"no {self.setting} configured"
