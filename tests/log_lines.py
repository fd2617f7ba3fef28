"""Reading structlog-style log records in tests: the message and the key-values, typed."""

from __future__ import annotations

import logging
from typing import Any

from sharedstream.engine.keyvalue_log import KeyValueMessage


def text_of(record: logging.LogRecord) -> str:
    """The record's message without its key-values (``"shared stream started"``)."""
    msg = record.msg
    return msg.text if isinstance(msg, KeyValueMessage) else record.getMessage()


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The record's key-values; fails the test for a record of a plain ``logging.Logger``."""
    values = getattr(record, "key_values", None)
    assert isinstance(values, dict), f"not a key-value line: {record.getMessage()!r}"
    return values
