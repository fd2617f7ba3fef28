"""The real ``sharedstream triggerer`` on Service Bus: a killed triggerer or server, no queue.

The triggerer runs as a subprocess over ``servicebus_defs.py`` (three
watchers sharing one queue's receiver, one DAG on the ``orders`` asset)
and reaches the kit's test server - its own process, on a port of its own -
through a connection string. Accounting is exact
(:mod:`tests.chaos_accounting`): every (watcher, message) pair that matches
is stored once under ``<trigger>/<queue>/<sequence number>#0``, ``ship``
runs once per order, and at the end the queue is empty (every message
completed) and its dead-letter sub-queue too.

The queue's lock is 3 s, so the messages a killed triggerer held come back
soon, one delivery count higher; the store's idempotency keys absorb what
had been stored but not yet completed. The server restart keeps the
server's state with ``--state-file`` (:mod:`sharedstream.testing.servicebus.state_file`):
what was locked is delivered again, as Service Bus does after an outage.

The kill and restart tests run twice: the triggerer straight to the server,
and through the kit's latency proxy with a 20 ms round trip (``-20ms``),
where every round trip the producer makes per message shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from sharedstream.testing.brokers.servicebus import start_servicebus
from sharedstream.testing.latency_proxy import latency_proxy
from sharedstream.testing.servicebus.server import connection_string
from tests.chaos_accounting import (
    Expected,
    Reality,
    compare,
    compare_runs,
    count_stored_events,
    read_dag_runs,
    read_stored_events,
    watcher_triggers,
)
from tests.cli import ROOT, TriggererCli
from tests.crash_kit import (
    TRIGGERER_ENV,
    RestartableServer,
    assert_one_line_and_non_zero_exit,
    kill,
    running,
    stop_cleanly,
    wait_until,
)

servicebus: Any = pytest.importorskip("azure.servicebus")
OperationTimeoutError: type[Exception] = pytest.importorskip(
    "azure.servicebus.exceptions").OperationTimeoutError

DEFINITIONS = Path(__file__).with_name("servicebus_defs.py")
REGIONS = ("eu", "us", "apac")
RTTS = [0.0, 0.02]
"""Round trips between the triggerer and the server the kill and restart tests run at."""
RTT_IDS = ["direct", "20ms"]
SESSIONS = 12
LOCK_SECONDS = 3


def message(index: int) -> tuple[str, bytes]:
    """Message ``index`` as ``(region, body)``: an order, or every fifth a refund."""
    kind = "refund" if index % 5 == 0 else "order"
    return REGIONS[index % len(REGIONS)], json.dumps({"id": index, "kind": kind}).encode()


def watchers_for(index: int) -> list[str]:
    """The watchers (``asset/watcher``) of ``servicebus_defs.py`` that store an event for it."""
    region, body = message(index)
    if json.loads(body)["kind"] == "refund":
        return ["refunds/all"]
    return ["orders/all", "eu_orders/eu"] if region == "eu" else ["orders/all"]


def events_for(indexes: range) -> int:
    return sum(len(watchers_for(i)) for i in indexes)


def servicebus_process(workdir: Path, queue: str, *, sessions: bool = False,
                       state_file: Path | None = None,
                       max_delivery_count: int = 10) -> RestartableServer:
    """The kit's test server with ``queue`` (3 s locks), on a port of its own."""
    entities = {"queues": [{"name": queue, "lock_duration": LOCK_SECONDS,
                            "max_delivery_count": max_delivery_count,
                            "requires_session": sessions}]}
    return RestartableServer(lambda port: start_servicebus(
        workdir, entities=entities, port=port, state_file=state_file)[0])


@contextlib.contextmanager
def reached(server: RestartableServer, rtt: float) -> Iterator[str]:
    """The connection string the triggerer uses: the server's own, or (``rtt`` > 0) through a
    latency proxy of that round trip (it outlives a server restart on the same port)."""
    if not rtt:
        yield connection_string("127.0.0.1", server.port)
        return
    with latency_proxy("127.0.0.1", server.port, delay=rtt / 2, jitter=rtt / 20,
                       seed=29) as proxy:
        yield connection_string(proxy.host, proxy.port)


class Deployment:
    """One queue on ``server``, the test's sender, and the CLI over them.

    Messages are numbered by the order they are sent in: message ``i`` is
    the queue's sequence number ``i + 1`` (one sender, a new queue), so its
    events' source is ``<queue>/<i + 1>``. The triggerer connects ``via``
    that connection string when given (a latency proxy); the test's own
    client always goes straight to the server.
    """

    def __init__(self, server: RestartableServer, workdir: Path, queue: str, *,
                 sessions: bool = False, via: str | None = None) -> None:
        self.queue, self.sessions = queue, sessions
        self.string = connection_string("127.0.0.1", server.port)
        env = {**os.environ, "PYTHONPATH": str(ROOT), **TRIGGERER_ENV,
               "SERVICEBUS_TEST_CONNECTION_STRING": via or self.string,
               "SERVICEBUS_TEST_QUEUE": queue, "SERVICEBUS_TEST_SESSIONS": "1" if sessions else ""}
        self.cli = TriggererCli(workdir, env, DEFINITIONS)
        self.db = workdir / "sharedstream.db"
        self.sent = 0
        self.cli.run("init", "--path", str(self.cli.config))

    def client(self) -> Any:
        return servicebus.ServiceBusClient.from_connection_string(self.string, keep_alive=None)

    def send(self, count: int) -> None:
        """Send the next ``count`` messages, in order, 100 to a batch."""
        with self.client() as client, client.get_queue_sender(self.queue,
                keep_alive=None) as sender:
            for start in range(self.sent, self.sent + count, 100):
                batch = []
                for index in range(start, min(start + 100, self.sent + count)):
                    region, body = message(index)
                    batch.append(servicebus.ServiceBusMessage(
                        body, application_properties={"region": region},
                        session_id=f"s{index % SESSIONS}" if self.sessions else None))
                sender.send_messages(batch)
        self.sent += count

    def left(self) -> tuple[int, int]:
        """Messages still on the queue, and in its dead-letter sub-queue (peeked).

        A session-enabled queue is read through a session receiver: the next
        session with messages, if one comes within a second.
        """
        def peek(**options: Any) -> int:
            with self.client() as client, client.get_queue_receiver(
                    self.queue, **options) as receiver:
                return len(receiver.peek_messages(max_message_count=1000))

        try:
            queued = peek(session_id=servicebus.NEXT_AVAILABLE_SESSION,
                          max_wait_time=1) if self.sessions else peek()
        except OperationTimeoutError:  # no session has a message
            queued = 0
        return queued, peek(sub_queue=servicebus.ServiceBusSubQueue.DEAD_LETTER)

    def account(self, context: str) -> None:
        """Exact accounting of events and ``ship`` runs; nothing left, nothing dead-lettered."""
        ids = watcher_triggers(self.db)
        expected = Expected(events={ids[w]: set() for w in ("orders/all", "eu_orders/eu",
                                                             "refunds/all")})
        for index in range(self.sent):
            for watcher in watchers_for(index):
                expected.events[ids[watcher]].add(f"{self.queue}/{index + 1}")
        orders = expected.events[ids["orders/all"]]
        problems = compare(expected, Reality(read_stored_events(self.db), []))
        problems += compare_runs("ship", ids["orders/all"], orders, read_dag_runs(self.db, "ship"))
        queued, dead = self.left()
        if queued or dead:
            problems.append(f"{queued} messages left on the queue, {dead} dead-lettered")
        assert not problems, f"{context}: {self.sent} messages\n  " + "\n  ".join(problems)


# -- 1. the triggerer killed mid-stream -----------------------------------------------------

KILL_TOTAL = 2000


@pytest.mark.slow  # 13 s plain, about 45 s on sessions (each session's lane is serial)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("rtt", RTTS, ids=RTT_IDS)
@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "sessions"])
def test_a_sigkilled_triggerer_restarts_losing_and_duplicating_nothing(
    tmp_path: Path, sessions: bool, rtt: float,
) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue, sessions=sessions)) as server, \
            reached(server, rtt) as via:
        d = Deployment(server, tmp_path, queue, sessions=sessions, via=via)
        first = second = None
        try:
            d.send(KILL_TOTAL)
            expected_events = events_for(range(KILL_TOTAL))
            first = d.cli.start(0, log_level=None)
            wait_until(lambda: count_stored_events(d.db) >= expected_events // 8, 60,
                       "an eighth of the events stored", first, d.cli.log_path(0))
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            at_kill = count_stored_events(d.db)
            assert at_kill < expected_events, "everything was stored before the kill"

            second = d.cli.start(1, log_level=None)  # what the killed one held comes back
            wait_until(lambda: count_stored_events(d.db) >= expected_events, 90,
                       "every event stored", second, d.cli.log_path(1))
            # Messages whose events the killed one stored but had not completed stay locked
            # until their locks lapse, then come again and are completed as duplicates.
            wait_until(lambda: d.left() == (0, 0), 60, "every message completed", second,
                       d.cli.log_path(1))
            time.sleep(0.5)  # a stray duplicate would show too
            stop_cleanly(second, d.cli.log_path(1))
            d.account(f"SIGKILL with {at_kill} of {expected_events} events stored; "
                      f"log: {d.cli.log_path(1)}")
        finally:
            kill(first)
            kill(second)


# -- 2. the server killed and restarted mid-run ---------------------------------------------

RESTART_TOTAL = 2000


@pytest.mark.slow  # about 15 s
@pytest.mark.timeout(300)
@pytest.mark.parametrize("rtt", RTTS, ids=RTT_IDS)
def test_a_server_restart_is_ridden_out_losing_and_duplicating_nothing(
    tmp_path: Path, rtt: float,
) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    state_file = tmp_path / "servicebus-state.json"
    with running(servicebus_process(tmp_path, queue, state_file=state_file)) as server, \
            reached(server, rtt) as via:
        d = Deployment(server, tmp_path, queue, via=via)
        process = None
        try:
            d.send(RESTART_TOTAL)
            expected_events = events_for(range(RESTART_TOTAL))
            process = d.cli.start(0, log_level=None)
            wait_until(lambda: count_stored_events(d.db) >= expected_events // 6, 60,
                       "a sixth of the events stored", process, d.cli.log_path(0))
            server.kill()
            at_kill = count_stored_events(d.db)
            time.sleep(2.0)  # the triggerer finds it gone: its receives fail and retry
            assert process.poll() is None, d.cli.log(0)[-3000:]
            server.start()  # same port, same state file
            wait_until(lambda: count_stored_events(d.db) >= expected_events, 90,
                       "every event stored after the restart", process, d.cli.log_path(0))
            time.sleep(0.5)
            stop_cleanly(process, d.cli.log_path(0))
            assert at_kill < expected_events, "everything was stored before the restart"
            d.account(f"server killed with {at_kill} of {expected_events} events stored; "
                      f"log: {d.cli.log_path(0)}")
        finally:
            kill(process)


# -- 3. a queue that does not exist ----------------------------------------------------------

EXITS_WITHIN = 10.0
"""Seconds within which a triggerer on a missing queue must have given up."""


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(60)
def test_a_missing_queue_is_one_line_naming_it_and_a_non_zero_exit(tmp_path: Path) -> None:
    with running(servicebus_process(tmp_path, "present")) as server:
        d = Deployment(server, tmp_path, f"missing-{uuid.uuid4().hex[:8]}")
        line = assert_one_line_and_non_zero_exit(d.cli.start(0, log_level=None),
                                                 d.cli.log_path(0), d.queue, EXITS_WITHIN)
        assert "not found" in line.lower(), line


# -- 4. a key the namespace does not have ------------------------------------------------------


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(60)
def test_a_refused_token_is_one_line_and_a_non_zero_exit_without_a_restart_loop(
        tmp_path: Path) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with running(servicebus_process(tmp_path, queue)) as server:
        wrong = connection_string("127.0.0.1", server.port).replace(
            "SharedAccessKey=v;", "SharedAccessKey=not-the-key;")
        d = Deployment(server, tmp_path, queue, via=wrong)
        line = assert_one_line_and_non_zero_exit(d.cli.start(0, log_level=None),
                                                 d.cli.log_path(0), d.queue, EXITS_WITHIN)
        assert "not authorized (status 401: InvalidSignature" in line, line
        log = d.cli.log(0)
        assert "restarting" not in log, log[-2000:]
