"""``[api]``: its options, and a triggerer that cannot serve it refusing to start in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sharedstream.runtime.config import (
    ApiConfig,
    Config,
    ConfigError,
    load_config,
    write_default_config,
)
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.definitions import load_definitions
from sharedstream.runtime.ops import OpsExtraMissing
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.store.sqlite import SqliteStore
from tests.ops.conftest import DEFS

ROOT = Path(__file__).resolve().parents[2]


def test_off_and_on_loopback_by_default() -> None:
    assert ApiConfig() == ApiConfig(enabled=False, host="127.0.0.1", port=8794)
    assert Config().api.enabled is False


@pytest.mark.parametrize(("word", "on"), [("true", True), ("YES", True), ("1", True),
                                          ("off", False), ("False", False), ("0", False)])
def test_enabled_from_the_environment(word: str, on: bool) -> None:
    assert load_config(None, environ={"SHAREDSTREAM__API__ENABLED": word}).api.enabled is on


@pytest.mark.parametrize(("option", "raw", "expected"), [
    ("enabled", "maybe", "expected true or false"),
    ("port", "65536", "expected an integer >= 0 and <= 65535"),
    ("port", "-1", "expected an integer >= 0 and <= 65535"),
    ("host", "http://0.0.0.0", "expected an IP address or host name"),
    ("host", "", "expected an IP address or host name"),
    ("host", "a b", "expected an IP address or host name"),
    ("backlog_interval", "0", "expected a number > 0"),
    ("backlog_interval", "soon", "expected a number > 0"),
])
def test_bad_values_are_one_line_naming_the_option(option: str, raw: str, expected: str) -> None:
    name = f"SHAREDSTREAM__API__{option.upper()}"
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={name: raw})
    message = str(caught.value)
    assert f"[api] {option} = {raw!r} (from env {name}): {expected}" in message
    assert "\n" not in message
    assert caught.value.option == f"api.{option}"


def test_a_file_value_must_be_a_toml_boolean(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[api]\nenabled = "true"\n')
    with pytest.raises(ConfigError, match=r"\[api\] enabled = 'true' .*expected true or false$"):
        load_config(path, environ={})
    path.write_text('[api]\nenabled = true\nhost = "::1"\nport = 0\n')
    assert load_config(path, environ={}).api == ApiConfig(enabled=True, host="::1", port=0)


def test_the_written_configuration_has_the_section_and_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///ss.db")
    assert tomllib.loads(path.read_text())["api"] == {"enabled": False, "host": "127.0.0.1",
                                                       "port": 8794, "backlog_interval": 30.0,
                                                       "replays": False}
    config = load_config(path, environ={"SHAREDSTREAM__API__ENABLED": "on"})
    assert tomllib.loads(config.to_toml())["api"]["enabled"] is True


def test_without_the_ops_extra_the_triggerer_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///ss.db")
    config = load_config(path, environ={"SHAREDSTREAM__API__ENABLED": "true"})
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what a missing package looks like
    with pytest.raises(OpsExtraMissing) as caught:
        Triggerer(config, load_definitions(DEFS))
    assert str(caught.value) == ("[api] enabled = true needs the ops extra: pip install "
                                 "'sharedstream[ops]' (prometheus_client not installed)")
    Triggerer(load_config(path, environ={}), load_definitions(DEFS))  # off: no extra needed


def test_an_address_in_use_stops_the_start_up_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///ss.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SHAREDSTREAM__API__ENABLED": "true",
               "SHAREDSTREAM__API__PORT": str(port)}
        with SqliteStore(tmp_path / "ss.db") as store:
            store.migrate()
        result = subprocess.run(
            [sys.executable, "-m", "sharedstream", "--config", str(path), "triggerer",
             "--definitions", str(DEFS)],
            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors[-1].startswith(f"sharedstream: error: [api] cannot listen on 127.0.0.1:{port}: ")
    assert "Traceback" not in result.stderr
