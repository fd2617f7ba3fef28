"""The targets' HTTP client (``sharedstream.dispatch._http``) against a real aiohttp server:
an answer that arrives in pieces is read whole, a large one is cut at the limit, the
connection is kept for the next request, and the environment's proxy is used."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sharedstream.dispatch._http import ANSWER_LIMIT, HttpClient, env_proxy

DOCUMENT = {"dag_run_id": "asset_triggered__000000000001", "state": "queued",
            "note": "x" * 3000}


class Server:
    """Answers ``/pieces`` in three chunks with pauses and ``/huge`` with more than the limit."""

    def __init__(self) -> None:
        self.peers: set[tuple[str, int]] = set()
        self.proxied: list[tuple[str, str | None]] = []  # (host asked for, Proxy-Authorization)
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/pieces", self._pieces)
        app.router.add_get("/huge", self._huge)
        app.router.add_post("/hooks/run", self._as_proxy)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _pieces(self, request: web.Request) -> web.StreamResponse:
        self.peers.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        body = json.dumps(DOCUMENT).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        third = len(body) // 3
        for piece in (body[:third], body[third:2 * third], body[2 * third:]):
            await response.write(piece)
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

    async def _as_proxy(self, request: web.Request) -> web.StreamResponse:
        self.proxied.append((request.host, request.headers.get("Proxy-Authorization")))
        return web.json_response({"via": "proxy"})

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"y" * (ANSWER_LIMIT + 5000), content_type="text/plain")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    found = Server()
    await found.start()
    yield found
    await found.stop()


async def test_an_answer_in_pieces_is_read_whole_and_the_connection_kept(server: Server) -> None:
    client = HttpClient("test", f"http://127.0.0.1:{server.port}", 5.0)
    await client.open()
    try:
        for _ in range(3):
            answer = await client.request("GET", "/pieces")
            assert (answer.status, answer.document) == (200, DOCUMENT)
    finally:
        await client.close()
    assert len(server.peers) == 1  # one connection for the three requests


async def test_an_answer_past_the_limit_is_cut_at_the_limit(server: Server) -> None:
    client = HttpClient("test", f"http://127.0.0.1:{server.port}", 5.0)
    await client.open()
    try:
        answer = await client.request("GET", "/huge")
    finally:
        await client.close()
    assert (answer.status, len(answer.text), answer.document) == (200, ANSWER_LIMIT, None)


PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_the_environments_proxy_is_found_once_with_its_credentials_as_a_header(
        no_proxies: pytest.MonkeyPatch) -> None:
    assert env_proxy("http://airflow:8080") == (None, {})
    no_proxies.setenv("HTTPS_PROXY", "http://us%40er:p%3Ass@proxy.example:3128")
    no_proxies.setenv("HTTP_PROXY", "proxy.example:3129")
    no_proxies.setenv("NO_PROXY", "internal.example")
    assert env_proxy("https://airflow.example") == (
        "http://proxy.example:3128", {"Proxy-Authorization": "Basic dXNAZXI6cDpzcw=="})
    assert env_proxy("http://airflow.example") == ("http://proxy.example:3129", {})
    assert env_proxy("http://api.internal.example:8080") == (None, {})


async def test_requests_go_through_the_proxy_the_environment_names(
        server: Server, no_proxies: pytest.MonkeyPatch) -> None:
    no_proxies.setenv("HTTP_PROXY", f"http://me:secret@127.0.0.1:{server.port}")
    client = HttpClient("test", "http://hooks.invalid:9", 5.0)
    await client.open()
    try:
        answer = await client.request("POST", "/hooks/run", body={"run": 1})
    finally:
        await client.close()
    assert (answer.status, answer.document) == (200, {"via": "proxy"})
    assert server.proxied == [("hooks.invalid", "Basic bWU6c2VjcmV0")]  # for it, through us
