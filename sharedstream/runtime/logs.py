"""Logging set-up of the ``sharedstream`` commands: our lines, and client libraries kept quiet.

A broker that goes away makes its client library log the same error many
times a second (aiokafka: "Unable connect to node ..."). Those lines say
one thing: the broker is unreachable and the client keeps retrying. The
commands let the first of each through with that said, and hide its
repeats for ``REPEAT_WINDOW`` seconds; ``sharedstream`` loggers are never
filtered.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["REPEAT_WINDOW", "QuietRepeats", "configure_logging"]

REPEAT_WINDOW = 60.0
"""Seconds during which a client library's repeated message is shown once."""


class QuietRepeats(logging.Filter):
    """Pass a library's record once per message template and ``window``; ours always."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._last: dict[tuple[str, object], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is shown (a first of its kind in the window is annotated)."""
        if record.name == "sharedstream" or record.name.startswith("sharedstream."):
            return True
        key = (record.name, record.msg)
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        self._last[key] = now
        if record.levelno >= logging.WARNING:
            record.msg = (f"{record.msg} (from the client library: the broker may be "
                          f"unreachable, and it keeps retrying; repeats hidden for "
                          f"{self.window:.0f}s)")
        return True


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (a name), with library repeats quieted."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(QuietRepeats())
