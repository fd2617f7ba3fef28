"""The ``webhook`` target against a real aiohttp receiver on a loopback port.

The receiver checks what a real one would (the signature, when it knows
the secret; a JSON body) and is scripted per test to answer, hang or drop
the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from sharedstream.connections import (
    Connection,
    ConnectionNotFound,
    parse_connection_uri,
)
from sharedstream.dispatch.document import RunDocument
from sharedstream.dispatch.target import (
    Delivery,
    TargetConfigError,
    TargetContext,
    TargetError,
    check_options,
)
from sharedstream.dispatch.webhook import WebhookTarget, base_url, verify_signature
from tests.dispatch.conftest import World, running
from tests.dispatch.test_command_target import document
from tests.engine.harness import eventually

SECRET = "s3cret"  # noqa: S105 - the test receiver's signing secret


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: bytes
    signed: bool | None  # whether the signature verified; None when the receiver has no secret


Answer = Callable[[Received, web.Request], Awaitable[web.StreamResponse]]


class Receiver:
    """A webhook receiver: records requests, refuses a bad signature (401), answers ``answer``."""

    def __init__(self) -> None:
        self.secret: str | None = SECRET
        self.requests: list[Received] = []
        self.answer: Answer = reply(200, {"id": "r-1"})
        self.released = asyncio.Event()  # ends every hanging answer (at teardown)
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def connection(self, uri: str | None = None) -> Connection:
        return parse_connection_uri("hooks", uri or f"http://:{SECRET}@127.0.0.1:{self.port}/hooks")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = dict(request.headers)
        signed = None
        if self.secret is not None:
            signed = verify_signature(self.secret, headers.get("X-Sharedstream-Timestamp", ""),
                                      body, headers.get("X-Sharedstream-Signature", ""))
        seen = Received(request.path, headers, body, signed)
        self.requests.append(seen)
        if signed is False:
            return web.Response(status=401, text="bad signature")
        if request.content_type != "application/json":
            return web.Response(status=415, text="expected application/json")
        json.loads(body)
        return await self.answer(seen, request)


def reply(status: int, document: Any = None, text: str = "") -> Answer:
    async def answer(seen: Received, request: web.Request) -> web.StreamResponse:
        if document is not None:
            return web.json_response(document, status=status)
        return web.Response(status=status, text=text)

    return answer


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    await found.start()
    yield found
    await found.stop()


def webhook(connection: Callable[[str], Connection], **options: Any) -> WebhookTarget:
    settings = check_options(WebhookTarget, {"conn_id": "hooks", **options}, "test")
    return WebhookTarget("hooks", settings, TargetContext({}, connection))


@contextlib.asynccontextmanager
async def opened(target: WebhookTarget) -> AsyncIterator[WebhookTarget]:
    await target.open()
    try:
        yield target
    finally:
        await target.aclose()


async def post(receiver: Receiver, run: RunDocument | None = None, **options: Any) -> Delivery:
    """Deliver one run through a webhook target on ``receiver``'s connection."""
    async with opened(webhook(lambda _: receiver.connection(), **options)) as target:
        return await target.deliver(run or document(), lambda _: None)


async def refused(receiver: Receiver, **options: Any) -> TargetError:
    with pytest.raises(TargetError) as caught:
        await post(receiver, **options)
    return caught.value


# -- what is sent ---------------------------------------------------------------------------


async def test_the_body_is_the_run_document_and_the_headers_name_it(receiver: Receiver) -> None:
    run = document()
    before = int(time.time())
    await post(receiver, run)
    (seen,) = receiver.requests
    assert json.loads(seen.body) == run.to_json()
    assert seen.path == "/hooks"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["Idempotency-Key"] == "ship/asset_triggered__000000000007"
    assert seen.headers["X-Sharedstream-Attempt"] == "2"
    assert before <= int(seen.headers["X-Sharedstream-Timestamp"]) <= int(time.time())
    assert seen.headers["traceparent"] == run.trace_parent
    assert seen.signed is True


async def test_a_run_without_trace_context_sends_no_traceparent(receiver: Receiver) -> None:
    await post(receiver, dataclasses.replace(document(), trace_parent=None))
    assert "traceparent" not in receiver.requests[0].headers


async def test_the_signature_fails_with_another_secret_body_or_time(receiver: Receiver) -> None:
    await post(receiver)
    seen = receiver.requests[0]
    stamp = seen.headers["X-Sharedstream-Timestamp"]
    signature = seen.headers["X-Sharedstream-Signature"]
    assert signature.startswith("sha256=")
    assert verify_signature(SECRET, stamp, seen.body, signature)
    assert not verify_signature("guess", stamp, seen.body, signature)
    assert not verify_signature(SECRET, stamp, seen.body.replace(b"ship", b"shop"), signature)
    assert not verify_signature(SECRET, int(stamp) + 1, seen.body, signature)
    assert not verify_signature(SECRET, stamp, seen.body, signature, now=int(stamp) + 301)
    assert verify_signature(SECRET, stamp, seen.body, signature, now=int(stamp) + 299)
    assert not verify_signature(SECRET, "soon", seen.body, signature)


async def test_a_dag_posts_to_its_own_path(receiver: Receiver) -> None:
    assert check_options(WebhookTarget, {"path": "orders/eu"}, "dag", dag_only=True)
    await post(receiver, path="orders/eu")
    assert receiver.requests[0].path == "/hooks/orders/eu"


async def test_without_a_password_deliveries_are_unsigned_and_a_warning_says_so(
        receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.secret = None
    uri = f"http://127.0.0.1:{receiver.port}/hooks"
    target = webhook(lambda _: receiver.connection(uri))
    with caplog.at_level(logging.WARNING, logger="sharedstream.dispatch.webhook"):
        async with opened(target):
            await target.deliver(document(), lambda _: None)
            await target.deliver(document(run_id="r2"), lambda _: None)
    assert [r.headers.get("X-Sharedstream-Signature") for r in receiver.requests] == [None, None]
    (warning,) = [r for r in caplog.records if r.name == "sharedstream.dispatch.webhook"]
    assert "not signed" in warning.getMessage()
    assert "\n" not in warning.getMessage()


# -- what the answer means ------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "external"), [
    (reply(200, {"id": "r-1", "url": "https://hooks.example/r-1"}),
     ("r-1", "https://hooks.example/r-1")),
    (reply(202, {"run_id": 42}), ("42", None)),
    (reply(200, {"id": True, "url": 5}), (None, None)),
    (reply(201, text="created"), (None, None)),
    (reply(204), (None, None)),
])
async def test_any_2xx_is_dispatched_with_what_the_receiver_called_it(
        receiver: Receiver, answer: Answer, external: tuple[str | None, str | None]) -> None:
    receiver.answer = answer
    delivery = await post(receiver)
    assert delivery.state == "dispatched"
    assert delivery.detail is not None
    assert delivery.detail.startswith("HTTP 20")
    assert (delivery.external_id, delivery.external_url) == external


async def test_409_means_the_receiver_already_has_it(receiver: Receiver) -> None:
    receiver.answer = reply(409, {"detail": "duplicate key"})
    assert await post(receiver) == Delivery("dispatched", detail="HTTP 409: already delivered")


@pytest.mark.parametrize("status", [500, 503, 429, 408])
async def test_a_busy_or_broken_receiver_is_retried(receiver: Receiver, status: int) -> None:
    receiver.answer = reply(status, text="try later\nmore")
    error = await refused(receiver)
    assert error.retryable
    assert str(error) == (f"POST http://127.0.0.1:{receiver.port}/hooks: "
                          f"HTTP {status}: try later")


@pytest.mark.parametrize("status", [400, 404])
async def test_a_refusal_is_not_retried_and_says_why(receiver: Receiver, status: int) -> None:
    receiver.answer = reply(status, text="\nno such hook: ship\nsecond line")
    error = await refused(receiver)
    assert not error.retryable
    assert f"HTTP {status}: no such hook: ship" in str(error)
    assert "second line" not in str(error)


async def test_a_wrong_secret_is_refused_by_the_receiver_for_good(receiver: Receiver) -> None:
    receiver.secret = "another"  # noqa: S105 - not the one the connection holds
    error = await refused(receiver)
    assert not error.retryable
    assert "HTTP 401: bad signature" in str(error)
    assert SECRET not in str(error)


async def test_no_answer_within_the_timeout_is_retried(receiver: Receiver) -> None:
    async def hang(seen: Received, request: web.Request) -> web.StreamResponse:
        await receiver.released.wait()
        return web.Response()

    receiver.answer = hang
    began = time.monotonic()
    error = await refused(receiver, timeout=0.2)
    assert error.retryable
    assert "no answer within 0.2 s" in str(error)
    assert time.monotonic() - began < 2


async def test_a_dropped_connection_is_retried(receiver: Receiver) -> None:
    async def drop(seen: Received, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    receiver.answer = drop
    error = await refused(receiver)
    assert error.retryable
    assert error.args[0].startswith(f"POST http://127.0.0.1:{receiver.port}/hooks: ")


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port held bound but not listening: connecting to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


async def test_a_refused_connection_is_retried(closed_port: int) -> None:
    uri = f"http://:{SECRET}@127.0.0.1:{closed_port}"
    async with opened(webhook(lambda _: parse_connection_uri("hooks", uri))) as target:
        with pytest.raises(TargetError) as caught:
            await target.deliver(document(), lambda _: None)
    assert caught.value.retryable
    assert f"127.0.0.1:{closed_port}" in str(caught.value)


# -- configuration --------------------------------------------------------------------------


def test_a_target_without_conn_id_is_refused_when_configured() -> None:
    with pytest.raises(TargetConfigError, match=r"\[targets.hooks\]: conn_id is required"):
        check_options(WebhookTarget, {}, "[targets.hooks]")


async def test_open_refuses_a_missing_or_malformed_connection() -> None:
    def missing(conn_id: str) -> Connection:
        raise ConnectionNotFound(conn_id)

    with pytest.raises(TargetConfigError, match=r"target 'hooks': connection 'hooks' not found"):
        await webhook(missing).open()
    with pytest.raises(TargetConfigError, match=r"invalid connection 'hooks'"):
        await webhook(lambda conn_id: parse_connection_uri(conn_id, "no uri here")).open()
    with pytest.raises(TargetConfigError, match=r"connection 'hooks' has no host"):
        await webhook(lambda conn_id: parse_connection_uri(conn_id, "http://:x@/p")).open()


@pytest.mark.parametrize(("uri", "url"), [
    ("http://h:8080/hooks", "http://h:8080/hooks"),
    ("https://h/a/b", "https://h/a/b"),
    ("webhook://h", "https://h"),
    ("webhook://h?scheme=http", "http://h"),
    ("http://h:8443/https", "https://h:8443"),  # Airflow keeps the scheme in schema
    ("webhook://http://h:81", "http://h:81"),  # ... or in the host
    ("http://[::1]:9/x", "http://[::1]:9/x"),
])
def test_the_url_comes_from_the_connection(uri: str, url: str) -> None:
    assert base_url(parse_connection_uri("hooks", uri)) == url


def test_a_scheme_that_is_not_http_is_refused() -> None:
    with pytest.raises(TargetConfigError, match=r"scheme 'ftp' is not http or https"):
        base_url(parse_connection_uri("hooks", "webhook://h?scheme=ftp"))


# -- through the dispatcher -----------------------------------------------------------------


async def test_the_dispatcher_retries_a_500_and_each_run_arrives_twice(
        world: World, receiver: Receiver) -> None:
    keys: Counter[str] = Counter()

    async def first_fails(seen: Received, request: web.Request) -> web.StreamResponse:
        key = seen.headers["Idempotency-Key"]
        keys[key] += 1
        if keys[key] == 1:
            return web.Response(status=500, text="database is down")
        return web.json_response({"id": key}, status=201)

    receiver.answer = first_fails
    world.fire(10)
    settings = check_options(WebhookTarget, {"conn_id": "hooks", "retry_backoff_initial": 0.05,
                                             "retry_backoff_max": 0.2}, "test")
    target = WebhookTarget("hooks", settings, TargetContext({}, lambda _: receiver.connection()))
    async with running(world.dispatcher(target)):
        await eventually(lambda: world.states() == ["dispatched"] * 10, within=10)
    assert len(keys) == 10
    assert set(keys.values()) == {2}
    assert all(seen.signed for seen in receiver.requests)
    assert Counter(seen.headers["X-Sharedstream-Attempt"] for seen in receiver.requests) == {
        "1": 10, "2": 10}
    for row in world.store.list_runs(dag_id="d"):
        assert row.external_id == f"d/{row.run_id}"
        attempts = world.store.run_attempts(row.id)
        assert [(a.outcome, a.detail) for a in attempts] == [
            ("queued", f"POST http://127.0.0.1:{receiver.port}/hooks: HTTP 500: "
                       "database is down"),
            ("dispatched", "HTTP 201")]
