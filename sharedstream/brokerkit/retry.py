"""Bounded retries with exponential backoff, for one broker call at a time.

A :class:`RetryPolicy` says how often and how long: ``retries`` retries after
the first attempt (so ``retries + 1`` attempts in all), the first delay
``backoff`` seconds, doubling each time, never above ``max_delay``.
:func:`retrying` applies it to one call: transient errors (as the broker
module decides) are retried, a lasting one or the last attempt's is wrapped
in the broker's error (``raise wrap(...) from exc``). ``sleep`` is injected
so tests run without waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from sharedstream.brokerkit.errors import BrokerError
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["RetryPolicy", "retrying"]

log = key_value_logger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many retries a call gets and how long to wait before each."""

    retries: int
    """Retries after the first attempt (0: try once)."""
    backoff: float
    """Seconds before the first retry; doubles each retry."""
    max_delay: float = 2.0
    """The longest wait between two attempts."""

    def delays(self) -> Iterator[float]:
        """The wait before each retry, in order (``retries`` values)."""
        delay = self.backoff
        for _ in range(self.retries):
            yield delay
            delay = min(delay * 2, self.max_delay)


async def retrying(
    what: str,
    call: Callable[[], Awaitable[_T]],
    *,
    policy: RetryPolicy,
    catch: type[Exception] | tuple[type[Exception], ...],
    transient: Callable[[Exception], bool],
    wrap: Callable[[str], BrokerError],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> _T:
    """Await ``call()``, retrying ``catch`` errors that are ``transient``, with backoff.

    Returns what the first successful attempt returns. An error that is not
    transient, or the last attempt's, is raised as ``wrap(f"{what} failed:
    ...")`` from the SDK error. Errors outside ``catch`` (and
    ``CancelledError``) pass through untouched. Each retry is logged at
    warning level, naming ``what``, marked as a repeat of ``what``
    (``extra={"repeat_key": what}``): the ``sharedstream`` commands show
    one such line a minute per call (:mod:`sharedstream.runtime.logs`).
    """
    delays = policy.delays()
    while True:
        try:
            return await call()
        except catch as exc:
            delay = next(delays, None) if transient(exc) else None
            if delay is None:
                raise wrap(f"{what} failed: {exc}") from exc
            # One line per call while the broker stays away, not one per retry: the
            # runtime's log filter holds back the repeats of a call (see REPEAT_KEY).
            log.warning("broker call failed; retrying", call=what, error=exc,
                        delay_s=round(delay, 2), extra={"repeat_key": what})
            await sleep(delay)
