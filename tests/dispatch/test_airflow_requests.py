"""The ``airflow`` target without an Airflow: what it sends, where, and how it signs in.

The bodies, the run id rule, the state mapping and the base URL are pure
functions; the sign-in is driven through a scripted HTTP client (answers
as Airflow 3.3.2 gives them, measured against the testing kit's Airflow).
The real Airflow is in ``test_airflow_target.py`` (``pytest -m airflow``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from sharedstream.connections import Connection, ConnectionNotFound, parse_connection_uri
from sharedstream.dispatch._airflow_api import (
    AirflowApi,
    airflow_run_id,
    api_base,
    asset_event_body,
    check_run_id,
    dag_run_body,
    dag_run_path,
    delivery_state,
    event_key_of,
    made_by_us,
    ui_url,
)
from sharedstream.dispatch._http import HttpAnswer, HttpClient
from sharedstream.dispatch.airflow import AirflowTarget
from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import (
    TargetConfigError,
    TargetContext,
    TargetError,
    check_options,
    target_type,
)

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
PASSWORD = "s3cret-Pa55"  # noqa: S105 - a test credential, checked to stay out of messages


def event(asset_event_id: int = 7, asset: str = "orders") -> EventDocument:
    return EventDocument(asset=asset, asset_event_id=asset_event_id, event_id=5,
                         payload={"id": 5, "amount": b"30"}, created_at=NOW,
                         trace_parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")


def document(run_id: str = "asset_triggered__000000000007", *, conf: dict[str, Any] | None = None,
             events: tuple[EventDocument, ...] = (), attempt: int = 1) -> RunDocument:
    return RunDocument(dag_id="ship", run_id=run_id, run_type="asset_triggered", queued_at=NOW,
                       logical_date=None, data_interval_start=None, data_interval_end=None,
                       conf=conf, trace_parent=None, events=events or (event(),),
                       attempt=attempt)


# -- bodies and ids ----------------------------------------------------------------------------


def test_the_dag_run_body_carries_our_run_id_a_null_logical_date_and_our_document() -> None:
    run = document(events=(event(7), event(9)))
    body = dag_run_body(run)
    assert set(body) == {"dag_run_id", "logical_date", "conf"}
    assert (body["dag_run_id"], body["logical_date"]) == (f"sharedstream__{run.run_id}", None)
    assert list(body["conf"]) == ["sharedstream"]
    ours = body["conf"]["sharedstream"]
    assert ours == {key: value for key, value in run.to_json().items() if key != "conf"}
    assert (ours["run_id"], ours["dag_id"], ours["attempt"]) == (run.run_id, "ship", 1)
    assert [e["asset_event_id"] for e in ours["events"]] == [7, 9]
    assert ours["events"][0]["payload"] == {"id": 5, "amount": "30"}  # bytes made JSON
    assert json.loads(json.dumps(body)) == body


def test_a_manual_runs_conf_is_at_the_top_and_cannot_hide_our_marker() -> None:
    run = document("manual__2026-11-28T12:00:00+00:00",
                   conf={"region": "eu", "sharedstream": "mine"})
    conf = dag_run_body(run)["conf"]
    assert conf["region"] == "eu"
    assert conf["sharedstream"]["run_id"] == run.run_id  # ours wins: the 409 check relies on it


@pytest.mark.parametrize("run_id", [
    "asset_triggered__000000000007", "scheduled__2026-11-28T12:00:00+00:00",
    "manual__2026-11-28T12:00:00.123456+00:00", "backfill~1.a-b"])
def test_run_ids_airflow_takes_pass(run_id: str) -> None:
    check_run_id(document(run_id))


@pytest.mark.parametrize(("run_id", "in_airflow"), [
    ("asset_triggered__000000000007", "sharedstream__asset_triggered__000000000007"),
    ("scheduled__2026-11-28T12:00:00+00:00", "sharedstream__scheduled__2026-11-28T12:00:00+00:00"),
    ("backfill__x", "sharedstream__backfill__x"),
    ("manual__2026-11-28T12:00:00+00:00", "manual__2026-11-28T12:00:00+00:00"),
    ("nightly-42", "nightly-42"), ("asset_triggered_7", "asset_triggered_7")])
def test_ids_airflow_keeps_for_its_own_runs_get_a_prefix(run_id: str, in_airflow: str) -> None:
    assert airflow_run_id(run_id) == in_airflow
    assert dag_run_body(document(run_id))["dag_run_id"] == in_airflow


@pytest.mark.parametrize("run_id", ["two words", "a/b", "", "rún", "x?y", "a..b"])
def test_run_ids_airflow_refuses_are_undeliverable_before_any_request(run_id: str) -> None:
    with pytest.raises(TargetError, match="cannot be an Airflow run id") as raised:
        check_run_id(document(run_id))
    assert not raised.value.retryable


@pytest.mark.parametrize(("state", "mapped"), [
    ("queued", "dispatched"), ("running", "running"), ("success", "success"),
    ("failed", "failed"), ("restarting", None), (None, None)])
def test_airflow_states_map_to_delivery_states(state: str | None, mapped: str | None) -> None:
    assert delivery_state({"state": state}) == mapped
    assert delivery_state("not a run") is None


def test_a_run_is_ours_only_with_our_marker_of_the_same_dag_and_run() -> None:
    run = document()
    conf = dag_run_body(run)["conf"]
    assert made_by_us({"conf": conf}, run)
    assert not made_by_us({"conf": {}}, run)
    assert not made_by_us({"conf": None}, run)
    other_dag = {**conf["sharedstream"], "dag_id": "audit"}  # two of our DAGs, one Airflow DAG
    assert not made_by_us({"conf": {"sharedstream": other_dag}}, run)


def test_an_asset_event_body_names_the_asset_and_carries_the_key() -> None:
    run = document()
    body = asset_event_body(3, run, run.events[0])
    assert body["asset_id"] == 3
    assert body["extra"]["sharedstream"] == {
        "key": "ship/asset_triggered__000000000007/7", "payload": {"id": 5, "amount": "30"},
        "event_id": 5, "created_at": "2026-11-28T12:00:00+00:00",
        "trace_parent": run.events[0].trace_parent}
    stored = {"extra": {**body["extra"], "from_rest_api": True}}  # as Airflow answers
    assert event_key_of(stored) == "ship/asset_triggered__000000000007/7"
    assert event_key_of({"extra": None}) is None


def test_ids_are_quoted_in_paths_and_ui_urls() -> None:
    assert dag_run_path("my dag") == "/api/v2/dags/my%20dag/dagRuns"
    assert dag_run_path("d", "scheduled__2026-11-28T12:00:00+00:00") == (
        "/api/v2/dags/d/dagRuns/scheduled__2026-11-28T12%3A00%3A00%2B00%3A00")
    assert ui_url("https://af/x", "d", "r+1") == "https://af/x/dags/d/runs/r%2B1"


# -- the base URL --------------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "base"), [
    ("http://admin:pw@airflow:8080", "http://airflow:8080"),
    ("https://admin:pw@airflow.example.com", "https://airflow.example.com"),
    ("http://admin:pw@host:8080/airflow", "http://host:8080/airflow"),
    ("http://admin:pw@host/team%20a/airflow", "http://host/team%20a/airflow"),
    ("airflow://https://host:443/sub", "https://host:443/sub"),
    ("http://admin:pw@[::1]:8080", "http://[::1]:8080"),
])
def test_the_base_url_comes_from_the_connection(uri: str, base: str) -> None:
    assert api_base(parse_connection_uri("airflow_default", uri)) == base


def test_a_connection_that_is_no_http_api_is_a_configuration_error() -> None:
    with pytest.raises(TargetConfigError, match="http or https, got conn_type 'postgres'"):
        api_base(parse_connection_uri("airflow_default", "postgres://u:p@db:5432/x"))
    with pytest.raises(TargetConfigError, match="no host"):
        api_base(Connection("airflow_default", conn_type="http"))


# -- signing in ------------------------------------------------------------------------------------


class ScriptedHttp(HttpClient):
    """Answers from a script: ``/auth/token`` from ``logins``, anything else from ``answers``."""

    def __init__(self, answers: list[HttpAnswer], logins: list[HttpAnswer] | None = None) -> None:
        super().__init__("airflow", "http://af", 1.0)
        self.answers = answers
        self.logins = logins if logins is not None else [token_answer("t1"), token_answer("t2")]
        self.sent: list[tuple[str, str | None]] = []

    async def request(self, method: str, path: str, *, body: Any = None,
                      data: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> HttpAnswer:
        await asyncio.sleep(0)
        if path == "/auth/token":
            assert body == {"username": "admin", "password": PASSWORD}
            self.sent.append((path, None))
            return self.logins.pop(0)
        self.sent.append((path, (headers or {}).get("Authorization")))
        return self.answers.pop(0)


def token_answer(token: str) -> HttpAnswer:
    return HttpAnswer(201, "", {"access_token": token, "token_type": "bearer"})


def answer(status: int, document: Any = None) -> HttpAnswer:
    return HttpAnswer(status, json.dumps(document), document)


def api(http: ScriptedHttp, uri: str = f"http://admin:{PASSWORD}@af:8080") -> AirflowApi:
    return AirflowApi(parse_connection_uri("airflow_default", uri), http)


async def test_one_token_is_fetched_and_reused() -> None:
    http = ScriptedHttp([answer(200, {}), answer(200, {})])
    client = api(http)
    await client.call("GET", "/api/v2/dags")
    await client.call("GET", "/api/v2/dags")
    assert http.sent == [("/auth/token", None), ("/api/v2/dags", "Bearer t1"),
                         ("/api/v2/dags", "Bearer t1")]


@pytest.mark.parametrize("refused", [
    answer(401, {"detail": "Token Expired"}), answer(403, {"detail": "Invalid JWT token"})])
async def test_a_refused_token_is_replaced_once_and_the_request_sent_again(
        refused: HttpAnswer) -> None:
    http = ScriptedHttp([refused, answer(200, {"ok": 1})])
    found = await api(http).call("GET", "/api/v2/dags")
    assert found.document == {"ok": 1}
    assert http.sent == [("/auth/token", None), ("/api/v2/dags", "Bearer t1"),
                         ("/auth/token", None), ("/api/v2/dags", "Bearer t2")]


async def test_a_forbidden_answer_that_is_not_about_the_token_is_the_answer() -> None:
    http = ScriptedHttp([answer(403, {"detail": "Forbidden"})])
    assert (await api(http).call("POST", "/api/v2/dags/d/dagRuns")).status == 403
    assert len(http.sent) == 2  # one sign-in, one request


async def test_a_new_token_refused_too_is_not_retryable() -> None:
    http = ScriptedHttp([answer(401, {"detail": "x"}), answer(401, {"detail": "x"})])
    with pytest.raises(TargetError, match="refused a token it had just issued") as raised:
        await api(http).call("GET", "/api/v2/dags")
    assert not raised.value.retryable


async def test_a_refused_login_is_not_retryable_and_never_shows_the_password() -> None:
    http = ScriptedHttp([], logins=[answer(401, {"detail": "Invalid credentials"})])
    with pytest.raises(TargetError) as raised:
        await api(http).call("GET", "/api/v2/dags")
    assert str(raised.value) == ("Airflow refused the login of user 'admin' (connection "
                                 "'airflow_default'): HTTP 401: Invalid credentials")
    assert not raised.value.retryable
    assert PASSWORD not in str(raised.value)


async def test_a_sign_in_that_fails_on_airflows_side_is_retryable() -> None:
    http = ScriptedHttp([], logins=[answer(503, {"detail": "starting"})])
    with pytest.raises(TargetError, match="POST /auth/token: HTTP 503") as raised:
        await api(http).call("GET", "/api/v2/dags")
    assert raised.value.retryable


async def test_a_token_in_the_extra_is_used_as_is_and_never_replaced() -> None:
    http = ScriptedHttp([answer(200, {}), answer(401, {"detail": "Token Expired"})], logins=[])
    client = api(http, 'http://af:8080?__extra__={"token": "given"}')
    await client.call("GET", "/api/v2/dags")
    with pytest.raises(TargetError, match="refused the token of connection") as raised:
        await client.call("GET", "/api/v2/dags")
    assert not raised.value.retryable
    assert "given" not in str(raised.value)
    assert http.sent == [("/api/v2/dags", "Bearer given")] * 2


async def test_concurrent_calls_share_one_sign_in() -> None:
    http = ScriptedHttp([answer(200, {}) for _ in range(5)])
    client = api(http)
    await asyncio.gather(*(client.call("GET", "/api/v2/dags") for _ in range(5)))
    assert [path for path, _ in http.sent].count("/auth/token") == 1


def test_a_connection_without_credentials_is_a_configuration_error() -> None:
    with pytest.raises(TargetConfigError, match="needs a login and password"):
        api(ScriptedHttp([]), "http://af:8080")


# -- the target's options and refusals ----------------------------------------------------------


def target(**options: Any) -> AirflowTarget:
    def connection(conn_id: str) -> Connection:
        raise ConnectionNotFound(conn_id)

    return AirflowTarget("airflow", check_options(AirflowTarget, options, "test"),
                         TargetContext({}, connection))


def test_the_type_is_registered_with_its_defaults() -> None:
    assert target_type("airflow") is AirflowTarget
    settings = check_options(AirflowTarget, {}, "test")
    assert (settings["conn_id"], settings["mode"], settings["dag_id"]) == (
        "airflow_default", "dag_run", None)
    assert (settings["max_concurrency"], settings["timeout"]) == (1, 30.0)
    assert check_options(AirflowTarget, {"mode": "asset_event", "dag_id": "x"}, "t",
                         dag_only=True) == {"mode": "asset_event", "dag_id": "x"}
    with pytest.raises(TargetConfigError, match="expected one of: dag_run, asset_event"):
        check_options(AirflowTarget, {"mode": "events"}, "test")


def test_only_dag_run_mode_follows_runs() -> None:
    assert target().follows
    assert not target(mode="asset_event").follows
    assert AirflowTarget.follows  # the class keeps its default


async def test_a_run_without_events_cannot_go_out_as_asset_events() -> None:
    run = RunDocument(dag_id="ship", run_id="manual__x", run_type="manual", queued_at=NOW,
                      logical_date=None, data_interval_start=None, data_interval_end=None,
                      conf={}, trace_parent=None, events=(), attempt=1)
    with pytest.raises(TargetError, match="asset_event mode forwards asset events; run "
                                          "'manual__x' has none") as raised:
        await target(mode="asset_event").deliver(run, lambda _: None)
    assert not raised.value.retryable


async def test_a_bad_run_id_is_refused_before_any_request() -> None:
    with pytest.raises(TargetError, match="cannot be an Airflow run id"):
        await target().deliver(document("a b"), lambda _: None)  # never opened: nothing sent


async def test_a_missing_connection_stops_the_target_from_opening() -> None:
    with pytest.raises(TargetConfigError, match="target 'airflow': connection 'nope' not found"):
        await target(conn_id="nope").open()
