"""Stream names: the one human name a shared stream has in logs, metrics, status and letters.

A shared-stream key is what makes triggers share a consumer: a tuple of
every consumer setting, digests of secrets included. People need a name
instead, in the broker's own words: ``kafka orders (group sharedstream-orders)``,
``sqs orders-queue``, ``pubsub s (project p)``, ``servicebus orders/subscriptions/s``.
The trigger gives that *base name*
(:meth:`~sharedstream.engine.trigger.BaseEventTrigger.shared_stream_name`);
this module makes it unique and keeps it.

Terms: the *digest* of a key is the first eight hex digits of the SHA-256
of its ``repr`` (the same in every process, for the same settings); a
*name* is a base name, or a base name followed by `` [digest]`` when
another key has the same base name (the same topic and group on two
clusters, say).

Invariants (checked in ``tests/engine/test_stream_names.py``):

1. A key's name, once given in a process, never changes in that process:
   log lines, metric series and dead letters of one stream agree.
2. Two keys never get the same name: a key whose base name another key
   already has gets the digest appended.
3. Naming a batch (:meth:`StreamNames.name_all`, the triggerer's streams
   at start-up) does not depend on the batch's order: every key of a base
   name shared within the batch gets its digest. So the same definitions
   give the same names after a restart and on every triggerer.
4. A name holds nothing secret: base names are built from topics, queues,
   subscriptions and groups (never connection strings, credentials or
   hosts), and a digest reveals nothing of the key.

Names are kept for the life of the process (one short string per key ever
named: keys come from definitions, so they are few). The registry is
process-wide (:data:`STREAM_NAMES`), as a stream is the same stream for
every manager of the process; single event loop or not, its updates are
single dictionary operations under the GIL, and a name is only added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable

__all__ = ["STREAM_NAMES", "StreamNames", "broker_word", "stream_digest", "stream_name"]


def stream_digest(key: Hashable) -> str:
    """``08cb7d3a``: eight hex digits of the SHA-256 of ``repr(key)``, stable across processes."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:8]


def broker_word(key: Hashable) -> str:
    """The broker a key names (its first item, ``kafka``), or ``stream`` if it names none."""
    if isinstance(key, tuple) and key and isinstance(key[0], str) and key[0]:
        return key[0][:20]
    return "stream"


class StreamNames:
    """Every stream name given in this process, by key (see the module docstring)."""

    def __init__(self) -> None:
        self._names: dict[Hashable, str] = {}
        self._bases: dict[str, Hashable] = {}  # base name -> the first key that had it

    def name(self, key: Hashable, base: str | None) -> str:
        """The name of ``key``: the one it has, else ``base`` made unique and kept.

        ``base`` is the trigger's
        :meth:`~sharedstream.engine.trigger.BaseEventTrigger.shared_stream_name`;
        ``None`` (a trigger that gives none) names the stream by its broker
        and digest (``kafka [08cb7d3a]``).
        """
        found = self._names.get(key)
        if found is not None:
            return found
        base = base or f"{broker_word(key)} [{stream_digest(key)}]"
        first = self._bases.setdefault(base, key)
        return self._keep(key, base if first == key else f"{base} [{stream_digest(key)}]")

    def name_all(self, streams: Iterable[tuple[Hashable, str | None]]) -> None:
        """Name every ``(key, base)`` at once: keys sharing a base name all get their digest.

        Keys already named keep their names (invariant 1). Called by the
        triggerer with every stream of its definitions before any starts.
        """
        by_base: dict[str, set[Hashable]] = {}
        for key, base in streams:
            if key not in self._names and base:
                by_base.setdefault(base, set()).add(key)
        for base, keys in by_base.items():
            shared = len(keys) > 1 or base in self._bases  # its holder is another key
            for key in keys:
                self._bases.setdefault(base, key)
                self._keep(key, f"{base} [{stream_digest(key)}]" if shared else base)

    def get(self, key: Hashable) -> str:
        """The name ``key`` was given, or, if none yet, ``broker [digest]`` (nothing is kept)."""
        found = self._names.get(key)
        return found if found is not None else f"{broker_word(key)} [{stream_digest(key)}]"

    def _keep(self, key: Hashable, name: str) -> str:
        self._names[key] = name
        return name


STREAM_NAMES = StreamNames()
"""The names of this process's streams; the manager names each stream here as it starts."""


def stream_name(key: Hashable) -> str:
    """The name of the stream of ``key`` in this process (see :meth:`StreamNames.get`)."""
    return STREAM_NAMES.get(key)
