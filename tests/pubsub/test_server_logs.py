"""The Pub/Sub test server's own log hygiene: a client gone mid-answer is not an error."""

from __future__ import annotations

import asyncio
import functools
import logging

from sharedstream.testing.pubsub.server import ClientGoneFilter, serve


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("grpc._cython.cygrpc", logging.ERROR, __file__, 1, msg, args, None)


def test_an_answer_nobody_took_is_dropped_and_every_other_record_passes() -> None:
    quiet = ClientGoneFilter()
    gone = ("ExecuteBatchError raised in core by servicer method"
            " [/google.pubsub.v1.Publisher/Publish]")
    assert not quiet.filter(_record(gone))
    assert not quiet.filter(_record("%s raised in core by servicer method [%s]",
                                    "ExecuteBatchError", "/google.pubsub.v1.Publisher/Publish"))
    assert quiet.filter(_record("ValueError raised in core by servicer method [/x]"))
    assert quiet.filter(_record("something else entirely"))


def _set(event: asyncio.Event, _port: int) -> None:
    event.set()


async def test_the_filter_outlives_the_server_and_is_installed_once() -> None:
    """gRPC can log a gone client's call after ``server.stop()`` returned: the filter stays."""
    core_log = logging.getLogger("grpc._cython.cygrpc")
    for _ in range(2):
        ready = asyncio.Event()
        server = asyncio.create_task(serve(ready=functools.partial(_set, ready)))
        await ready.wait()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    assert [type(f) for f in core_log.filters].count(ClientGoneFilter) == 1
