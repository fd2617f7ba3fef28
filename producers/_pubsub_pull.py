"""Pub/Sub: keeping one streaming pull of a subscription open, and reopening it.

Private to :mod:`sharedstream.producers.pubsub`. Nothing here imports
google-cloud-pubsub: the producer hands in its call wrapper, its SDK loader
and its subscriber client, and takes each response (:meth:`StreamingPull.run`).

Invariants:

1. One stream at a time: :meth:`StreamingPull.run` opens the next only
   once the last has ended. A response is taken (the producer's ``take``)
   and room waited for under ``max_in_flight`` before the next is read, so
   a slow poll slows the stream instead of queueing without bound.
2. :attr:`StreamingPull.open` is ``True`` from a stream's opening to its
   end, and ``False`` otherwise; the producer's ``connected`` reads it and
   :attr:`StreamingPull.ends` (streams that keep ending the same way).
3. A stream that delivered something and then broke is reopened at once
   with a fresh retry budget (an INFO line, or the streak's WARNING); one
   that broke before delivering goes to the retry policy, whose last
   failure ends the poll. ``INVALID_ARGUMENT`` before any delivery is a
   :class:`PubSubConfigError`: no retry can change the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._pubsub_stream_ends import StreamEnds
from sharedstream.producers._pubsub_types import (
    PubSubConfigError,
    PubSubRequestError,
    PubSubSettings,
)

__all__ = ["HEARTBEAT", "StreamingPull"]

HEARTBEAT = 30.0
"""Seconds between the empty requests that keep an idle stream open (as the SDK's client)."""


class StreamingPull:
    """One subscription's streaming pull, reopened whenever Pub/Sub ends it.

    ``call(operation, request)`` is the producer's unary call wrapper
    (counted, retried per the retry policy, errors wrapped); ``take`` is
    given each response's protobuf message; ``room`` returns once
    ``max_in_flight`` leaves room for more; ``clock`` is the producer's
    monotonic clock; ``logger`` the producer's. Runs on the producer's
    event loop, as one worker of its poll.
    """

    def __init__(self, settings: PubSubSettings, *, client_id: str,
                 call: Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]],
                 sdk: OptionalSdk, take: Callable[[Any], Awaitable[None]],
                 room: Callable[[], Awaitable[None]], clock: Callable[[], float],
                 logger: KeyValueLogger) -> None:
        self.settings, self.subscription = settings, settings.subscription_path
        self._client_id, self._call, self._sdk = client_id, call, sdk
        self._take, self._room, self._log = take, room, logger
        self.open = False
        """A stream is open (see invariant 2)."""
        # A failure comes back once its lease lapses (the ack deadline): a stream that lived
        # longer than that and a minute more did get past it.
        self.ends = StreamEnds(settings.ack_deadline + 60.0, clock=clock)
        """The streak of streams that ended the same way."""

    async def run(self, subscriber: Any) -> None:
        """Keep one streaming pull of ``subscriber`` open; reopen it when Pub/Sub ends it.

        Opening is retried per the retry policy; a stream that delivered
        something and then broke is reopened with a fresh budget. A fatal
        error (no such subscription, no permission) ends the poll, raised.
        :attr:`open` is ``False`` from a stream's error until the next one
        is open. A stream refused with ``INVALID_ARGUMENT`` before it
        delivered anything (a malformed subscription name) is a
        :class:`PubSubConfigError`: no retry can change the request.
        """
        exceptions = self._sdk("google.api_core.exceptions")
        while True:
            try:
                await self._call("StreamingPull", lambda: self._stream_once(subscriber))
            except PubSubRequestError as exc:
                cause = exc.__cause__
                if isinstance(cause, exceptions.InvalidArgument):
                    raise PubSubConfigError(f"StreamingPull on {self.subscription}: refused as "
                                            f"invalid ({cause.message})") from cause
                raise

    async def _stream_once(self, subscriber: Any) -> None:
        s = self.settings
        types = self._sdk("google.pubsub_v1.types")
        exceptions = self._sdk("google.api_core.exceptions")
        first = types.StreamingPullRequest(
            subscription=self.subscription, stream_ack_deadline_seconds=s.ack_deadline,
            max_outstanding_messages=s.max_in_flight,
            max_outstanding_bytes=s.max_in_flight_bytes, client_id=self._client_id)

        async def requests() -> AsyncIterator[Any]:
            yield first
            while True:  # acks and deadlines go as unary calls; this only keeps it open
                await asyncio.sleep(HEARTBEAT)
                yield types.StreamingPullRequest()

        try:
            # Returns once the call's headers are on the wire: a connection is up.
            stream = await subscriber.streaming_pull(requests=requests(), retry=None)
        except exceptions.GoogleAPICallError:
            self.open = False
            raise  # not open: the retry says it (a warning per attempt), within its budget
        self.open = True
        self.ends.opened()
        delivered = False
        try:
            async for response in stream:
                delivered = True
                await self._take(type(response).pb(response))
                await self._room()
        except exceptions.GoogleAPICallError as exc:
            self.open = False
            self._ended(exc, reopening=delivered)
            if not delivered:
                raise
        finally:
            stream.cancel()

    def _ended(self, exc: Exception, *, reopening: bool) -> None:
        """Say that an open streaming pull ended with ``exc``; loudly when it keeps doing so.

        Pub/Sub ends streams now and then: an INFO line when the stream is
        reopened at once (``reopening``: it delivered something first);
        otherwise the error goes to the retry, which says it. The same
        error three times in a row, each stream ending before it lived
        ``ack_deadline`` + 60 s, then the 6th, 12th, 24th... time, is a
        WARNING with the count (:class:`StreamEnds`), and the producer is
        not ``connected`` meanwhile: a stream that cannot get past
        something (a message larger than the channel takes, say) is
        reopened all the same - it may pass - but never silently.
        """
        said = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        if self.ends.ended(said):
            self._log.warning("streaming pull keeps ending with the same error; opening "
                              "another", subscription=self.subscription, error=said,
                              times_in_a_row=self.ends.in_a_row)
        elif reopening:
            self._log.info("streaming pull ended; opening another",
                           subscription=self.subscription, error=said)
