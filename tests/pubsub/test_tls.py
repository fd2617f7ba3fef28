"""The Pub/Sub producer over TLS: the kit's server serving TLS, the real SDK through our channel.

Production Pub/Sub is TLS gRPC. The kit's server (a child process, as
users start it) serves TLS with a certificate it makes at start; the
producer, given the server's CA as ``tls_ca_file``, receives over it, and
given another CA it refuses the server (the handshake fails, nothing is
received).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.producers.pubsub import (
    PubSubConfigError,
    PubSubSettings,
    PubSubSharedStreamProducer,
    pubsub_clients,
)
from sharedstream.testing.brokers.process import BrokerNotInstalled
from sharedstream.testing.brokers.pubsub import start_pubsub, stop_pubsub, tls_ca_file
from sharedstream.testing.runner import eventually
from sharedstream.testing.tls import make_certificates
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger
from tests.cli import run_sharedstream
from tests.pubsub.test_connected import polling

types: Any = pytest.importorskip("google.pubsub_v1.types")

PROJECT = "sharedstream-test"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The kit's Pub/Sub server serving TLS: its ``host:port`` and the CA that signed it."""
    workdir = tmp_path_factory.mktemp("pubsub-tls")
    try:
        process, host = start_pubsub(workdir, tls=True)
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        yield host, tls_ca_file(workdir)
    finally:
        stop_pubsub(process)


async def subscription_with(host: str, ca_file: Path, data: bytes) -> str:
    """A new topic and subscription on the server with one message ``data``; the subscription."""
    name = uuid.uuid4().hex[:12]
    topic, subscription = (f"projects/{PROJECT}/topics/t-{name}",
                           f"projects/{PROJECT}/subscriptions/s-{name}")
    publisher = pubsub_clients(host, "publisher", ca_file=str(ca_file))
    subscriber = pubsub_clients(host, "subscriber", ca_file=str(ca_file))
    try:
        await publisher.create_topic(name=topic)
        await subscriber.create_subscription(request={"name": subscription, "topic": topic})
        await publisher.publish(topic=topic, messages=[types.PubsubMessage(data=data)])
    finally:
        await publisher.transport.close()
        await subscriber.transport.close()
    return subscription


async def test_the_trigger_receives_over_tls(tls_server: tuple[str, Path]) -> None:
    host, ca_file = tls_server
    subscription = await subscription_with(host, ca_file, b"over tls")
    trigger = PubSubSharedStreamTrigger(project=PROJECT, subscription=subscription,
                                        emulator_host=host, tls_ca_file=str(ca_file))
    producer = PubSubSharedStreamTrigger.create_shared_stream_producer(trigger.consumer_kwargs())
    assert isinstance(producer, PubSubSharedStreamProducer)
    async with polling(producer) as (_task, received):
        assert await asyncio.wait_for(received.get(), 10) == b"over tls"


async def test_a_plain_text_producer_gets_nothing_from_a_tls_server(
        tls_server: tuple[str, Path]) -> None:
    """Without ``tls_ca_file`` the producer speaks plain text: the TLS server never answers it."""
    host, ca_file = tls_server
    subscription = await subscription_with(host, ca_file, b"x")
    producer = PubSubSharedStreamProducer(PubSubSettings(
        project=PROJECT, subscription=subscription, emulator_host=host, retry_backoff=0.05))
    async with polling(producer) as (_task, received):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(received.get(), 2)
        assert producer.connected is not True


async def test_another_ca_is_refused(tls_server: tuple[str, Path], tmp_path: Path,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """A CA that did not sign the server's certificate: the handshake fails, nothing arrives."""
    host, ca_file = tls_server
    subscription = await subscription_with(host, ca_file, b"x")
    impostor_ca = make_certificates(tmp_path / "other").ca_file
    producer = PubSubSharedStreamProducer(PubSubSettings(
        project=PROJECT, subscription=subscription, emulator_host=host,
        tls_ca_file=str(impostor_ca), retry_backoff=0.05))
    async with polling(producer) as (task, received):
        await eventually(lambda: "handshake" in caplog.text.lower(), within=10,
                         what="the failed TLS handshake logged")
        assert received.empty()
        assert not task.done()
        assert producer.connected is not True


def test_an_unreadable_ca_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PubSubConfigError, match=r"^tls_ca_file '.*missing.pem' cannot be read"):
        pubsub_clients("127.0.0.1:1", "subscriber", ca_file=str(tmp_path / "missing.pem"))


def test_a_ca_file_needs_an_emulator_host(tmp_path: Path) -> None:
    with pytest.raises(PubSubConfigError, match="tls_ca_file needs an emulator host"):
        pubsub_clients(None, "subscriber", ca_file=str(tmp_path / "ca.pem"))


# -- the real CLI: ``sharedstream send`` over TLS -----------------------------------------


async def test_cli_send_over_tls(tls_server: tuple[str, Path], tmp_path: Path) -> None:
    host, ca_file = tls_server
    subscription = await subscription_with(host, ca_file, b"first")
    topic = subscription.replace("/subscriptions/s-", "/topics/t-")
    result = run_sharedstream("send", "--broker", "pubsub", "--emulator-host", host,
                              "--tls-ca-file", str(ca_file), "--topic", topic,
                              "--value", "second", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    producer = PubSubSharedStreamProducer(PubSubSettings(
        project=PROJECT, subscription=subscription, emulator_host=host,
        tls_ca_file=str(ca_file)))
    async with polling(producer) as (_task, received):
        got = {await asyncio.wait_for(received.get(), 10) for _ in range(2)}
    assert got == {b"first", b"second"}


@pytest.mark.parametrize(("trust", "said"), [
    ("another CA", "the TLS handshake with Pub/Sub at {host} failed: certificate verify failed "
                   "against tls_ca_file {ca}"),
    ("none", "cannot reach Pub/Sub at {host}"),  # plain text: the server just hangs up
])
def test_cli_send_to_an_untrusted_server_is_one_line(
        tls_server: tuple[str, Path], tmp_path: Path, trust: str, said: str) -> None:
    """Another CA, or none (plain text to a TLS server): exit 1 and one line saying why."""
    host, _ca_file = tls_server
    impostor_ca = make_certificates(tmp_path / "other").ca_file
    given = ["--tls-ca-file", str(impostor_ca)] if trust == "another CA" else []
    result = run_sharedstream("send", "--broker", "pubsub", "--emulator-host", host, *given,
                              "--topic", f"projects/{PROJECT}/topics/any", "--value", "x",
                              cwd=tmp_path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    # gRPC's C core may log the failed handshake on stderr itself (its own ``I...`` lines);
    # ours is one line, the last.
    ours = [line for line in result.stderr.splitlines() if line.startswith("sharedstream:")]
    assert len(ours) == 1, result.stderr
    assert result.stderr.strip().endswith(ours[0])
    assert said.format(host=host, ca=impostor_ca) in ours[0]
