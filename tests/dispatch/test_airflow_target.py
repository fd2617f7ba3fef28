"""The ``airflow`` target against a real Apache Airflow 3 (the testing kit's, on SQLite).

Marked ``airflow`` (``pytest -m airflow``): the session's ``airflow_server``
installs Airflow on first use (cached) and starts it (10-20 s). One module
fixture drops three DAG files: two whose task appends its run's ``conf`` as
one JSON line to ``<out>/<dag_id>.jsonl`` (one for the target's own tests,
one for the dispatcher's), and one scheduled on ``Asset("orders")`` whose
task appends the ``extra`` of the asset events that triggered it. Run ids
are made unique per test, so the tests share the DAGs without meeting. The
API restart comes last: the Airflow it leaves may have lost its scheduler.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sharedstream.connections import Connection, parse_connection_uri
from sharedstream.dispatch._airflow_api import airflow_run_id
from sharedstream.dispatch.airflow import AirflowTarget
from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import Delivery, TargetContext, TargetError, check_options
from sharedstream.testing.airflow import AirflowServer
from tests.dispatch.conftest import World, running

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

RUNS_DAG = "ss_conf_lines"
DISPATCHED_DAG = "ss_dispatched"
ASSET_DAG = "ss_on_orders"

CONF_DAG = '''
import json
import pathlib

from airflow.sdk import dag, get_current_context, task


# At most 4 at once: an SQLite Airflow's scheduler died of "database is locked" running
# 16 runs' tasks at once on 2 cores while runs were being created.
@dag(dag_id={dag_id!r}, schedule=None, max_active_runs=4)
def conf_lines():
    @task
    def append_conf():
        conf = get_current_context()["dag_run"].conf
        with open(pathlib.Path({out!r}) / "{dag_id}.jsonl", "a") as lines:
            lines.write(json.dumps(conf) + "\\n")

    append_conf()


conf_lines()
'''

ASSET_DAG_FILE = '''
import json
import pathlib

from airflow.sdk import Asset, dag, get_current_context, task


@dag(dag_id={dag_id!r}, schedule=[Asset("orders")])
def on_orders():
    @task
    def append_extras():
        events = get_current_context()["triggering_asset_events"]
        extras = [event.extra for found in events.values() for event in found]
        with open(pathlib.Path({out!r}) / "{dag_id}.jsonl", "a") as lines:
            lines.write(json.dumps(extras) + "\\n")

    append_extras()


on_orders()
'''

_event_ids = itertools.count(1_000)


@dataclass
class Dags:
    """The parsed DAGs and the folder their tasks write to."""

    server: AirflowServer
    out: Path

    def lines(self, dag_id: str) -> list[Any]:
        path = self.out / f"{dag_id}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def dags(airflow_server: AirflowServer, tmp_path_factory: pytest.TempPathFactory) -> Dags:
    out = tmp_path_factory.mktemp("airflow-target-out")
    folder = airflow_server.dags_folder
    for dag_id in (RUNS_DAG, DISPATCHED_DAG):
        (folder / f"{dag_id}.py").write_text(CONF_DAG.format(dag_id=dag_id, out=str(out)))
    (folder / f"{ASSET_DAG}.py").write_text(ASSET_DAG_FILE.format(dag_id=ASSET_DAG,
                                                                  out=str(out)))
    for dag_id in (RUNS_DAG, DISPATCHED_DAG, ASSET_DAG):
        airflow_server.wait_for_dag(dag_id)
    return Dags(airflow_server, out)


def connections(uri: str) -> Callable[[str], Connection]:
    def connection(conn_id: str) -> Connection:
        return parse_connection_uri(conn_id, uri)

    return connection


def make_target(server: AirflowServer, *, uri: str | None = None,
                **options: Any) -> AirflowTarget:
    settings = check_options(AirflowTarget, {"dag_id": RUNS_DAG, **options}, "test")
    return AirflowTarget("airflow", settings,
                         TargetContext({}, connections(uri or server.connection_uri())))


@pytest.fixture
async def target(dags: Dags) -> AsyncIterator[AirflowTarget]:
    found = make_target(dags.server)
    await found.open()
    yield found
    await found.aclose()


def document(*, run_id: str | None = None, events: int = 1, asset: str = "orders",
             dag_id: str = "ship") -> RunDocument:
    now = datetime.now(UTC)
    found = tuple(EventDocument(asset=asset, asset_event_id=next(_event_ids), event_id=n,
                                payload={"order": n}, created_at=now, trace_parent=None)
                  for n in range(events))
    return RunDocument(dag_id=dag_id, run_id=run_id or f"asset_triggered__{uuid.uuid4().hex}",
                       run_type="asset_triggered", queued_at=now, logical_date=None,
                       data_interval_start=None, data_interval_end=None, conf=None,
                       trace_parent=None, events=found, attempt=1)


def no_progress(state: str) -> None:
    raise AssertionError(f"the airflow target never runs a run in place ({state})")


async def deliver(target: AirflowTarget, run: RunDocument, tries: int = 10) -> Delivery:
    """``target.deliver``, tried again (attempt + 1) as the dispatcher does after a retryable error.

    An SQLite Airflow answers 500 "Database error" (its database was locked
    for 5 s), or nothing in time, now and then while it runs tasks, even to
    one client at a time. A non-retryable error is the test's to see.
    """
    for attempt in range(run.attempt, run.attempt + tries):
        try:
            return await target.deliver(replace(run, attempt=attempt), no_progress)
        except TargetError as exc:
            if not exc.retryable or attempt == run.attempt + tries - 1:
                raise
        await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


def airflow_run(server: AirflowServer, run_id: str, dag_id: str = RUNS_DAG) -> Any:
    status, found = server.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
    assert status == 200, found
    return found


async def until_success(target: AirflowTarget, run: RunDocument,
                        within: float = 120.0) -> list[str]:
    """Ask ``status`` until Airflow says success; the states seen on the way."""
    seen: list[str] = []
    deadline = time.monotonic() + within
    while not seen or seen[-1] != "success":
        assert time.monotonic() < deadline, f"no success within {within} s; seen {seen}"
        try:
            found = await target.status(run)
        except TargetError as exc:  # Airflow busy: the dispatcher asks again later
            if not exc.retryable:
                raise
            continue
        assert found is not None
        if not seen or seen[-1] != found.state:
            seen.append(found.state)
        await asyncio.sleep(0.2)
    return seen


# -- dag_run mode ----------------------------------------------------------------------------


async def test_a_delivery_creates_one_airflow_run_that_a_repeat_finds(
        dags: Dags, target: AirflowTarget) -> None:
    run = document(events=2)
    created = await deliver(target, run)
    airflow_id = f"sharedstream__{run.run_id}"  # Airflow keeps asset_triggered__ for itself
    assert (created.state, created.detail, created.external_id) == (
        "dispatched", "created", airflow_id)
    assert created.external_url == f"{dags.server.url}/dags/{RUNS_DAG}/runs/{airflow_id}"
    found = airflow_run(dags.server, airflow_id)
    assert found["conf"]["sharedstream"]["run_id"] == run.run_id
    assert [e["event_id"] for e in found["conf"]["sharedstream"]["events"]] == [0, 1]

    again = await deliver(target, replace(run, attempt=2, recovered=True))

    assert again.detail == "already there (409)"
    assert again.external_id == airflow_id
    assert await until_success(target, run) in (
        ["dispatched", "running", "success"], ["dispatched", "success"],
        ["running", "success"], ["success"])
    ids = [r["dag_run_id"] for r in dags.server.dag_runs(RUNS_DAG)]
    assert ids.count(airflow_id) == 1
    ran = [line for line in dags.lines(RUNS_DAG) if line["sharedstream"]["run_id"] == run.run_id]
    assert len(ran) == 1
    assert ran[0]["sharedstream"]["attempt"] == 1  # the first POST's conf stays


async def test_a_manual_runs_conf_reaches_the_task_at_the_top(
        dags: Dags, target: AirflowTarget) -> None:
    run = replace(document(events=0, run_id=f"manual__{datetime.now(UTC).isoformat()}"),
                  run_type="manual", conf={"region": "eu"})
    created = await deliver(target, run)
    assert (created.detail, created.external_id) == ("created", run.run_id)  # manual__: as is
    await until_success(target, run)
    [line] = [line for line in dags.lines(RUNS_DAG)
              if line["sharedstream"]["run_id"] == run.run_id]
    assert line["region"] == "eu"


async def test_a_run_airflow_got_elsewhere_is_undeliverable(
        dags: Dags, target: AirflowTarget) -> None:
    run = document()
    status, answer = dags.server.create_run(RUNS_DAG, airflow_run_id(run.run_id), {})
    assert status == 200, answer
    with pytest.raises(TargetError, match=f"Airflow already has a run "
                                          f"'{airflow_run_id(run.run_id)}' of DAG "
                                          f"'{RUNS_DAG}' that sharedstream did not create"
                       ) as raised:
        await deliver(target, run)
    assert not raised.value.retryable


async def test_a_dag_airflow_does_not_know_is_retried(dags: Dags) -> None:
    target = make_target(dags.server, dag_id="ss_not_parsed_yet")
    await target.open()
    try:
        with pytest.raises(TargetError, match="DAG 'ss_not_parsed_yet' not found in Airflow "
                                              r"\(is the file in its DAGs folder and parsed\?\)"
                           ) as raised:
            await target.deliver(document(), no_progress)
    finally:
        await target.aclose()
    assert raised.value.retryable


async def test_a_wrong_password_is_undeliverable_and_not_shown(dags: Dags) -> None:
    uri = dags.server.url.replace("://", "://admin:not-the-password@")
    target = make_target(dags.server, uri=uri)
    await target.open()
    try:
        with pytest.raises(TargetError) as raised:
            await deliver(target, document())
    finally:
        await target.aclose()
    assert str(raised.value) == ("Airflow refused the login of user 'admin' (connection "
                                 "'airflow_default'): HTTP 401: Invalid credentials")
    assert not raised.value.retryable


# -- asset_event mode ------------------------------------------------------------------------


def orders_asset_id(server: AirflowServer) -> int:
    status, found = server.request("GET", "/api/v2/assets?name_prefix_pattern=orders")
    assert status == 200, found
    [asset_id] = [a["id"] for a in found["assets"] if a["name"] == "orders"]
    return int(asset_id)


def our_events(server: AirflowServer, prefix: str) -> list[str]:
    status, page = server.request("GET", f"/api/v2/assets/events?asset_id="
                                  f"{orders_asset_id(server)}&limit=100&order_by=-timestamp")
    assert status == 200, page
    keys = [(event["extra"] or {}).get("sharedstream", {}).get("key", "")
            for event in page["asset_events"]]
    return sorted(key for key in keys if key.startswith(prefix))


async def keys_seen_by_the_asset_dag(dags: Dags, keys: list[str]) -> list[str]:
    """Every sharedstream key the asset DAG's runs saw, once ``keys`` are all among them.

    Airflow 3.3.2's scheduler makes one run per event or per batch, and an
    event that arrives while it creates a run for an earlier one (three
    POSTs 20 ms apart: one run, for the first) waits, unqueued, for the
    asset's next event: the next run gets it. So a sentinel event (no
    sharedstream key) is posted every 3 s until every key was seen.
    """
    asset_id = orders_asset_id(dags.server)
    deadline = time.monotonic() + 120
    nudge = time.monotonic() + 3
    while True:
        seen = [extra["sharedstream"]["key"] for line in dags.lines(ASSET_DAG)
                for extra in line if "sharedstream" in extra]
        if all(key in seen for key in keys):
            return seen
        assert time.monotonic() < deadline, f"the asset DAG saw {seen}"
        if time.monotonic() > nudge:
            dags.server.request("POST", "/api/v2/assets/events",
                                {"asset_id": asset_id, "extra": {"sentinel": True}})
            nudge = time.monotonic() + 3
        await asyncio.sleep(0.25)


async def test_asset_events_are_posted_once_and_a_repeat_posts_nothing(dags: Dags) -> None:
    target = make_target(dags.server, mode="asset_event")
    await target.open()
    run = document(events=3)
    try:
        first = await deliver(target, run)
        again = await deliver(target, replace(run, attempt=2, recovered=True))
    finally:
        await target.aclose()

    assert first.state == "dispatched"  # a retry after a 500 finds what the first try posted
    assert first.detail in {f"{3 - n} asset events posted, {n} already there" for n in range(3)}
    assert again.detail == "0 asset events posted, 3 already there"
    keys = [f"ship/{run.run_id}/{event.asset_event_id}" for event in run.events]
    assert our_events(dags.server, f"ship/{run.run_id}/") == sorted(keys)
    seen = await keys_seen_by_the_asset_dag(dags, keys)
    assert sorted(key for key in seen if key in keys) == sorted(keys)


async def test_an_asset_airflow_does_not_have_is_undeliverable(dags: Dags) -> None:
    target = make_target(dags.server, mode="asset_event")
    await target.open()
    try:
        with pytest.raises(TargetError, match="Airflow has no asset named 'order'") as raised:
            await deliver(target, document(asset="order"))  # a prefix of "orders"
    finally:
        await target.aclose()
    assert not raised.value.retryable


# -- through the dispatcher ------------------------------------------------------------------


async def test_the_dispatcher_delivers_twenty_runs_and_follows_them_to_success(
        dags: Dags, world: World) -> None:
    world.fire(20)
    target = make_target(dags.server, dag_id=DISPATCHED_DAG, retry_backoff_initial=0.5,
                         retry_backoff_max=5.0)
    async with running(world.dispatcher(target, follow_interval=0.5)):  # it retries 5xx
        deadline = time.monotonic() + 240
        while world.states() != ["success"] * 20:
            assert time.monotonic() < deadline, Counter(world.states())
            await asyncio.sleep(0.25)
    ours = {row.run_id: row for row in world.store.list_runs(dag_id="d")}
    airflow = {run["dag_run_id"]: run for run in dags.server.dag_runs(DISPATCHED_DAG)}
    assert set(airflow) == {airflow_run_id(run_id) for run_id in ours}
    assert all(row.external_id == airflow_run_id(run_id) for run_id, row in ours.items())
    assert all(run["state"] == "success" for run in airflow.values())
    lines = [line["sharedstream"]["run_id"] for line in dags.lines(DISPATCHED_DAG)]
    assert sorted(lines) == sorted(ours)
    assert world.states("e") == ["queued"] * 20  # not this dispatcher's DAG


# -- last: an API restart, which an SQLite Airflow does not always survive ------------


async def test_deliveries_during_an_api_restart_fail_retryable_then_go_through(
        dags: Dags) -> None:
    """Last in the module: SQLite Airflow's scheduler sometimes dies after this (see below).

    Its tasks lose the execution API for the restart; in 3 of ~35 sessions its
    scheduler then exited on "database is locked", and nothing ran afterwards.
    """
    target = make_target(dags.server, timeout=5.0)
    await target.open()
    outcomes: list[tuple[RunDocument, Delivery | TargetError]] = []
    try:
        restart = asyncio.create_task(asyncio.to_thread(dags.server.restart_api_server))
        while not restart.done():
            run = document()
            try:
                outcomes.append((run, await target.deliver(run, no_progress)))
            except TargetError as exc:
                outcomes.append((run, exc))
            await asyncio.sleep(0.1)
        await restart
        failed = [(run, o) for run, o in outcomes if isinstance(o, TargetError)]
        assert failed, "no delivery met the restart"
        assert all(error.retryable for _, error in failed), [str(e) for _, e in failed]
        retried = [await deliver(target, replace(run, attempt=2))
                   for run, _ in failed]  # the dispatcher's retry: created, or found (409)
        after = await deliver(target, document())
    finally:
        await target.aclose()
    assert after.detail == "created"
    assert {d.detail for d in retried} <= {"created", "already there (409)"}
    ids = Counter(r["dag_run_id"] for r in dags.server.dag_runs(RUNS_DAG))
    assert all(ids[airflow_run_id(run.run_id)] == 1 for run, _ in outcomes)
