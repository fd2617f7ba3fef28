"""New messages of a recreated Service Bus queue are not taken for redeliveries (issue 29, part 4).

Service Bus numbers a queue's messages from 1 again when the queue is
deleted and created anew, so a new message gets the raw event name
(``<queue>/<sequence number>``) of one the store holds. Here the kit's
server is stopped and started again without its state (a recreated
queue, same name, same port) between two runs of ``sharedstream
triggerer`` over ``servicebus_defs.py``: every message of the second batch
must be stored (under a key with its fingerprint, a WARNING saying a name
was reused), nothing of the first stored twice, and the queue left empty.
Through the real CLI, SDK and server.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from tests.chaos_accounting import count_stored_events, read_stored_events
from tests.crash_kit import running, wait_until
from tests.servicebus.test_crash import Deployment, events_for, servicebus_process

FIRST = 30
WARNING = "new messages reused the names of stored messages"


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(180)
def test_a_recreated_queue_s_messages_are_all_stored(tmp_path: Path) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue)) as server:
        d = Deployment(server, tmp_path, queue)
        d.send(FIRST)
        with d.cli.running(0) as process:
            wait_until(lambda: count_stored_events(d.db) >= events_for(range(FIRST))
                       and d.left() == (0, 0), 60, "the first batch stored and completed",
                       process, d.cli.log_path(0))
        first = {(e.trigger_id, e.source) for e in read_stored_events(d.db)}

        server.stop()  # no state file: the queue comes back empty, numbered from 1 again
        server.start()
        d.send(FIRST)  # messages FIRST..2*FIRST-1, sequence numbers 1..FIRST again
        total = events_for(range(2 * FIRST))
        with d.cli.running(1, log_level="INFO") as process:
            wait_until(lambda: count_stored_events(d.db) >= total and d.left() == (0, 0), 60,
                       "the second batch stored and completed", process,
                       d.cli.log_path(1))
        log = d.cli.log(1)
    events = read_stored_events(d.db)
    assert len(events) == total, f"{len(events)} events for {total}; log: {log[-2000:]}"
    assert {(e.trigger_id, e.source) for e in events} == first  # the same names, twice each
    assert WARNING in log, log[-2000:]
