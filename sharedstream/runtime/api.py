"""The triggerer's operations endpoint: probes, metrics and status over HTTP (``[api]``).

Off unless ``[api] enabled = true``; it listens on ``[api] host`` (loopback
by default) and ``port``. Served by aiohttp on the triggerer's own event
loop, as one owned task (``sharedstream-api``) that the triggerer starts
after registering its definitions and cancels last at shutdown, so the
probes answer while it drains.

Routes (``GET`` and ``HEAD`` unless said; any other method is 405, any
other path 404, a malformed request 400; a body is read only by the two
``POST`` routes, at most 1 KiB):

- ``/healthz``: ``200 ok`` - the process is up and its event loop runs the
  handler. Nothing else is checked (a liveness probe must not restart a
  triggerer for a broker outage).
- ``/readyz``: ``200`` when every check holds, else ``503``; the body has
  one line per check (``store: ok - answers``, ``streams: FAILED - ...``),
  see :class:`~sharedstream.runtime.ops_view.TriggererView`.
- ``/metrics``: the Prometheus text format
  (:mod:`sharedstream.runtime.ops_metrics`).
- ``/status``: the overview as JSON (what ``sharedstream status`` prints).
- ``/replays``: the latest replays as JSON (:func:`~sharedstream.runtime.replays.replay_record`).
- ``POST /replays`` with ``{"watcher": ..., "from": ..., "to": ...}`` (``to``
  optional; the forms of ``sharedstream watchers replay``), or
  ``{"watcher": ..., "dead_letters": true}``: asks for a
  replay, ``201`` with it; ``POST /replays/ID/cancel``: cancels one. Both
  ``403`` unless ``[api] replays = true`` (the endpoint has no
  authentication, and a replay queues DAG runs); a bad request is ``400``
  with one line, a second replay of a watcher or an ended one ``409``.
- ``/`` (with ``/status.js`` and ``/status.css``): the status page
  (:mod:`sharedstream.runtime.status_page`), which refreshes itself from
  ``/status``.

Nothing secret is served (see :mod:`sharedstream.runtime.ops_view`), and
every answer says ``Cache-Control: no-store``.

Why aiohttp and not the standard library: ``asyncio`` has no HTTP server,
and a hand-written request parser is exactly the code that gets malformed
requests wrong; aiohttp's is the one the SQS extra already installs
(through aiobotocore), it runs on the triggerer's loop with no thread, and
answers bad requests with 4xx by itself.

aiohttp and prometheus-client come with the ``ops`` extra; this module is
imported only through :func:`sharedstream.runtime.ops.open_endpoint`, which
says in one line that the extra is missing.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.runtime import status_page
from sharedstream.runtime.cli_output import plain
from sharedstream.runtime.ops_backlog import BacklogPoller
from sharedstream.runtime.ops_base import ObservedTriggerer
from sharedstream.runtime.ops_metrics import TriggererCollector
from sharedstream.runtime.ops_view import TriggererView, stream_label
from sharedstream.runtime.replays import ReplayRequestError, ask_replay, replay_record
from sharedstream.store import StoreError

__all__ = ["OpsEndpoint"]

log = key_value_logger("sharedstream.runtime.api")

_MAX_REQUEST_BODY = 1024
_NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OpsEndpoint:
    """The HTTP endpoint of one triggerer; :meth:`serve` runs it until cancelled.

    Built in the triggerer's constructor
    (:func:`~sharedstream.runtime.ops.open_endpoint`); :meth:`serve` is
    started by :meth:`Triggerer.run` once the store is open. ``address``
    is the bound ``(host, port)`` once serving (useful with ``port = 0``),
    else ``None``.
    """

    def __init__(self, triggerer: ObservedTriggerer) -> None:
        self._triggerer = triggerer
        self.backlog = BacklogPoller(triggerer.manager,
                                     interval=triggerer.config.api.backlog_interval,
                                     label=stream_label)
        """The brokers' backlog of each stream, polled while :meth:`serve` runs."""
        self.view = TriggererView(triggerer, backlog=self.backlog)
        self.address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self.serving = asyncio.Event()
        """Set once the socket listens (tests and the status command wait on it)."""

    async def start(self) -> None:
        """Listen on ``[api] host``/``port``; :meth:`serve` then owns the socket.

        Called by :meth:`Triggerer.run` once the store is open, just before
        it starts :meth:`serve` as a task. Raises :class:`SharedStreamError`
        naming the address if it cannot be bound (the triggerer does not
        start: a configured endpoint that is not there would leave its
        probes failing for no visible reason).
        """
        conf = self._triggerer.config.api
        registry = _registry(TriggererCollector(self._triggerer, self.view))
        app = web.Application(client_max_size=_MAX_REQUEST_BODY)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", _metrics_handler(registry))
        app.router.add_get("/status", self._status)
        app.router.add_get("/replays", self._replays)
        app.router.add_post("/replays", self._ask_replay)
        app.router.add_post("/replays/{replay_id:[0-9]+}/cancel", self._cancel_replay)
        app.router.add_get("/", _static(status_page.PAGE, "text/html"))
        app.router.add_get("/status.js", _static(status_page.SCRIPT, "text/javascript"))
        app.router.add_get("/status.css", _static(status_page.STYLE, "text/css"))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, conf.host, conf.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise SharedStreamError(
                f"[api] cannot listen on {conf.host}:{conf.port}: {exc.strerror or exc}"
            ) from exc
        bound = runner.addresses  # what the socket got: the port 0 picked, say
        host, port = bound[0][:2] if bound else (conf.host, conf.port)
        self.address = (str(host), int(port))
        self._runner = runner
        log.info("operations endpoint listening (/healthz /readyz /metrics /status)",
                 url=f"http://{self.address[0]}:{self.address[1]}")

    async def serve(self) -> None:
        """Answer requests until cancelled; then close the socket and open connections.

        :meth:`start` must have returned first. Watcher names are read from
        the store once here (the metrics label lag with them). The backlog
        poller (:attr:`backlog`) runs as a task of its own meanwhile.
        """
        runner, self._runner = self._runner, None
        if runner is None:
            raise SharedStreamError("OpsEndpoint.serve() before start()")
        try:
            await self.view.refresh_names()
            self.serving.set()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.backlog.run(), name="sharedstream-backlog")
                await asyncio.Event().wait()  # until cancelled
        finally:
            self.serving.clear()
            await runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n", headers=_NO_STORE)

    async def _readyz(self, _request: web.Request) -> web.StreamResponse:
        checks = await self.view.readiness()
        ready = all(check.ok for check in checks)
        lines = [f"{c.name}: {'ok' if c.ok else 'FAILED'} - {c.detail}" for c in checks]
        return web.Response(text="\n".join(lines) + "\n", status=200 if ready else 503,
                            headers=_NO_STORE)

    async def _status(self, _request: web.Request) -> web.StreamResponse:
        status = await self.view.status()
        status["ready"] = {c.name: {"ok": c.ok, "detail": c.detail}
                           for c in await self.view.readiness()}
        return web.Response(text=json.dumps(status, default=str), headers=_NO_STORE,
                            content_type="application/json")


    async def _replays(self, _request: web.Request) -> web.StreamResponse:
        t = self._triggerer
        rows = await t.db(t.store.list_replays, 50)
        return _json([replay_record(row) for row in rows])

    async def _ask_replay(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse_action()
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return _text(400, "the body is not JSON: {\"watcher\": ..., \"from\": ...}")
        if not _replay_body(body):
            return _text(400, "expected {\"watcher\": \"asset/watcher\", \"from\": \"24h\"} "
                              "and optionally \"to\" (all strings), or {\"watcher\": "
                              "\"asset/watcher\", \"dead_letters\": true}")
        t = self._triggerer
        try:
            row = await t.db(functools.partial(
                ask_replay, t.store, body["watcher"], body.get("from"), body.get("to"),
                dead_letters=body.get("dead_letters", False)))
        except ReplayRequestError as exc:
            return _text(400, str(exc))
        except StoreError as exc:
            return _text(409, str(exc))
        if t.replays is not None:
            t.replays.wake()
        return _json(replay_record(row), status=201)

    async def _cancel_replay(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse_action()
        if refused is not None:
            return refused
        t = self._triggerer
        try:
            row = await t.db(t.store.cancel_replay, int(request.match_info["replay_id"]))
        except StoreError as exc:
            return _text(404 if "no replay" in str(exc) else 409, str(exc))
        return _json(replay_record(row))

    def _refuse_action(self) -> web.StreamResponse | None:
        if self._triggerer.config.api.replays:
            return None
        return _text(403, "replays through the endpoint are off: set [api] replays = true")


def _json(value: object, status: int = 200) -> web.StreamResponse:
    return web.Response(text=json.dumps(value, default=plain), status=status,
                        headers=_NO_STORE, content_type="application/json")


def _replay_body(body: Any) -> bool:
    """Whether ``body`` asks for a replay in one of the two shapes ``POST /replays`` takes."""
    if not isinstance(body, dict) or not isinstance(body.get("watcher"), str):
        return False
    if body.get("dead_letters") is True:
        return set(body) == {"watcher", "dead_letters"}
    return (isinstance(body.get("from"), str) and isinstance(body.get("to", ""), str)
            and not set(body) - {"watcher", "from", "to"})


def _text(status: int, line: str) -> web.StreamResponse:
    return web.Response(text=line + "\n", status=status, headers=_NO_STORE)


def _static(text: str, content_type: str) -> Handler:
    """A handler serving one fixed text (the status page's parts), under the page's CSP."""
    body = text.encode()
    headers = {**_NO_STORE, "Content-Security-Policy": status_page.CSP}

    async def serve(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type=content_type, charset="utf-8",
                            headers=headers)

    return serve


def _registry(collector: Collector) -> CollectorRegistry:
    """A registry of the endpoint's own: never the process-wide default one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _metrics_handler(registry: CollectorRegistry) -> Handler:
    async def metrics(_request: web.Request) -> web.StreamResponse:
        body = generate_latest(registry)
        return web.Response(body=body, headers={**_NO_STORE, "Content-Type": CONTENT_TYPE_LATEST})

    return metrics
