"""The Pub/Sub test server's own log hygiene: a client gone mid-answer is not an error."""

from __future__ import annotations

import logging

from sharedstream.testing.pubsub.server import ClientGoneFilter


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
