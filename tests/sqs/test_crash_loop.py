"""A killed triggerer dead-letters no healthy message on SQS (issue 29, part 3).

SQS counts every receive of a message (``ApproximateReceiveCount``), also
the ones that ended because the triggerer holding it was killed (its
visibility lapsed). The watcher here (``crash_loop_defs.py``) tolerates no
failure (``max_redeliveries`` 0) and is slow, so a killed triggerer held
messages, some of them maybe already stored: each comes back with a
receive count of 2, which the broker's count alone makes poison. The store
counts each message's own failures, so the restarted triggerer fans them
out again instead: the stored ones are deleted as duplicates, the others
stored. The one poison message (the filter raises on it) is still
dead-lettered, to the dead-letter queue. Through the real CLI, aiobotocore
and the session's moto server.

Twice: the poison message among those the killed triggerer held (so it too
comes back received twice, and the healthy ones queued behind it in the
watcher fail with it, unseen: not their own failure, so they are shown
again, not dead-lettered, although SQS received them twice), and one sent
once the restarted triggerer settled all the others (received once, as
are the four sent behind it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from tests.chaos_accounting import count_stored_events, read_stored_events
from tests.cli import ROOT, TriggererCli
from tests.crash_kit import TRIGGERER_ENV, kill, stop_cleanly
from tests.sqs.conftest import SqsHarness

DEFINITIONS = Path(__file__).with_name("crash_loop_defs.py")
TOTAL = 40
HELD = 7
"""A poison message the killed triggerer held (it takes 10 at a time and had stored ~4)."""
LATE = 35
"""A poison message sent once the restarted triggerer settled the ones before it, so only it
receives it, once; four healthy ones follow."""


def body(index: int, poison: int) -> bytes:
    return json.dumps({"id": index, "poison": index == poison}).encode()


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("poison", [
    pytest.param(HELD, id="poison-held-at-the-kill"),
    pytest.param(LATE, id="poison-sent-after"),
])
async def test_a_killed_triggerer_dead_letters_no_healthy_message(sqs_endpoint: str,
                                                                  tmp_path: Path,
                                                                  poison: int) -> None:
    harness = SqsHarness(sqs_endpoint, fifo=False)
    await harness.start()
    first = second = None
    try:
        stream = await harness.create_stream()
        assert stream.dead_letter is not None
        cli = TriggererCli(tmp_path, {**os.environ, "PYTHONPATH": str(ROOT), **TRIGGERER_ENV,
                                      "SQS_TEST_ENDPOINT": sqs_endpoint,
                                      "SQS_TEST_QUEUE": stream.name,
                                      "SQS_TEST_DLQ": stream.dead_letter}, DEFINITIONS)
        cli.run("init", "--path", str(cli.config))
        db = tmp_path / "sharedstream.db"
        first_sent = LATE if poison == LATE else TOTAL
        await harness.produce(stream, [body(i, poison) for i in range(first_sent)])

        async def stored_some() -> bool:
            return count_stored_events(db) >= 4

        async def settled() -> bool:
            """Nothing left on the queue: visible, in flight or delayed."""
            return sum(await harness.counts(stream.name)) == 0

        first = cli.start(0)
        await cli.until(0, first, stored_some, within=60)
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait, 10)
        at_kill = count_stored_events(db)
        assert at_kill < TOTAL - 1, "everything was stored before the kill"

        # The killed one's messages show again within 3 s, received for the second time.
        second = cli.start(1, log_level="INFO")
        # Settled: deleted, whether stored or dead-lettered (as every message the killed one
        # held was, by the broker's count alone, before the store counted failures).
        await cli.until(1, second, settled, within=90)
        if first_sent < TOTAL:
            await harness.produce(stream, [body(i, poison) for i in range(first_sent, TOTAL)])
            await cli.until(1, second, settled, within=30)
        await asyncio.to_thread(stop_cleanly, second, cli.log_path(1))
        log = cli.log(1)
        index_of = {harness.raw_event_name(stream, i): i for i in range(TOTAL)}
        stored = sorted(index_of[e.source] for e in read_stored_events(db)
                        if e.source is not None)
        # A dead letter is sent, then its message deleted: a kill in between sends it again
        # on redelivery (at-least-once), so one copy per source is counted.
        dead = sorted({index_of[letter.source] for letter in await harness.dead_letters(stream)})
        assert dead == [poison], f"dead-lettered: {dead} ({at_kill} stored at the kill)"
        assert stored == [i for i in range(TOTAL) if i != poison], (at_kill, log[-3000:])
        assert "fanning out again messages delivered more than" in log, log[-3000:]
    finally:
        kill(first)
        kill(second)
        await harness.close()
