"""Settings fingerprints and source claims; batched calls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sharedstream.brokerkit.batches import chunks, in_batches
from sharedstream.brokerkit.fingerprints import SourceClaims, fingerprint, secret_digest


def test_fingerprints_are_stable_short_and_order_free() -> None:
    a = fingerprint({"user": "u", "password": "secret"})
    assert a == fingerprint({"password": "secret", "user": "u"})
    assert len(a) == 16
    assert "secret" not in a
    assert a != fingerprint({"user": "u", "password": "other"})
    assert secret_digest({}) == secret_digest(None) == ""
    assert secret_digest({"k": 1}) == fingerprint({"k": 1})


def test_a_source_is_consumed_with_one_set_of_settings() -> None:
    claims = SourceClaims()
    assert claims.claim("orders", "s1")
    assert claims.claim("orders", "s1"), "the same settings share it"
    assert not claims.claim("orders", "s2")
    claims.release("orders", "s2")  # not the holder: no effect
    assert not claims.claim("orders", "s2")
    claims.release("orders", "s1")
    assert claims.claim("orders", "s2")


async def test_in_batches_keeps_order_and_bounds_concurrency() -> None:
    running = most = 0

    async def call(chunk: Sequence[int]) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)
        running -= 1
        return sum(chunk)

    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert await in_batches(list(range(7)), call, size=2, concurrency=2) == [1, 5, 9, 6]
    assert most == 2
