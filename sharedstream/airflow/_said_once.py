"""Say a thing once per process: which connection settings are ignored, for example.

A stream's producer is built more than once in a triggerer's life (the
start-up check, each start of the stream, a restart after an error); a
warning about the connection it reads should not repeat each time.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["SaidOnce"]

MAX_REMEMBERED = 1024
"""Most distinct things remembered; past it, the memory starts over (a warning may repeat)."""


class SaidOnce:
    """Remembers what was said; synchronous, for one event loop's thread."""

    def __init__(self) -> None:
        self._said: set[Hashable] = set()

    def first(self, *what: Hashable) -> bool:
        """Whether ``what`` is said for the first time (and remember it)."""
        if what in self._said:
            return False
        if len(self._said) >= MAX_REMEMBERED:
            self._said.clear()
        self._said.add(what)
        return True
