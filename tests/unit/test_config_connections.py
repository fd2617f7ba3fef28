"""The config file's ``[connections.<conn_id>]`` tables and how the CLI shows connections.

``config show`` and ``connections list/get`` run in-process through
``sharedstream.runtime.cli.main`` (the same code the command runs), against a
real TOML file; every secret is a distinct ``hunter<N>`` so a leak of any of
them is caught.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from sharedstream.connections import MASK, Connection, get_connection, set_file_connections
from sharedstream.runtime.cli import main
from sharedstream.runtime.config import ConfigError, load_config

FILE_CONNECTIONS = """
[connections.kafka_default]
conn_type = "kafka"
password = "hunter1"
extra = { "bootstrap.servers" = "broker:9092", "sasl.password" = "hunter2", "sasl.mechanism" = "PLAIN" }

[connections.aws]
uri = "aws://AKID:hunter3@/?region_name=eu-west-1&aws_session_token=hunter4"

[connections.bus]
conn_type = "azure_service_bus"
schema = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=n;SharedAccessKey=hunter5"
"""  # noqa: E501 - a TOML inline table is one line

ENV_CONNECTION = json.dumps({"conn_type": "google_cloud_platform", "extra": {
    "project": "p1", "keyfile_dict": {"private_key": "hunter6"}, "key_path": "/hunter7"}})


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("SHAREDSTREAM_CONN_", "AIRFLOW_CONN_", "SHAREDSTREAM_")):
            monkeypatch.delenv(name)
    set_file_connections({})
    yield
    set_file_connections({})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sharedstream.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_section_becomes_config_connections(tmp_path: Path) -> None:
    path = write(tmp_path, FILE_CONNECTIONS)
    config = load_config(path)
    assert list(config.connections) == ["kafka_default", "aws", "bus"]
    kafka = config.connections["kafka_default"]
    assert kafka.password == "hunter1"  # noqa: S105 - a fake secret, checked masked below
    assert kafka.extra_dejson["bootstrap.servers"] == "broker:9092"
    assert kafka.source == f"config file {path} [connections.kafka_default]"
    aws = config.connections["aws"]
    assert (aws.conn_type, aws.login, aws.password) == ("aws", "AKID", "hunter3")
    assert aws.extra_dejson == {"region_name": "eu-west-1", "aws_session_token": "hunter4"}
    assert config.file == path


@pytest.mark.parametrize(
    ("text", "option", "words"),
    [
        ('[connections.k]\nhots = "h"\n', "connections.k.hots",
         "unknown key 'hots': did you mean host?"),
        ("[connections.k]\nport = \"x\"\n", "connections.k.port", "port must be an integer"),
        ("[connections.k]\nport = 1.5\n", "connections.k.port", "port must be an integer"),
        ("[connections.k]\nextra = [1]\n", "connections.k.extra", "extra must be an object"),
        ('[connections.k]\nuri = "nope"\n', "connections.k", "expected a URI"),
        ('[connections.k]\nuri = "kafka://h"\nhost = "x"\n', "connections.k.host",
         "uri cannot be combined with host"),
        ("[connections]\nk = 5\n", "connections.k", "expected a table"),
        ("connections = 5\n", "connections", "must hold [connections.<conn_id>] tables"),
    ],
)
def test_a_bad_table_is_a_config_error_naming_connection_and_key(
    tmp_path: Path, text: str, option: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert caught.value.option == option
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_bad_password_field_is_not_echoed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, '[connections.k]\npassword = "hunter9"\nextra = "{oops"\n'))
    assert "hunter9" not in str(caught.value)


def test_unmasked_toml_loads_back_to_the_same_connections(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FILE_CONNECTIONS + (
        '\n[connections."odd.id"]\nextra = { n = 1, flag = true, "nested" = { list = [1, "a"] } }\n'
        '\n[connections.nulls]\nextra = \'{"a": null}\'\n')))
    (tmp_path / "again").mkdir()
    again = load_config(write(tmp_path / "again", config.to_toml(mask_secrets=False)))

    def unsourced(connections: Mapping[str, Connection]) -> dict[str, Connection]:
        return {conn_id: replace(conn, source="") for conn_id, conn in connections.items()}

    assert unsourced(again.connections) == unsourced(config.connections)
    loaded = tomllib.loads(config.to_toml(mask_secrets=False))["connections"]
    assert loaded["nulls"] == {"extra": '{"a": null}'}  # TOML has no null: the JSON form
    expected = config.as_dict(mask_secrets=False)["connections"]
    assert {k: v for k, v in loaded.items() if k != "nulls"} == {
        k: v for k, v in expected.items() if k != "nulls"}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_config_show_masks_every_secret_of_file_and_environment_connections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, FILE_CONNECTIONS)
    monkeypatch.setenv("AIRFLOW_CONN_GCP", ENV_CONNECTION)
    monkeypatch.setenv("SHAREDSTREAM_CONN_AWS", "aws://AKID2:hunter8@/?region_name=us-east-2")
    status, text, _ = run_cli(capsys, "--config", str(path), "config", "show")
    assert status == 0
    status, as_json, _ = run_cli(capsys, "--config", str(path), "config", "show", "--json")
    assert status == 0
    for output in (text, as_json):
        assert "hunter" not in output
    shown = json.loads(as_json)["connections"]
    assert shown["aws"] == {  # the environment's, found first, replaces the file's
        "conn_type": "aws", "login": "AKID2", "password": MASK,
        "extra": {"region_name": "us-east-2"},
        "source": "environment variable SHAREDSTREAM_CONN_AWS"}
    assert shown["gcp"]["extra"] == {"project": "p1", "keyfile_dict": MASK, "key_path": MASK}
    assert shown["bus"]["schema"] == MASK
    assert shown["kafka_default"]["extra"]["sasl.mechanism"] == "PLAIN"
    assert "# from environment variable AIRFLOW_CONN_GCP\n[connections.gcp]\n" in text
    assert f"# from config file {path} [connections.kafka_default]\n" in text


def test_connections_list_and_get(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, FILE_CONNECTIONS)
    monkeypatch.setenv("AIRFLOW_CONN_GCP", ENV_CONNECTION)
    status, listing, _ = run_cli(capsys, "--config", str(path), "connections", "list", "--json")
    assert status == 0
    assert "hunter" not in listing
    assert [(c["conn_id"], c["source"].split(" [")[0]) for c in json.loads(listing)] == [
        ("aws", f"config file {path}"), ("bus", f"config file {path}"),
        ("gcp", "environment variable AIRFLOW_CONN_GCP"),
        ("kafka_default", f"config file {path}")]
    status, got, _ = run_cli(capsys, "--config", str(path), "connections", "get", "kafka_default")
    assert status == 0
    assert json.loads(got)["password"] == MASK
    assert "hunter" not in got
    status, out, err = run_cli(capsys, "--config", str(path), "connections", "get", "missing")
    assert (status, out) == (2, "")
    assert err == ("sharedstream: error: connection 'missing' not found: no environment variable "
                   "SHAREDSTREAM_CONN_MISSING or AIRFLOW_CONN_MISSING, and no "
                   f"[connections.missing] table in config file {path}\n")


def test_a_malformed_environment_connection_is_one_line_in_config_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BAD", '{"password": "hunter1", "port": "x"}')
    status, _, err = run_cli(capsys, "--config", str(write(tmp_path, "")), "config", "show")
    assert status == 2
    assert err.startswith("sharedstream: error: invalid connection 'bad' (from environment "
                          "variable AIRFLOW_CONN_BAD): port must be an integer")
    assert "hunter1" not in err


def test_installed_file_connections_are_found_after_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sharedstream.runtime.config_connections import install_connections  # noqa: PLC0415

    config = load_config(write(tmp_path, FILE_CONNECTIONS))
    install_connections(config.connections, config.file)
    assert get_connection("kafka_default").password == "hunter1"  # noqa: S105 - fake
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", "kafka://other:9092")
    assert get_connection("kafka_default").host == "other"


def test_an_option_style_variable_for_a_connection_says_how_to_set_one(tmp_path: Path) -> None:
    environ = {"SHAREDSTREAM__CONNECTIONS__KAFKA_DEFAULT": "kafka://h"}
    with pytest.raises(ConfigError, match="a connection is set with SHAREDSTREAM_CONN_<ID>"):
        load_config(write(tmp_path, ""), environ=environ)
