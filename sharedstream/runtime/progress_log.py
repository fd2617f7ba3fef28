"""The triggerer's ``progress`` log line, every ten seconds: what it did, and who is behind.

A line whose keys (``new`` and ``last_commit_ms`` aside) are all the same
as the last line's says nothing new: it is logged at DEBUG, so an idle
triggerer writes its first progress line at INFO and then none until
something happens (it used to write 8,640 a day).

Keys (``docs/runtime.md``, Log lines): ``running``, ``stored`` and ``new``
(since the last line), ``duplicates``, ``dag_runs`` (queued), ``rejected``,
``dead_lettered``, ``last_commit_ms``; when they apply, ``behind`` (the
five most lagging triggers: raw events queued for each), ``behind_more``
and ``intake_paused`` (its reasons), and ``runs_ran`` (runs the dispatcher
handed to their targets).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.runtime.ops_base import ObservedTriggerer

__all__ = ["lag_note", "report_progress"]

log = key_value_logger("sharedstream.runtime")


async def report_progress(triggerer: ObservedTriggerer, every: float = 10.0) -> None:
    """Log a ``progress`` line every ``every`` seconds until cancelled.

    At INFO when something changed since the last line (the first line
    always), else at DEBUG (see the module docstring).
    """
    last = 0
    said: dict[str, Any] | None = None
    while True:
        await asyncio.sleep(every)
        gate, manager = triggerer.gate, triggerer.manager
        stored = gate.stored
        line: dict[str, Any] = {
            "running": triggerer.progress.running, "stored": stored, "new": stored - last,
            "duplicates": gate.duplicates, "dag_runs": triggerer.runs_queued,
            "rejected": manager.totals.rejected, "dead_lettered": manager.totals.dead_lettered,
            "last_commit_ms": round(gate.last_confirm_latency * 1000, 1),
            **lag_note(triggerer), **_dispatch_note(triggerer),
        }
        state = {key: value for key, value in line.items() if key not in _NOT_NEWS}
        log.log(logging.INFO if state != said else logging.DEBUG, "progress", **line)
        last, said = stored, state


_NOT_NEWS = frozenset({"new", "last_commit_ms"})
"""Keys whose value alone does not make a line news (``new`` is 0 when nothing changed)."""


def lag_note(triggerer: ObservedTriggerer) -> dict[str, Any]:
    """The progress line's lag keys, those that apply.

    ``behind``: trigger id -> raw events queued, for the five most lagging;
    ``behind_more``: how many others lag; ``intake_paused``: its reasons.
    """
    manager = triggerer.manager
    behind = sorted(manager.lag(), key=lambda entry: -entry[2])
    note: dict[str, Any] = {}
    if behind:
        note["behind"] = {trigger_id: queued for _key, trigger_id, queued in behind[:5]}
    if len(behind) > 5:
        note["behind_more"] = len(behind) - 5
    if not manager.intake.is_open:
        note["intake_paused"] = sorted(manager.intake.reasons)
    return note


def _dispatch_note(triggerer: ObservedTriggerer) -> dict[str, Any]:
    service = triggerer.dispatch
    dispatcher = None if service is None else service.dispatcher
    return {} if dispatcher is None else {"runs_ran": dispatcher.runs_delivered}
