"""Settings fingerprints, and the rule "one source, one set of settings per process".

A fingerprint is a short stable digest of settings (secrets included), safe
to log and to put in a shared-stream key: two triggers whose consumer
settings agree get the same digest, and no secret can be read back from it.

:class:`SourceClaims` enforces that a source (a queue, a subscription) is
consumed in one process with one set of settings: on a broker where
consumers compete for messages (SQS, Pub/Sub subscriptions, Service Bus
queues), two receivers with different settings would each get only part of
the messages. A producer claims its source when its poll opens and releases
it when it closes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Mapping
from typing import Any

__all__ = ["SourceClaims", "fingerprint", "secret_digest"]


def fingerprint(values: Mapping[str, Any]) -> str:
    """16 hex digits of SHA-256 over ``values`` as canonical JSON (``repr`` for the rest)."""
    canonical = json.dumps(dict(values), sort_keys=True, default=repr).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def secret_digest(values: Mapping[str, Any] | None) -> str:
    """The :func:`fingerprint` of secret settings, or ``""`` when there are none."""
    return fingerprint(values) if values else ""


class SourceClaims:
    """Which sources this process consumes, and with which settings fingerprint.

    One instance per broker module (module-level). Synchronous; called from
    one event loop.
    """

    def __init__(self) -> None:
        self._owners: dict[Hashable, str] = {}

    def claim(self, source: Hashable, settings: str) -> bool:
        """Claim ``source`` for ``settings``; ``False`` if it is consumed with other settings.

        Claiming again with the same fingerprint succeeds (triggers that agree
        share one consumer anyway).
        """
        theirs = self._owners.get(source)
        if theirs is not None and theirs != settings:
            return False
        self._owners[source] = settings
        return True

    def release(self, source: Hashable, settings: str) -> None:
        """Release ``source`` if ``settings`` still hold it. Idempotent."""
        if self._owners.get(source) == settings:
            del self._owners[source]
