"""What the ``airflow`` target says to Airflow 3's REST API, and how it signs in.

Two halves, kept apart so the first can be tested without a server:

* **Pure pieces**: the API's base URL from a connection (:func:`api_base`),
  the bodies the target sends (:func:`dag_run_body`,
  :func:`asset_event_body`), the run id rule Airflow enforces
  (:func:`check_run_id`), the state mapping (:func:`delivery_state`), and
  the marker that says a run or an asset event was made by sharedstream
  (:func:`made_by_us`, :func:`event_key`).
* :class:`AirflowApi`: one :class:`~sharedstream.dispatch._http.HttpClient`
  with Airflow's sign-in on top: a JWT from the connection's extra, or one
  fetched with ``POST /auth/token`` from its login and password, cached,
  and replaced once when Airflow says it is no longer good.

Invariants:

1. The password and every token stay out of messages and logs: errors name
   the user and the connection, never a secret.
2. A request is sent at most twice: once, and once more with a new token
   when the first was refused for its token (``401``, or ``403`` "Invalid
   JWT"). A sign-in Airflow refuses (``401``/``403``) is not retryable.
3. Concurrent requests share one token fetch (a lock), so a token expiring
   under ``max_concurrency`` deliveries costs one ``POST /auth/token``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

from sharedstream.connections import Connection
from sharedstream.dispatch._http import HttpAnswer, HttpClient, refusal
from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import TargetConfigError, TargetError
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = [
    "AIRFLOW_ID_PREFIX",
    "MARKER",
    "RESERVED_PREFIXES",
    "RUN_ID_PATTERN",
    "AirflowApi",
    "airflow_run_id",
    "api_base",
    "asset_event_body",
    "check_run_id",
    "dag_run_body",
    "dag_run_path",
    "delivery_state",
    "event_key",
    "event_key_of",
    "made_by_us",
    "ui_url",
]

log = key_value_logger("sharedstream.dispatch.airflow")

MARKER = "sharedstream"
"""The key of a run's ``conf`` (of an asset event's ``extra``) holding what sharedstream sent."""

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.~:+-]+$")
"""The run ids Airflow 3 accepts from the API (it answers 400 to any other)."""

RESERVED_PREFIXES = ("backfill__", "scheduled__", "operator_triggered__", "asset_triggered__",
                     "asset_materialization__")
"""Run id prefixes Airflow 3.3 keeps for the runs it makes (every run type's but ``manual__``)."""

AIRFLOW_ID_PREFIX = "sharedstream__"
"""Put before our run ids that start with one of :data:`RESERVED_PREFIXES`."""

_STATES: Mapping[str, Literal["dispatched", "running", "success", "failed"]] = {
    "queued": "dispatched", "running": "running", "success": "success", "failed": "failed"}


# -- pure pieces ---------------------------------------------------------------------------


def api_base(connection: Connection) -> str:
    """``scheme://host[:port][/schema]``: where Airflow's API and UI live, from a connection.

    The scheme is the host's own (``type://https://host``), else the
    connection type when it is ``http`` or ``https``; ``schema`` is a path
    prefix (an Airflow behind ``/airflow``). Raises
    :class:`TargetConfigError` naming the connection when it has no host
    or another type.
    """
    where = f"connection {connection.conn_id!r}"
    protocol, _, host = (connection.host or "").rpartition("://")
    scheme = (protocol or connection.conn_type or "").lower()
    if scheme not in ("http", "https"):
        raise TargetConfigError(f"{where}: Airflow's API is http or https, got conn_type "
                                f"{connection.conn_type!r} (use http://login:password@host:port)")
    if not host:
        raise TargetConfigError(f"{where}: no host (use http://login:password@host:port)")
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    port = f":{connection.port}" if connection.port is not None else ""
    prefix = "/".join(quote(part, safe="") for part in (connection.schema or "").split("/")
                      if part)
    return f"{scheme}://{host}{port}" + (f"/{prefix}" if prefix else "")


def dag_run_path(dag_id: str, run_id: str | None = None) -> str:
    """``/api/v2/dags/{dag_id}/dagRuns[/{run_id}]``, both ids quoted."""
    path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns"
    return path if run_id is None else f"{path}/{quote(run_id, safe='')}"


def ui_url(base: str, dag_id: str, run_id: str) -> str:
    """The run's page in Airflow's UI."""
    return f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def airflow_run_id(run_id: str) -> str:
    """The id of our run ``run_id`` in Airflow: the same, unless Airflow reserves its prefix.

    Airflow refuses an API-made (manual) run whose id starts with another
    run type's prefix (``asset_triggered__``, ``scheduled__``, ``backfill__``
    ...: HTTP 400 "reserved for asset_triggered runs"), which most of our
    ids do: those get ``sharedstream__`` in front. The mapping is the same
    on every attempt, so a repeat still meets its earlier run (409).
    """
    if run_id.startswith(RESERVED_PREFIXES):
        return f"{AIRFLOW_ID_PREFIX}{run_id}"
    return run_id


def check_run_id(run: RunDocument) -> None:
    """Raise a non-retryable :class:`TargetError` if Airflow would refuse ``run``'s id."""
    if not RUN_ID_PATTERN.fullmatch(run.run_id) or ".." in run.run_id:
        raise TargetError(f"run id {run.run_id!r} cannot be an Airflow run id: Airflow takes "
                          f"only letters, digits and _ . ~ : + - ({RUN_ID_PATTERN.pattern}), "
                          "and no '..'", retryable=False)


def dag_run_body(run: RunDocument) -> dict[str, Any]:
    """The body of ``POST .../dagRuns``: its Airflow run id, no logical date, the conf.

    The conf is a manual run's own conf at the top level (what an Airflow
    user expects to read) with the run document under ``"sharedstream"``
    (every key of :meth:`RunDocument.to_json` but ``conf``). Ours wins
    over a manual conf key of the same name: it is the marker a repeated
    delivery relies on. ``logical_date`` is sent as ``null``: Airflow 3
    answers 422 without the key.
    """
    document = {key: value for key, value in run.to_json().items() if key != "conf"}
    own = run.conf or {}
    return {"dag_run_id": airflow_run_id(run.run_id), "logical_date": None,
            "conf": {**{str(key): value for key, value in own.items()}, MARKER: document}}


def made_by_us(airflow_run: Any, run: RunDocument) -> bool:
    """Whether an Airflow run's answer carries ``run``'s marker (same DAG and run id)."""
    conf = airflow_run.get("conf") if isinstance(airflow_run, Mapping) else None
    ours = conf.get(MARKER) if isinstance(conf, Mapping) else None
    return (isinstance(ours, Mapping) and ours.get("run_id") == run.run_id
            and ours.get("dag_id") == run.dag_id)


def event_key(run: RunDocument, event: EventDocument) -> str:
    """``dag_id/run_id/asset_event_id``: one asset event of one run, the same on every attempt."""
    return f"{run.idempotency_key}/{event.asset_event_id}"


def asset_event_body(asset_id: int, run: RunDocument, event: EventDocument) -> dict[str, Any]:
    """The body of ``POST /api/v2/assets/events`` forwarding ``event`` of ``run``."""
    shown = event.to_json()
    return {"asset_id": asset_id, "extra": {MARKER: {
        "key": event_key(run, event), "payload": shown["payload"], "event_id": event.event_id,
        "created_at": shown["created_at"], "trace_parent": event.trace_parent}}}


def event_key_of(airflow_event: Any) -> str | None:
    """The sharedstream key in an Airflow asset event's ``extra``, if it has one."""
    extra = airflow_event.get("extra") if isinstance(airflow_event, Mapping) else None
    ours = extra.get(MARKER) if isinstance(extra, Mapping) else None
    key = ours.get("key") if isinstance(ours, Mapping) else None
    return key if isinstance(key, str) else None


def delivery_state(airflow_run: Any
                   ) -> Literal["dispatched", "running", "success", "failed"] | None:
    """An Airflow run's ``state`` as a delivery state (``queued`` is ``dispatched``); else None."""
    state = airflow_run.get("state") if isinstance(airflow_run, Mapping) else None
    return _STATES.get(state) if isinstance(state, str) else None


# -- the client ----------------------------------------------------------------------------


def _refused_for_its_token(answer: HttpAnswer) -> bool:
    if answer.status == 401:
        return True
    detail = answer.document.get("detail") if isinstance(answer.document, Mapping) else None
    return answer.status == 403 and isinstance(detail, str) and "invalid jwt" in detail.lower()


class AirflowApi:
    """Airflow's REST API, signed in: :meth:`call` sends a request with a valid token.

    ``connection`` gives the user and password (or ``extra["token"]``, a
    JWT used as it is); ``http`` is the client (opened and closed by the
    caller: :meth:`open`, :meth:`close`). Safe for concurrent calls on one
    event loop.
    """

    def __init__(self, connection: Connection, http: HttpClient) -> None:
        self.http = http
        self._conn_id = connection.conn_id
        token = connection.extra.get("token")
        self._fixed_token = token if isinstance(token, str) and token else None
        self._login = connection.login
        self._password = connection.password
        if self._fixed_token is None and not (self._login and self._password):
            raise TargetConfigError(
                f"connection {self._conn_id!r}: Airflow needs a login and password "
                '(http://login:password@host:port) or a JWT in its extra ({"token": "..."})')
        self._token: str | None = self._fixed_token
        self._fetching = asyncio.Lock()

    @property
    def base(self) -> str:
        """The API's base URL (no credentials in it)."""
        return self.http.base

    async def open(self) -> None:
        """Open the HTTP session; no request is made (Airflow may be down now)."""
        await self.http.open()

    async def close(self) -> None:
        """Close the HTTP session and forget a fetched token; idempotent."""
        await self.http.close()
        self._token = self._fixed_token

    async def call(self, method: str, path: str, body: Any = None) -> HttpAnswer:
        """Send one request with a token; the answer, whatever its status.

        A ``401`` (or ``403`` "Invalid JWT") gets a new token and one more
        try, unless the token is the connection's own: then, and when even a
        new token is refused, a non-retryable :class:`TargetError`. Raises
        what :meth:`HttpClient.request` and :meth:`_sign_in` raise.
        """
        token = await self._current_token()
        answer = await self._send(method, path, body, token)
        if not _refused_for_its_token(answer):
            return answer
        if self._fixed_token is not None:
            raise TargetError(f"Airflow refused the token of connection {self._conn_id!r} "
                              f"({answer.summary()}): give it a fresh one, or a login and "
                              "password", retryable=False)
        log.info("Airflow refused its token; signing in again", conn_id=self._conn_id,
                 status=answer.status)
        async with self._fetching:
            if self._token == token:
                self._token = None
        answer = await self._send(method, path, body, await self._current_token())
        if _refused_for_its_token(answer):
            raise TargetError(f"Airflow refused a token it had just issued to user "
                              f"{self._login!r} ({answer.summary()}): do its API servers share "
                              "one [api_auth] jwt_secret?", retryable=False)
        return answer

    async def _send(self, method: str, path: str, body: Any, token: str) -> HttpAnswer:
        return await self.http.request(method, path, body=body,
                                       headers={"Authorization": f"Bearer {token}"})

    async def _current_token(self) -> str:
        async with self._fetching:
            if self._token is None:
                self._token = await self._sign_in()
            return self._token

    async def _sign_in(self) -> str:
        """``POST /auth/token`` with the login and password; the ``access_token`` it gives.

        ``401``/``403``: a non-retryable :class:`TargetError` naming the
        user (never the password); another refusal as :func:`refusal` says.
        """
        answer = await self.http.request(
            "POST", "/auth/token", body={"username": self._login, "password": self._password})
        if answer.status in (401, 403):
            raise TargetError(f"Airflow refused the login of user {self._login!r} (connection "
                              f"{self._conn_id!r}): {answer.summary()}", retryable=False)
        if not answer.ok:
            raise refusal(answer, "POST /auth/token")
        token = answer.document.get("access_token") if isinstance(answer.document,
                                                                  Mapping) else None
        if not isinstance(token, str) or not token:
            raise TargetError(f"POST /auth/token: HTTP {answer.status} without an access_token",
                              retryable=True)
        return token
