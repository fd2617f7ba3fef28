"""Airflow-style connections: the URI and JSON forms, lookup order, masking.

Expectations are written by hand from how Airflow documents and reads its
connections (``AIRFLOW_CONN_<ID>``: a URI, or a JSON object when the value
starts with ``{``), not computed by the code under test.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream.connections import (
    MASK,
    Connection,
    ConnectionNotFound,
    InvalidConnection,
    connection_from_table,
    env_connections,
    get_connection,
    is_secret_key,
    parse_connection_json,
    parse_connection_uri,
    set_file_connections,
)


@pytest.fixture(autouse=True)
def no_file_connections() -> Iterator[None]:
    set_file_connections({})
    yield
    set_file_connections({})


def fields(conn: Connection) -> dict[str, Any]:
    return {"conn_type": conn.conn_type, "host": conn.host, "port": conn.port,
            "login": conn.login, "password": conn.password, "schema": conn.schema,
            "extra": conn.extra_dejson}


# --- the URI form -----------------------------------------------------------------------------


def test_uri_with_every_part_percent_decoded() -> None:
    conn = parse_connection_uri(
        "db", "my-conn-type://my%40login:p%40ss%2Fw%3Ard@my-host:5432/my%2Fschema"
        "?param1=val1&param2=a%20b", source="here")
    assert fields(conn) == {
        "conn_type": "my_conn_type", "host": "my-host", "port": 5432, "login": "my@login",
        "password": "p@ss/w:rd", "schema": "my/schema",
        "extra": {"param1": "val1", "param2": "a b"}}
    assert conn.conn_id == "db"
    assert conn.source == "here"


def test_dashes_in_the_scheme_read_as_underscores() -> None:
    conn = parse_connection_uri("gcp", "google-cloud-platform://?project=p1")
    assert conn.conn_type == "google_cloud_platform"
    assert conn.host is None
    assert conn.extra_dejson == {"project": "p1"}
    assert parse_connection_uri("pg", "postgresql://h").conn_type == "postgres"
    assert parse_connection_uri("k", "KAFKA://h").conn_type == "kafka"


def test_no_host_and_only_a_port_or_only_a_login() -> None:
    assert fields(parse_connection_uri("k", "kafka://")) == {
        "conn_type": "kafka", "host": None, "port": None, "login": None, "password": None,
        "schema": None, "extra": {}}
    only_port = parse_connection_uri("k", "kafka://@:9092")
    assert (only_port.host, only_port.port, only_port.login) == (None, 9092, None)
    keys = parse_connection_uri("a", "aws://AKIDEXAMPLE:se%2Bcret@/?region_name=eu-west-1")
    assert (keys.login, keys.password, keys.host) == ("AKIDEXAMPLE", "se+cret", None)
    assert keys.extra_dejson == {"region_name": "eu-west-1"}


def test_host_is_lower_cased_as_airflow_reads_it() -> None:
    assert parse_connection_uri("k", "kafka://Broker-1.Example:9092").host == "broker-1.example"


def test_query_values_that_are_json_are_decoded_and_the_last_repeat_wins() -> None:
    conn = parse_connection_uri(
        "k", "kafka://h?n=123&flag=true&ratio=1.5&none=null&text=abc&servers=h1%3A9092&"
        "list=%5B%22a%22%2C%22b%22%5D&dup=1&dup=2&empty=")
    assert conn.extra_dejson == {
        "n": 123, "flag": True, "ratio": 1.5, "none": None, "text": "abc",
        "servers": "h1:9092", "list": ["a", "b"], "dup": 2, "empty": ""}


def test_extra_in_the_double_underscore_parameter() -> None:
    nested = {"config": {"bootstrap.servers": "h:9092"}, "n": [1, 2]}
    uri = "kafka://h/?__extra__=" + json.dumps(nested).replace(" ", "")
    assert parse_connection_uri("k", uri).extra_dejson == nested


def test_host_with_its_own_protocol() -> None:
    conn = parse_connection_uri("w", "http://https://example.com:8443/path")
    assert (conn.host, conn.port, conn.schema) == ("https://example.com", 8443, "path")


def test_an_unencoded_url_in_the_query_is_read_as_airflow_reads_it() -> None:
    conn = parse_connection_uri("a", "aws://?endpoint_url=http://localhost:5000&region_name=x")
    assert conn.host is None
    assert conn.extra_dejson == {"endpoint_url": "http://localhost:5000", "region_name": "x"}


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("just-text", "expected a URI"),
        ("kafka://h:notaport", "the port is not a number"),
        ("kafka://h:70000", "the port is not a number"),
        ("kafka://h/?__extra__=%5B1%5D", "__extra__ parameter must be a JSON object"),
        ("kafka://h/?__extra__=%7Bnope", "__extra__ parameter is not valid JSON"),
        ("a://b://c://d", "more than one protocol before the host"),
    ],
)
def test_malformed_uris_name_the_conn_and_the_source(uri: str, problem: str) -> None:
    with pytest.raises(InvalidConnection) as caught:
        parse_connection_uri("mine", uri, source="environment variable X")
    message = str(caught.value)
    assert message.startswith("invalid connection 'mine' (from environment variable X): ")
    assert problem in message
    assert "\n" not in message


def test_a_malformed_uri_never_echoes_its_password() -> None:
    with pytest.raises(InvalidConnection) as caught:
        parse_connection_uri("k", "kafka://user:hunter2@h:port?__extra__=%7B")
    assert "hunter2" not in str(caught.value)


# --- get_uri round trips ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "conn",
    [
        Connection("a", "my_conn_type", "host", 5432, "log@in", "pa:ss/w", "db/x",
                   {"a": "1x", "b": "two words"}),
        Connection("b", "kafka", extra={"n": 3, "flag": False, "s": "123"}),
        Connection("c", "aws", None, None, "AK", "s+e/c", extra={"nested": {"x": [1, 2]}}),
        Connection("d", "kafka", port=9092),
        Connection("e", "http", host="https://example.com", schema="p"),
        Connection("f", "google_cloud_platform", extra={"project": "p", "key_path": "/k.json"}),
        Connection("g", None, host="h"),
    ],
    ids=lambda conn: conn.conn_id,
)
def test_get_uri_parses_back_to_the_same_connection(conn: Connection) -> None:
    assert parse_connection_uri(conn.conn_id, conn.get_uri()) == conn


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
_SCALAR = st.one_of(_TEXT, st.integers(-5, 10**6), st.booleans(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False))
_EXTRA = st.dictionaries(_TEXT, st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=5), max_size=4)


@settings(max_examples=300, deadline=None)
@given(conn_type=st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)),
       host=st.one_of(st.none(), _TEXT.map(str.lower).filter(lambda h: h == h.lower())),
       port=st.one_of(st.none(), st.integers(0, 65535)),
       login=st.one_of(st.none(), _TEXT), password=st.one_of(st.none(), _TEXT),
       schema=st.one_of(st.none(), _TEXT), extra=_EXTRA)
def test_any_connection_round_trips_through_its_uri(
    *, conn_type: str | None, host: str | None, port: int | None, login: str | None,
    password: str | None, schema: str | None, extra: dict[str, Any],
) -> None:
    conn = Connection("any", conn_type, host, port, login, password, schema, extra)
    assert parse_connection_uri("any", conn.get_uri()) == conn


@settings(max_examples=300, deadline=None)
@given(head=st.sampled_from(["kafka://", "aws://", "", "a://b://", "//", "{"]),
       tail=st.text(max_size=40))
def test_any_malformed_value_is_invalid_connection_and_nothing_else(head: str, tail: str) -> None:
    for parse in (parse_connection_uri, parse_connection_json):
        with contextlib.suppress(InvalidConnection):  # anything else fails the test
            parse("any", head + tail)


def test_get_uri_uses_plain_query_parameters_when_they_read_back() -> None:
    conn = Connection("k", "kafka", "h", 9092, extra={"security.protocol": "SASL_SSL"})
    assert conn.get_uri() == "kafka://h:9092/?security.protocol=SASL_SSL"
    as_text_number = Connection("k", "kafka", extra={"group.id": "123"})
    assert "__extra__" in as_text_number.get_uri()  # "123" would read back as a number


# --- the JSON form ----------------------------------------------------------------------------


def test_json_form_with_extra_as_an_object_or_a_string() -> None:
    as_object = parse_connection_json("k", json.dumps({
        "conn_type": "kafka", "host": "h", "port": 9092, "login": "u", "password": "p",
        "schema": "s", "extra": {"bootstrap.servers": "h:9092"}, "description": "ignored"}))
    as_string = parse_connection_json("k", json.dumps({
        "conn_type": "kafka", "host": "h", "port": "9092", "login": "u", "password": "p",
        "schema": "s", "extra": json.dumps({"bootstrap.servers": "h:9092"})}))
    expected = {"conn_type": "kafka", "host": "h", "port": 9092, "login": "u", "password": "p",
                "schema": "s", "extra": {"bootstrap.servers": "h:9092"}}
    assert fields(as_object) == expected
    assert fields(as_string) == expected
    assert parse_connection_json("g", '{"conn_type": "google-cloud-platform"}').conn_type == (
        "google_cloud_platform")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{nope", "not valid JSON"),
        ("[1]", "must be an object"),
        ('{"hots": "h"}', "unknown key 'hots': did you mean host?"),
        ('{"port": "ninety"}', "port must be an integer"),
        ('{"port": true}', "port must be an integer"),
        ('{"host": 5}', "host must be a string, got int"),
        ('{"extra": [1]}', "extra must be an object"),
        ('{"extra": "[1]"}', "extra must be a JSON object"),
        ('{"password": "hunter2", "extra": "{bad"}', "extra is not valid JSON"),
    ],
)
def test_malformed_json(text: str, problem: str) -> None:
    with pytest.raises(InvalidConnection) as caught:
        parse_connection_json("mine", text, source="somewhere")
    assert problem in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_table_holds_fields_or_a_single_uri() -> None:
    from_uri = connection_from_table("k", {"uri": "kafka://h:1"}, source="file f")
    assert (from_uri.host, from_uri.port, from_uri.source) == ("h", 1, "file f")
    with pytest.raises(InvalidConnection, match="uri cannot be combined with host") as caught:
        connection_from_table("k", {"uri": "kafka://h:1", "host": "x"})
    assert caught.value.key == "host"


# --- lookup order -----------------------------------------------------------------------------


def test_sharedstream_variable_wins_over_airflow_variable_over_the_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SHAREDSTREAM_CONN_BROKER", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_BROKER", raising=False)
    set_file_connections({"broker": Connection("broker", "kafka", "from-file", source="file f")})
    assert get_connection("broker").host == "from-file"
    monkeypatch.setenv("AIRFLOW_CONN_BROKER", "kafka://from-airflow")
    found = get_connection("broker")
    assert found.host == "from-airflow"
    assert found.source == "environment variable AIRFLOW_CONN_BROKER"
    monkeypatch.setenv("SHAREDSTREAM_CONN_BROKER", '{"conn_type": "kafka", "host": "ours"}')
    assert get_connection("broker").host == "ours"


def test_variables_are_read_at_lookup_time_with_the_id_upper_cased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MY_KAFKA", "kafka://one")
    assert get_connection("my_kafka").host == "one"
    monkeypatch.setenv("AIRFLOW_CONN_MY_KAFKA", "kafka://two")
    assert get_connection("my_kafka").host == "two"


def test_a_malformed_variable_is_an_error_not_a_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAREDSTREAM_CONN_BROKER", "{bad json")
    monkeypatch.setenv("AIRFLOW_CONN_BROKER", "kafka://fine")
    with pytest.raises(InvalidConnection, match="environment variable SHAREDSTREAM_CONN_BROKER"):
        get_connection("broker")


def test_a_missing_connection_names_every_place_looked() -> None:
    with pytest.raises(ConnectionNotFound) as caught:
        get_connection("nowhere", environ={})
    assert str(caught.value) == (
        "connection 'nowhere' not found: no environment variable SHAREDSTREAM_CONN_NOWHERE or "
        "AIRFLOW_CONN_NOWHERE, and no [connections.nowhere] table in the config file "
        "(none loaded)")
    set_file_connections({}, origin="config file /x/sharedstream.toml")
    with pytest.raises(ConnectionNotFound, match=r"table in config file /x/sharedstream.toml$"):
        get_connection("nowhere", environ={})


def test_env_connections_lists_each_id_once_in_lookup_order() -> None:
    environ = {"SHAREDSTREAM_CONN_A": "kafka://ours", "AIRFLOW_CONN_A": "kafka://theirs",
               "AIRFLOW_CONN_B": "aws://", "AIRFLOW_CONN_": "x://", "OTHER": "y"}
    listed = [(conn.conn_id, conn.host, conn.source) for conn in env_connections(environ)]
    assert listed == [("a", "ours", "environment variable SHAREDSTREAM_CONN_A"),
                      ("b", None, "environment variable AIRFLOW_CONN_B")]


# --- masking ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "secret"),
    [("password", True), ("sasl.password", True), ("aws_secret_access_key", True),
     ("aws_session_token", True), ("keyfile_dict", True), ("credentials", True),
     ("connection_string", True), ("sas_url", True), ("SAS", True), ("Client_Secret", True),
     ("sasl.mechanism", False), ("sasl.username", False), ("region_name", False),
     ("bootstrap.servers", False), ("project", False)],
)
def test_secret_looking_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_masked_and_repr_hide_every_secret() -> None:
    conn = Connection(
        "k", "kafka", "h", 9092, "user", "hunter2", extra={
            "sasl.password": "hunter3", "sasl.mechanism": "PLAIN",
            "nested": {"client_secret": "hunter4", "ok": 1},
            "conn": "Endpoint=sb://x/;SharedAccessKeyName=n;SharedAccessKey=hunter5"})
    masked = conn.masked()
    assert masked["password"] == MASK
    assert masked["extra"] == {"sasl.password": MASK, "sasl.mechanism": "PLAIN",
                               "nested": {"client_secret": MASK, "ok": 1}, "conn": MASK}
    assert masked["login"] == "user"
    for shown in (json.dumps(masked), repr(conn), str(conn)):
        assert "hunter" not in shown
    assert Connection("k").masked()["password"] is None


def test_a_connection_is_immutable_and_extra_dejson_is_a_copy() -> None:
    conn = Connection("k", extra={"a": {"b": [1]}})
    copy = conn.extra_dejson
    copy["a"]["b"].append(2)
    assert conn.extra_dejson == {"a": {"b": [1]}}
    with pytest.raises(TypeError):
        conn.extra["a"] = 1  # type: ignore[index]
