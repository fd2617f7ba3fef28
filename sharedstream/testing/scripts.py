"""Scripted filters: what a conformance trigger does with each message, by name.

A trigger is rebuilt from its serialized kwargs, so it can only carry the
*name* of its script; the scripts themselves live in :data:`SCRIPTS`. A
harness's conformance trigger calls :func:`pace` and then :func:`act` with
its script name and the raw value of each message, and emits, skips,
rejects (``reject_shared_stream_event()``) or raises
:class:`ScriptedFailure` as told. :func:`act` counts the failures it orders,
so a test can check how often a message was delivered.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

__all__ = ["SCRIPTS", "Script", "ScriptedFailure", "act", "pace"]


@dataclass
class Script:
    """What a scripted filter does with each value; unknown values are emitted."""

    reject: set[bytes] = field(default_factory=set)
    skip: set[bytes] = field(default_factory=set)
    fail: dict[bytes, int] = field(default_factory=dict)
    """Value -> how many more times to raise on it (-1: always)."""
    failures: int = 0
    """How many failures :func:`act` ordered so far."""
    delay: float = 0.0
    """Seconds the filter spends on each message (a slow watcher)."""


SCRIPTS: dict[str, Script] = {}
"""Scripts by name (a test registers one, then builds triggers naming it)."""


class ScriptedFailure(RuntimeError):
    """Raised by a scripted filter told to fail on a value."""


async def pace(script: str) -> None:
    """Spend the script's ``delay`` on one message (call it first in a scripted filter)."""
    delay = SCRIPTS[script].delay
    if delay:
        await asyncio.sleep(delay)


def act(script: str, value: bytes | None) -> str:
    """``"emit"``, ``"skip"``, ``"reject"`` or ``"fail"`` for ``value`` under ``script``.

    A value with failures left is failed first (and its count lowered);
    ``None`` (a tombstone, an empty body) is always emitted.
    """
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
