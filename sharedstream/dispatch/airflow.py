"""The ``airflow`` target: hand DAG runs to an Apache Airflow 3 through its REST API.

Configured as ``[targets.<name>]`` with ``type = "airflow"``; ``conn_id``
(default ``airflow_default``) names a connection to Airflow's API server:
``AIRFLOW_CONN_AIRFLOW_DEFAULT=http://admin:PASSWORD@host:8080`` (``https``,
and a path prefix as the schema: ``http://...@host/airflow``), signed in
with ``POST /auth/token``, or with a JWT in the connection's extra
(``{"token": "..."}``, used as it is: when Airflow refuses it, every run is
undeliverable until it is replaced). Two modes, chosen per DAG (``mode``):

**dag_run** (the default): each of our runs becomes one Airflow run of
the DAG ``dag_id`` (default: the same id as ours), created with
``POST /api/v2/dags/{dag_id}/dagRuns`` under *our* run id (with
``sharedstream__`` in front when it starts as Airflow's own runs' ids do:
``asset_triggered__``, ``scheduled__``..., which Airflow keeps for itself),
its ``conf`` being a manual run's conf with our run document under
``"sharedstream"``.
Guarantee: **effectively once**. Airflow refuses a second run with the
same id (``409``); the target then reads that run and counts it delivered
when its conf carries this run's marker (a crash between sending and
recording, or a repeat), and undeliverable when it does not (a run Airflow
got elsewhere). The target follows the run (``status``) to ``success`` or
``failed``. A paused Airflow DAG still accepts runs: they wait, ``queued``
(``dispatched`` here), until it is unpaused. A DAG Airflow does not know
(``404``: not in its DAGs folder, or not parsed yet) is retried. Run ids
are unique per DAG of ours, not across them: two of our DAGs sent to one
Airflow DAG collide on ids, and the second's runs are undeliverable.

**asset_event**: each asset event our run consumed becomes an event of the
Airflow asset with the same *name* (``POST /api/v2/assets/events``), its
``extra`` holding our payload under ``"sharedstream"``, with the key
``dag_id/run_id/asset_event_id``. Airflow's scheduler then applies its own
asset conditions: whether it makes one run per event or one per batch is
its decision, and the target does not follow those runs (``follows`` is
off: the run stays ``dispatched`` here). Airflow 3.3.2 was seen to leave
events arriving while it creates a run for an earlier one (three POSTs
20 ms apart) without a run until the asset's next event, whose run gets
them all: the last events of a burst may wait there. Airflow stores a
repeated POST as a second event, so an attempt whose predecessor's outcome
is unknown (``recovered``, or ``attempt > 1``) first reads the asset's
events, newest first, since the run was queued (less ten minutes for clock
skew, at most 1000 of them), and skips those already carrying their key.
Guarantee: **effectively once as long as that window covers the asset's
events since the earlier attempt**; beyond it, at least once. A run without
events (a time-based or manual run) is undeliverable in this mode.

Answers: a connection error, a timeout, ``408``/``429``/``5xx`` are retried;
other ``4xx`` are not (``400``/``422`` with Airflow's detail). The default
``max_concurrency`` is 1: an Airflow on SQLite cannot take concurrent
writers (four concurrent clients made over half its answers ``500
database is locked`` and stopped its scheduler); raise it for PostgreSQL.
Even one client at a time is too much for SQLite in a long burst while the
runs execute: 100 runs created back to back (~90/s) got seven ``500`` and
stopped its scheduler; 20 or 40 went through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urlencode

from sharedstream.connections import ConnectionNotFound, InvalidConnection
from sharedstream.dispatch._airflow_api import (
    AirflowApi,
    airflow_run_id,
    api_base,
    asset_event_body,
    check_run_id,
    dag_run_body,
    dag_run_path,
    delivery_state,
    event_key,
    event_key_of,
    made_by_us,
    ui_url,
)
from sharedstream.dispatch._http import HttpAnswer, HttpClient, refusal
from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import (
    Delivery,
    Target,
    TargetConfigError,
    TargetContext,
    TargetError,
    TargetOption,
)

__all__ = ["AirflowTarget"]

_PAGE = 100  # Airflow's default [api] maximum_page_limit
_LOOKBACK_EVENTS = 1000  # asset events read at most when looking for an earlier attempt's
_CLOCK_SKEW = timedelta(minutes=10)  # our clock against Airflow's, when reading since queued_at
_ASSET_PAGES = 20  # pages of assets sharing a name prefix read when looking one up


class AirflowTarget(Target):
    """Creates Airflow DAG runs, or Airflow asset events (see the module docstring).

    Opening reads the connection and starts an HTTP session, without a
    request (Airflow may be down when the triggerer starts); the first
    delivery signs in. ``follows`` is on in ``dag_run`` mode only.
    """

    options: ClassVar[dict[str, TargetOption]] = {
        "conn_id": TargetOption(
            "str", "airflow_default", "The connection to Airflow's API server "
            "(http://login:password@host:port[/path prefix], or a JWT in its extra's token)."),
        "mode": TargetOption(
            "choice", "dag_run", "dag_run: one Airflow run per run; asset_event: each consumed "
            "asset event becomes an event of the Airflow asset of the same name.",
            choices=("dag_run", "asset_event"), per_dag=True),
        "dag_id": TargetOption(
            "str", None, "The Airflow DAG to trigger in dag_run mode (default: the same id).",
            per_dag=True),
    }
    default_concurrency = 1
    default_timeout = 30.0
    follows = True

    def __init__(self, name: str, settings: Mapping[str, Any], context: TargetContext) -> None:
        super().__init__(name, settings, context)
        self.mode: str = str(self.settings["mode"])
        # Per instance, as the mode is per DAG: asset events leave nothing to follow.
        self.follows = self.mode == "dag_run"
        self._api: AirflowApi | None = None
        self._asset_ids: dict[str, int] = {}

    # -- life cycle ----------------------------------------------------------------------

    async def open(self) -> None:
        """Read the connection and open a session; :class:`TargetConfigError` if it is unusable.

        Called again after :meth:`aclose` when the dispatcher restarts: it
        reads the connection anew.
        """
        conn_id = str(self.settings["conn_id"])
        try:
            connection = self.context.connection(conn_id)
        except (ConnectionNotFound, InvalidConnection) as exc:
            raise TargetConfigError(f"target {self.name!r}: {exc}") from exc
        http = HttpClient("airflow", api_base(connection), self.timeout)
        api = AirflowApi(connection, http)
        await api.open()
        self._api = api

    async def aclose(self) -> None:
        """Close the session; idempotent."""
        api, self._api = self._api, None
        self._asset_ids.clear()
        if api is not None:
            await api.close()

    @property
    def api(self) -> AirflowApi:
        """The signed-in API; a retryable :class:`TargetError` before :meth:`open`."""
        if self._api is None:
            raise TargetError(f"the airflow target {self.name!r} is not open", retryable=True)
        return self._api

    def airflow_dag_id(self, run: RunDocument) -> str:
        """The Airflow DAG ``run`` goes to: the ``dag_id`` option, else the run's own."""
        return str(self.settings.get("dag_id") or run.dag_id)

    # -- deliveries ----------------------------------------------------------------------

    async def deliver(self, run: RunDocument, progress: Callable[[str], None]) -> Delivery:
        """Create the Airflow run, or post the asset events; see the module docstring.

        Idempotent (a repeat is recognised, not duplicated). Raises a
        retryable :class:`TargetError` for what may pass (Airflow down, a
        DAG not parsed yet), a non-retryable one for what will not.
        """
        if self.mode == "asset_event":
            return await self._post_asset_events(run)
        return await self._create_dag_run(run)

    async def _create_dag_run(self, run: RunDocument) -> Delivery:
        check_run_id(run)
        dag_id = self.airflow_dag_id(run)
        path = dag_run_path(dag_id)
        answer = await self.api.call("POST", path, dag_run_body(run))
        if answer.ok:
            return self._delivery(run, answer.document, "created")
        if answer.status == 409:
            return await self._already_there(run, dag_id)
        if answer.status == 404:
            raise TargetError(f"DAG {dag_id!r} not found in Airflow (is the file in its DAGs "
                              f"folder and parsed?): {answer.summary()}", retryable=True)
        raise refusal(answer, f"POST {path}")

    async def _already_there(self, run: RunDocument, dag_id: str) -> Delivery:
        """After a ``409``: ours if the existing run carries our marker, else undeliverable."""
        run_id = airflow_run_id(run.run_id)
        path = dag_run_path(dag_id, run_id)
        answer = await self.api.call("GET", path)
        if answer.status == 404:  # deleted between the two requests: try again later
            raise TargetError(f"Airflow answered 409 to run {run_id!r} of DAG {dag_id!r}, "
                              "then 404 when asked for it", retryable=True)
        if not answer.ok:
            raise refusal(answer, f"GET {path}")
        if not made_by_us(answer.document, run):
            raise TargetError(f"Airflow already has a run {run_id!r} of DAG {dag_id!r} "
                              f"that sharedstream did not create for DAG {run.dag_id!r}",
                              retryable=False)
        return self._delivery(run, answer.document, "already there (409)")

    def _delivery(self, run: RunDocument, airflow_run: Any, detail: str) -> Delivery:
        dag_id, run_id = self.airflow_dag_id(run), airflow_run_id(run.run_id)
        return Delivery(delivery_state(airflow_run) or "dispatched", detail=detail,
                        external_id=run_id, external_url=ui_url(self.api.base, dag_id, run_id))

    async def status(self, run: RunDocument) -> Delivery | None:
        """The Airflow run's state (``queued`` reads ``dispatched``); None in asset_event mode.

        None too for a state with no equivalent here; ``failed`` when
        Airflow no longer has the run (``404``). Raises :class:`TargetError`
        when Airflow cannot be asked now.
        """
        if self.mode != "dag_run":
            return None
        dag_id = self.airflow_dag_id(run)
        run_id = run.external_id or airflow_run_id(run.run_id)
        path = dag_run_path(dag_id, run_id)
        answer = await self.api.call("GET", path)
        if answer.status == 404:
            return Delivery("failed", detail="the run is gone from Airflow", external_id=run_id)
        if not answer.ok:
            raise refusal(answer, f"GET {path}")
        state = delivery_state(answer.document)
        if state is None:
            return None
        ended = answer.document.get("end_date") if state in ("success", "failed") else None
        return Delivery(state, detail=f"Airflow: {state}" + (f" at {ended}" if ended else ""),
                        external_id=run_id, external_url=ui_url(self.api.base, dag_id, run_id))

    # -- asset events --------------------------------------------------------------------

    async def _post_asset_events(self, run: RunDocument) -> Delivery:
        if not run.events:
            raise TargetError(f"asset_event mode forwards asset events; run {run.run_id!r} has "
                              "none (a time-based or manual run)", retryable=False)
        unsure = run.recovered or run.attempt > 1
        by_asset: dict[str, list[EventDocument]] = {}
        for event in run.events:
            by_asset.setdefault(event.asset, []).append(event)
        posted = already = 0
        for name, events in by_asset.items():
            asset_id = await self._asset_id(name)
            there = await self._keys_posted(asset_id, run, events) if unsure else set()
            for event in events:
                if event_key(run, event) in there:
                    already += 1
                    continue
                await self._post_event(asset_id, name, run, event)
                posted += 1
        return Delivery("dispatched", detail=f"{posted} asset events posted, {already} already "
                        "there")

    async def _post_event(self, asset_id: int, name: str, run: RunDocument,
                          event: EventDocument) -> None:
        answer = await self.api.call("POST", "/api/v2/assets/events",
                                     asset_event_body(asset_id, run, event))
        if answer.status == 404:  # the asset went away since its id was cached: look again
            self._asset_ids.pop(name, None)
            raise TargetError(f"Airflow asset {name!r} (id {asset_id}) is gone: "
                              f"{answer.summary()}", retryable=True)
        if not answer.ok:
            raise refusal(answer, "POST /api/v2/assets/events")

    async def _asset_id(self, name: str) -> int:
        """The id of the Airflow asset named ``name`` (cached); non-retryable if there is none.

        The API filters by name prefix only (``name_prefix_pattern``, in
        which ``|`` and ``~`` mean more): every page of the prefix's assets
        is read until one has exactly the name.
        """
        if name in self._asset_ids:
            return self._asset_ids[name]
        offset = 0
        for _ in range(_ASSET_PAGES):
            query = urlencode({"name_prefix_pattern": name, "limit": _PAGE, "offset": offset})
            page = await self._page(f"/api/v2/assets?{query}", "assets")
            for asset in page:
                if asset.get("name") == name and isinstance(asset.get("id"), int):
                    self._asset_ids[name] = asset["id"]
                    return int(asset["id"])
            if len(page) < _PAGE:
                break
            offset += len(page)
        raise TargetError(f"Airflow has no asset named {name!r} (none of its DAGs schedules "
                          "on or outlets it)", retryable=False)

    async def _keys_posted(self, asset_id: int, run: RunDocument,
                           events: list[EventDocument]) -> set[str]:
        """Which of ``events``' keys the asset's recent events already carry.

        Newest first, since the run was queued (less :data:`_CLOCK_SKEW`),
        at most :data:`_LOOKBACK_EVENTS`: events arriving meanwhile push the
        pages later, so an offset never skips one.
        """
        wanted = {event_key(run, event) for event in events}
        found: set[str] = set()
        since = (run.queued_at - _CLOCK_SKEW).isoformat()
        offset = 0
        while offset < _LOOKBACK_EVENTS and found != wanted:
            query = urlencode({"asset_id": asset_id, "order_by": "-timestamp", "limit": _PAGE,
                               "offset": offset, "timestamp_gte": since})
            page = await self._page(f"/api/v2/assets/events?{query}", "asset_events")
            found.update(key for key in map(event_key_of, page) if key in wanted)
            if len(page) < _PAGE:
                break
            offset += len(page)
        return found

    async def _page(self, path: str, key: str) -> list[Mapping[str, Any]]:
        """One page of a list endpoint: the items under ``key``; refusals as errors."""
        answer: HttpAnswer = await self.api.call("GET", path)
        if not answer.ok:
            raise refusal(answer, f"GET {path.partition('?')[0]}")
        items = answer.document.get(key) if isinstance(answer.document, Mapping) else None
        if not isinstance(items, list):
            raise TargetError(f"GET {path.partition('?')[0]}: HTTP {answer.status} without "
                              f"{key!r}", retryable=True)
        return [item for item in items if isinstance(item, Mapping)]
