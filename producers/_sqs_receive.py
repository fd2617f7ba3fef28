"""SQS: the receive loop, long polls while ``max_in_flight`` leaves room.

Private to :mod:`sharedstream.producers.sqs`. Nothing here imports
aiobotocore: the producer hands in its API call and what it does with a
receive's messages.

Invariants:

1. A receive asks for ``max_messages`` only once ``max_in_flight`` leaves
   room for them all (reserved before the call, released after it, then
   what arrived is counted): when subscribers fall behind, no receive is
   made at all.
2. A receive that got no answer (SQS unreachable: botocore's retries
   spent) is tried again after the retry policy's delays;
   :attr:`SqsReceiver.receiving` is ``False`` from it until a receive
   returns. An answered error, or the last retry's, ends the poll (raised).
3. What a receive brought is handed to the producer's ``take`` with the
   time its visibility runs out, before the next receive of this loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sharedstream.brokerkit.inflight import InFlightLimit
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._sqs_types import SqsRequestError, SqsSettings, queue_name

__all__ = ["SYSTEM_ATTRIBUTES", "SqsReceiver"]

SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]
"""The system attributes read (all of them cost parsing time on every receive)."""


class SqsReceiver:
    """Receives from one queue (see the module docstring); one loop per ``run`` call.

    ``call`` is the producer's SQS call (``call(operation, **parameters)``,
    raising :class:`SqsRequestError`); ``take(messages, deadline)`` gets
    each receive's raw messages and the clock time their visibility ends;
    ``clock`` is the producer's monotonic clock; ``logger`` the producer's.
    Several loops may run at once (``receive_concurrency``), on the
    producer's event loop.
    """

    def __init__(self, settings: SqsSettings, *,
                 call: Callable[..., Awaitable[dict[str, Any]]],
                 take: Callable[[list[dict[str, Any]], float], Awaitable[None]],
                 in_flight: InFlightLimit, clock: Callable[[], float],
                 logger: KeyValueLogger) -> None:
        self.settings, self._call, self._take = settings, call, take
        self._in_flight, self._clock, self._log = in_flight, clock, logger
        self.receiving: bool | None = None
        """How the last ``ReceiveMessage`` went: ``None`` before any returned (invariant 2)."""

    async def run(self, queue_url: str) -> None:
        """Receive from ``queue_url`` while ``max_in_flight`` leaves room, until cancelled.

        A receive that got no answer at all (SQS unreachable: botocore's
        retries spent) is tried again after the retry policy's delays, with
        :attr:`receiving` ``False`` until one succeeds; an answered error, or
        the last retry's, ends the poll.
        """
        s = self.settings
        in_flight = self._in_flight
        delays: Iterator[float] | None = None  # the retry policy's, while unreachable
        while True:
            await in_flight.room(s.max_messages)
            in_flight.take(s.max_messages)  # reserve room for a full receive
            started = self._clock()
            try:
                response = await self._call(
                    "ReceiveMessage", QueueUrl=queue_url, MaxNumberOfMessages=s.max_messages,
                    WaitTimeSeconds=s.wait_time_seconds, VisibilityTimeout=s.visibility_timeout,
                    AttributeNames=SYSTEM_ATTRIBUTES,
                    MessageSystemAttributeNames=SYSTEM_ATTRIBUTES,
                    MessageAttributeNames=["All"],
                )
            except SqsRequestError as exc:
                self.receiving = False
                if exc.code:
                    raise  # SQS answered: not an outage that waiting mends
                delays = delays or s.retry_policy().delays()
                delay = next(delays, None)
                if delay is None:
                    raise
                self._log.warning("receiving failed; retrying", queue=queue_name(queue_url),
                                  error=exc, delay_s=round(delay, 2))
                await asyncio.sleep(delay)
                continue
            finally:
                in_flight.release(s.max_messages)
            self.receiving, delays = True, None
            received = response.get("Messages") or []
            in_flight.take(len(received))
            await self._take(received, started + s.visibility_timeout)
