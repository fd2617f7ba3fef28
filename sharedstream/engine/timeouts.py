"""The ack watchdog: force-fails subscribers that hold an event too long.

The clock starts at fan-out and the boundary is inclusive: a subscriber
still owing an event ``ack_timeout`` seconds after it was broadcast fails
with :class:`AckTimeout`. Each wake-up looks only at the oldest unresolved
event (:meth:`ResolutionBook.expire`), so its cost does not grow with the
number of outstanding events.

The watchdog sleeps until the oldest event's deadline, but never longer
than ``cadence``: with an injected clock (tests) real time and the clock
differ, and the cadence bounds how late a timeout can be noticed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.resolution import ResolutionBook
from sharedstream.engine.telemetry import instruments

__all__ = ["run_ack_watchdog", "watchdog_cadence"]

log = key_value_logger("sharedstream.stream")


def watchdog_cadence(ack_timeout: float) -> float:
    """Longest sleep between checks: a tenth of the timeout, within [10 ms, 1 s]."""
    return min(1.0, max(0.01, ack_timeout / 10))


async def run_ack_watchdog(book: ResolutionBook, clock: Callable[[], float]) -> None:
    """Expire overdue subscribers of ``book`` until cancelled."""
    cadence = watchdog_cadence(book.ack_timeout)
    failures = instruments().forced_failures
    attributes = {"stream": repr(book.key), "reason": "ack_timeout"}
    while True:
        deadline = book.next_deadline()
        delay = cadence if deadline is None else min(cadence, max(0.0, deadline - clock()))
        await asyncio.sleep(delay)
        for sub, record in book.expire(clock()):
            failures.add(1, attributes)
            log.warning(
                "ack timeout: trigger did not resolve an event in time; failing it (the broker "
                "redelivers what it owed)",
                stream=book.name,
                trigger=sub.trigger_id,
                position=record.position,
                timeout_s=book.ack_timeout,
            )
