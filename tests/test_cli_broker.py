"""``sharedstream broker start``: what it prints works, and a signal ends it at once, cleanly.

The command runs as a user runs it (a subprocess of its own); the test
copies the ``export`` line it prints, sends with the ``sharedstream send``
command it prints, reads the message back with the broker's SDK, then
stops it with SIGINT (Ctrl-C) or SIGTERM: exit 0 within a few seconds, and
the broker's process (Tansu, moto) is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.brokers import BrokerNotInstalled, tansu_binary
from tests.cli import cli_environment, run_sharedstream

STOP_WITHIN = 5.0
"""Seconds a signalled ``broker start`` may take to exit."""


class Started:
    """A running ``sharedstream broker start``: its process and what it printed."""

    def __init__(self, process: subprocess.Popen[str], banner: list[str]) -> None:
        self.process, self.banner = process, banner

    def line(self, start: str) -> str:
        """The (stripped) printed line that starts with ``start``."""
        return next(line.strip() for line in self.banner if line.strip().startswith(start))

    def exported(self) -> tuple[str, str]:
        """The variable of the ``export NAME='VALUE'`` line, and its value."""
        name, _, value = self.line("export ").removeprefix("export ").partition("=")
        return name, shlex.split(value)[0]

    def send_command(self) -> list[str]:
        """The printed ``sharedstream send ...`` command's arguments after ``sharedstream``."""
        return shlex.split(self.line("sharedstream send "))[1:]


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Any]:
    """Start ``sharedstream broker start ARGS``; return once it printed its banner.

    Whatever is still running when the test ends is killed.
    """
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> Started:
        process = subprocess.Popen(
            [sys.executable, "-m", "sharedstream", "broker", "start", *args], cwd=tmp_path,
            env=cli_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout is not None
        banner: list[str] = []
        deadline = time.monotonic() + 60
        while not banner or banner[-1].strip() != "Ctrl-C stops it.":
            line = process.stdout.readline()
            assert line, f"exited with {process.wait()}: {process.communicate()[1]}"
            assert time.monotonic() < deadline, banner
            banner.append(line)
        return Started(process, banner)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def _processes_listening_on(address: str) -> list[str]:
    """The command lines of processes whose arguments name ``address`` (``host:port``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if address in command and "broker start" not in command:
                found.append(command)
    return found


def _stop(started: Started, signum: int) -> None:
    began = time.monotonic()
    started.process.send_signal(signum)
    assert started.process.wait(timeout=STOP_WITHIN) == 0, started.process.communicate()
    assert time.monotonic() - began < STOP_WITHIN
    _, stderr = started.process.communicate()
    assert stderr.strip().splitlines()[-1].startswith("stopped "), stderr


def test_kafka_prints_a_connection_that_works_and_ctrl_c_kills_tansu(
        start_broker: Any, tmp_path: Path) -> None:
    aiokafka: Any = pytest.importorskip("aiokafka")
    try:
        tansu_binary()
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    started = start_broker("kafka", "--create", "cli-orders")
    name, value = started.exported()
    assert name == "SHAREDSTREAM_CONN_LOCAL_KAFKA"
    bootstrap = json.loads(value)["extra"]["bootstrap.servers"]
    assert started.line("[connections.local_kafka]")
    command = started.send_command()
    assert command[:5] == ["send", "--broker", "kafka", "--conn-id", "local_kafka"]
    sent = run_sharedstream(*command, "--key", "eu", cwd=tmp_path, env={name: value})
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout == "sent 1 message to kafka topic cli-orders\n"

    async def read_back() -> list[Any]:
        consumer = aiokafka.AIOKafkaConsumer("cli-orders", bootstrap_servers=bootstrap,
                                             auto_offset_reset="earliest")
        await consumer.start()
        try:
            async with asyncio.timeout(20):
                return [await consumer.getone()]
        finally:
            await consumer.stop()

    [record] = asyncio.run(read_back())
    assert (record.key, json.loads(record.value)) == (b"eu", {"id": 1})
    assert _processes_listening_on(bootstrap)  # Tansu, until the signal
    _stop(started, signal.SIGINT)
    assert _processes_listening_on(bootstrap) == []


def test_sqs_fifo_queue_from_the_printed_connection_and_sigterm(
        start_broker: Any, tmp_path: Path) -> None:
    session: Any = pytest.importorskip("aiobotocore.session").get_session()
    started = start_broker("sqs", "--create", "cli-orders.fifo")
    name, value = started.exported()
    connection = json.loads(value)
    endpoint = connection["extra"]["endpoint_url"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", endpoint)
    sent = run_sharedstream(*started.send_command(), "--group-id", "eu", cwd=tmp_path,
                            env={name: value})
    assert sent.stdout == "sent 1 message to sqs queue cli-orders.fifo\n", sent.stderr

    async def read_back() -> list[dict[str, Any]]:
        async with session.create_client(
                "sqs", region_name="us-east-1", endpoint_url=endpoint,
                aws_access_key_id=connection["login"],
                aws_secret_access_key=connection["password"]) as client:
            url = (await client.get_queue_url(QueueName="cli-orders.fifo"))["QueueUrl"]
            response = await client.receive_message(QueueUrl=url, WaitTimeSeconds=5,
                                                    AttributeNames=["All"])
            return list(response["Messages"])

    [message] = asyncio.run(read_back())
    assert json.loads(message["Body"]) == {"id": 1}
    assert message["Attributes"]["MessageGroupId"] == "eu"
    _stop(started, signal.SIGTERM)
    assert _processes_listening_on(f"-p {endpoint.rpartition(':')[2]}") == []


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the Service Bus SDK's lost sockets
@pytest.mark.parametrize(("broker", "sdk", "where"), [
    ("pubsub", "google.pubsub_v1", "pubsub topic projects/local/topics/orders"),
    ("servicebus", "proton", "servicebus queue orders"),
])
def test_the_test_servers_take_the_printed_send(start_broker: Any, tmp_path: Path, broker: str,
                                                sdk: str, where: str) -> None:
    pytest.importorskip(sdk)
    started = start_broker(broker)
    name, value = started.exported()
    sent = run_sharedstream(*started.send_command(), cwd=tmp_path, env={name: value})
    assert sent.stdout == f"sent 1 message to {where}\n", sent.stderr
    _stop(started, signal.SIGINT)


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_sharedstream("broker", "start", "kafka", "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"sharedstream: error: port {port} is in use on 127.0.0.1: stop "
                             "what listens there, or give another --port (or none: a free one)\n")
