"""Configuration: Airflow defaults, file and env layering, one-line errors, secrets."""

from __future__ import annotations

import dataclasses
import stat
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet, MultiFernet

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.config import (
    Config,
    ConfigError,
    StoreConfig,
    TriggererConfig,
    load_config,
    write_default_config,
)

KEY = Fernet.generate_key().decode()
OTHER_KEY = Fernet.generate_key().decode()

AIRFLOW_TRIGGERER_DEFAULTS = {
    "capacity": 1000,
    "shared_stream_subscriber_queue_size": 1024,
    "shared_stream_ack_timeout": 300.0,
    "shared_stream_cohort_grace_period": 0.0,
    "job_heartbeat_sec": 5.0,
    "triggerer_health_check_threshold": 30.0,
    "restart_backoff_initial": 1.0,
    "restart_backoff_max": 300.0,
    "shutdown_timeout": 30.0,
    "gc_gen0_threshold": 7000,  # ours, not Airflow's: see sharedstream.runtime.collector
    "queues": "",  # Airflow 3.4's trigger queues; "": the triggers with no queue
}


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ./sharedstream.toml from the repository is discovered by accident."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path | None = None, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=environ or {})
    message = str(info.value)
    assert "\n" not in message, message
    return info.value


# --- defaults ------------------------------------------------------------------


def test_defaults_are_airflows_triggerer_defaults() -> None:
    config = load_config(environ={})
    assert dataclasses.asdict(config.triggerer) == AIRFLOW_TRIGGERER_DEFAULTS
    assert dataclasses.asdict(TriggererConfig()) == AIRFLOW_TRIGGERER_DEFAULTS
    assert config.source == {}
    for name, value in AIRFLOW_TRIGGERER_DEFAULTS.items():
        assert type(getattr(config.triggerer, name)) is type(value), name


def test_store_defaults_are_a_sqlite_file_in_the_working_directory() -> None:
    config = load_config(environ={})
    assert config.store.persist_batch_max == 2000
    assert config.store.persist_linger_ms == 2.0
    assert config.store.kwargs_key is None
    assert config.sqlite_path() == Path.cwd() / "sharedstream.db"
    assert config.store.url == f"sqlite:///{Path.cwd() / 'sharedstream.db'}"


# --- layering ------------------------------------------------------------------


def test_file_overrides_defaults_and_env_overrides_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "sharedstream.toml",
        "[triggerer]\ncapacity = 50\nshared_stream_ack_timeout = 60\n"
        "[store]\npersist_batch_max = 7\n",
    )
    config = load_config(path, environ={"SHAREDSTREAM__TRIGGERER__CAPACITY": "20"})
    assert config.triggerer.capacity == 20
    assert config.triggerer.shared_stream_ack_timeout == 60.0
    assert config.triggerer.job_heartbeat_sec == 5.0
    assert config.store.persist_batch_max == 7
    assert config.source == {
        "triggerer.capacity": "env SHAREDSTREAM__TRIGGERER__CAPACITY",
        "triggerer.shared_stream_ack_timeout": f"file {path}",
        "store.persist_batch_max": f"file {path}",
    }


def test_floats_accept_integers_and_are_stored_as_floats(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[triggerer]\nshared_stream_cohort_grace_period = 2\n")
    grace = load_config(path, environ={}).triggerer.shared_stream_cohort_grace_period
    assert grace == 2.0
    assert type(grace) is float
    assert type(TriggererConfig(job_heartbeat_sec=3).job_heartbeat_sec) is float


@pytest.mark.parametrize(
    "name",
    [
        "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT",
        "SHAREDSTREAM__triggerer__shared_stream_ack_timeout",
        "sharedstream__Triggerer__Shared_Stream_Ack_Timeout",
    ],
)
def test_env_names_are_case_insensitive(name: str) -> None:
    config = load_config(environ={name: "12.5"})
    assert config.triggerer.shared_stream_ack_timeout == 12.5
    assert config.source == {"triggerer.shared_stream_ack_timeout": f"env {name}"}


def test_env_strings_are_parsed_by_type() -> None:
    config = load_config(
        environ={
            "SHAREDSTREAM__TRIGGERER__CAPACITY": " 42 ",
            "SHAREDSTREAM__TRIGGERER__SHUTDOWN_TIMEOUT": "1e1",
            "SHAREDSTREAM__STORE__PERSIST_LINGER_MS": "0",
            "SHAREDSTREAM__STORE__KWARGS_KEY": KEY,
            "UNRELATED": "ignored",
            "SHAREDSTREAM_CONFIG": "",
        }
    )
    assert config.triggerer.capacity == 42
    assert config.triggerer.shutdown_timeout == 10.0
    assert config.store.persist_linger_ms == 0.0
    assert config.store.kwargs_key == KEY


def test_one_option_set_twice_in_env_with_different_case_is_refused() -> None:
    error = load_error(
        environ={
            "SHAREDSTREAM__TRIGGERER__CAPACITY": "1",
            "sharedstream__triggerer__capacity": "2",
        }
    )
    assert error.option == "triggerer.capacity"
    assert "set twice" in str(error)


# --- which file ----------------------------------------------------------------


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(error)
    assert "does not exist" in str(error)


def test_config_env_var_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "etc" / "ss.toml", "[triggerer]\ncapacity = 3\n")
    config = load_config(environ={"SHAREDSTREAM_CONFIG": str(path)})
    assert config.triggerer.capacity == 3
    assert config.source == {"triggerer.capacity": f"file {path}"}


def test_config_env_var_naming_a_missing_file_is_an_error(tmp_path: Path) -> None:
    error = load_error(environ={"SHAREDSTREAM_CONFIG": str(tmp_path / "gone.toml")})
    assert "SHAREDSTREAM_CONFIG" in str(error)
    assert str(tmp_path / "gone.toml") in str(error)


def test_explicit_path_wins_over_config_env_var(tmp_path: Path) -> None:
    chosen = write(tmp_path / "a.toml", "[triggerer]\ncapacity = 1\n")
    other = write(tmp_path / "b.toml", "[triggerer]\ncapacity = 2\n")
    config = load_config(chosen, environ={"SHAREDSTREAM_CONFIG": str(other)})
    assert config.triggerer.capacity == 1


def test_sharedstream_toml_in_working_directory_is_discovered() -> None:
    write(Path.cwd() / "sharedstream.toml", "[triggerer]\ncapacity = 9\n")
    assert load_config(environ={}).triggerer.capacity == 9


# --- bad values ----------------------------------------------------------------

# (section, option, bad values from the environment, bad values in the file)
BAD_VALUES: list[tuple[str, str, list[str], list[Any]]] = [
    ("triggerer", "capacity", ["lots", "0", "-1", "1.5", "true", ""], [0, -1, 1.5, True, "10"]),
    (
        "triggerer",
        "shared_stream_subscriber_queue_size",
        ["many", "0", "2.0"],
        [0, 2.0, False, [1]],
    ),
    ("triggerer", "shared_stream_ack_timeout", ["soon", "0", "-1", "nan", "inf"], [0, -0.5, True]),
    ("triggerer", "shared_stream_cohort_grace_period", ["x", "-0.1", "nan"], [-1, "2", False]),
    ("triggerer", "job_heartbeat_sec", ["fast", "0"], [0, "5"]),
    ("triggerer", "restart_backoff_initial", ["1s", "0"], [0, -1.0]),
    ("triggerer", "restart_backoff_max", ["5m", "0", "0.5"], [0, 0.5]),
    ("triggerer", "shutdown_timeout", ["never", "-3"], [0, {"a": 1}]),
    ("store", "url", ["sharedstream.db", "mysql://h/db", "sqlite:///", "sqlite://x"], [1, ""]),
    ("store", "persist_batch_max", ["big", "0", "1e3"], [0, 1.0, True]),
    ("store", "persist_linger_ms", ["2ms", "-1"], [-0.1, "2"]),
    ("store", "kwargs_key", ["", " , ", "not-a-key", "c2hvcnQ="], [123, "short", True]),
]

ENV_CASES = [
    pytest.param(section, option, value, id=f"{section}.{option}={value!r}")
    for section, option, env_values, _ in BAD_VALUES
    for value in env_values
]
FILE_CASES = [
    pytest.param(section, option, value, id=f"{section}.{option}={value!r}")
    for section, option, _, file_values in BAD_VALUES
    for value in file_values
]


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + " }"
    return repr(value)


def assert_names_option_and_source(
    error: ConfigError, section: str, option: str, source: str
) -> None:
    message = str(error)
    assert "\n" not in message
    assert error.option == f"{section}.{option}"
    assert error.source == source
    assert message.startswith(f"invalid [{section}] {option} = ")
    assert f"(from {source}): expected" in message


@pytest.mark.parametrize(("section", "option", "value"), ENV_CASES)
def test_bad_env_value_is_one_line_naming_option_value_and_source(
    section: str, option: str, value: str
) -> None:
    name = f"SHAREDSTREAM__{section.upper()}__{option.upper()}"
    error = load_error(environ={name: value})
    assert_names_option_and_source(error, section, option, f"env {name}")
    if option != "kwargs_key":
        assert repr(value) in str(error)
    else:
        assert "'********'" in str(error)


@pytest.mark.parametrize(("section", "option", "value"), FILE_CASES)
def test_bad_file_value_is_one_line_naming_option_value_and_source(
    tmp_path: Path, section: str, option: str, value: Any
) -> None:
    path = write(tmp_path / "c.toml", f"[{section}]\n{option} = {toml_literal(value)}\n")
    error = load_error(path)
    assert_names_option_and_source(error, section, option, f"file {path}")
    if option != "kwargs_key":
        assert repr(value) in str(error)


def test_the_documented_message_shape() -> None:
    error = load_error(environ={"SHAREDSTREAM__TRIGGERER__CAPACITY": "lots"})
    assert str(error) == (
        "invalid [triggerer] capacity = 'lots' (from env SHAREDSTREAM__TRIGGERER__CAPACITY): "
        "expected an integer > 0"
    )
    assert isinstance(error, SharedStreamError)
    assert error.retryable is False


def test_invalid_key_is_never_echoed() -> None:
    bad_key = KEY[:-6] + "!!!!!!"  # looks like a key, is not one
    error = load_error(environ={"SHAREDSTREAM__STORE__KWARGS_KEY": bad_key})
    assert bad_key not in str(error)
    assert "'********'" in str(error)


def test_a_key_in_a_mistyped_file_value_is_never_echoed(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", f'[store]\nkwargs_key = ["{KEY}"]\n')
    error = load_error(path)
    assert KEY not in str(error)
    assert error.option == "store.kwargs_key"


def test_several_comma_separated_keys_are_accepted_for_rotation() -> None:
    both = f"{KEY}, {OTHER_KEY},"  # blank entries are ignored, as KwargsCipher does
    config = load_config(environ={"SHAREDSTREAM__STORE__KWARGS_KEY": both})
    assert config.store.kwargs_key == both
    keys = [Fernet(key.strip()) for key in both.split(",") if key.strip()]
    assert MultiFernet(keys).decrypt(Fernet(OTHER_KEY).encrypt(b"kw")) == b"kw"


def test_backoff_max_below_initial_names_both_sources(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[triggerer]\nrestart_backoff_initial = 10\n")
    env = {"SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_MAX": "5"}
    error = load_error(path, env)
    assert error.option == "triggerer.restart_backoff_max"
    assert "env SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_MAX" in str(error)
    assert f"file {path}" in str(error)


def test_backoff_initial_above_default_max_blames_initial() -> None:
    error = load_error(environ={"SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "301"})
    assert error.option == "triggerer.restart_backoff_initial"
    assert "restart_backoff_max" in str(error)


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match=r"\[triggerer\] capacity = 0") as info:
        TriggererConfig(capacity=0)
    assert info.value.option == "triggerer.capacity"
    with pytest.raises(ConfigError, match="restart_backoff_max"):
        TriggererConfig(restart_backoff_initial=10.0, restart_backoff_max=5.0)
    with pytest.raises(ConfigError, match="no driver suffix"):
        StoreConfig(url="postgresql+asyncpg://db/sharedstream")
    with pytest.raises(ConfigError, match=r"\[store\] pool_size"):
        StoreConfig(pool_size=0)


# --- unknown names -------------------------------------------------------------


def test_unknown_file_option_suggests_the_closest(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[triggerer]\ncapcity = 5\n")
    error = load_error(path)
    assert error.option == "triggerer.capcity"
    assert (
        str(error) == f"unknown option [triggerer] capcity in file {path}: did you mean capacity?"
    )


def test_unknown_file_section_suggests_the_closest(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[trigerer]\ncapacity = 5\n")
    error = load_error(path)
    assert "unknown section [trigerer]" in str(error)
    assert "did you mean triggerer?" in str(error)
    assert str(path) in str(error)


def test_top_level_option_points_to_its_section(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "capacity = 5\n")
    assert "[triggerer] capacity" in str(load_error(path))


def test_unknown_file_option_without_a_close_match_lists_the_options(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[store]\nzzz = 1\n")
    message = str(load_error(path))
    assert ("expected one of: url, pool_size, persist_batch_max, persist_linger_ms, "
            "switch_interval_ms, retention, kwargs_key") in message


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("SHAREDSTREAM__TRIGGERER__CAPCITY", "did you mean SHAREDSTREAM__TRIGGERER__CAPACITY?"),
        ("SHAREDSTREAM__TRIGERER__CAPACITY", "did you mean SHAREDSTREAM__TRIGGERER__CAPACITY?"),
        (
            "sharedstream__store__kwargs_keys",
            "did you mean SHAREDSTREAM__STORE__KWARGS_KEY?",
        ),
        ("SHAREDSTREAM__CAPACITY", "expected SHAREDSTREAM__<SECTION>__<OPTION>"),
    ],
)
def test_unknown_env_variable_suggests_the_closest(name: str, suggestion: str) -> None:
    error = load_error(environ={name: "1"})
    assert str(error) == f"unknown environment variable {name}: {suggestion}"
    assert error.source == f"env {name}"


# --- file problems -------------------------------------------------------------


def test_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.toml", "[triggerer]\ncapacity = 5\njob_heartbeat_sec = \n")
    error = load_error(path)
    assert str(error).startswith(f"invalid TOML in file {path}: ")
    assert "line 3" in str(error)
    assert error.option is None


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin.toml"
    path.write_bytes(b"[store]\nurl = 'sqlite:///caf\xe9.db'\n")
    assert str(path) in str(load_error(path))


def test_section_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "triggerer = 5\n")
    assert "must be a table" in str(load_error(path))


# --- store url -----------------------------------------------------------------


def test_relative_sqlite_path_resolves_against_the_config_files_directory(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "conf" / "c.toml", '[store]\nurl = "sqlite:///data/events.db"\n')
    config = load_config(path, environ={})
    assert config.sqlite_path() == tmp_path / "conf" / "data" / "events.db"
    assert config.store.url == f"sqlite:///{tmp_path / 'conf' / 'data' / 'events.db'}"


def test_relative_sqlite_path_from_env_resolves_against_the_working_directory(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "conf" / "c.toml", "[triggerer]\ncapacity = 5\n")
    env = {"SHAREDSTREAM__STORE__URL": "sqlite:///x.db"}
    assert load_config(path, environ=env).sqlite_path() == Path.cwd() / "x.db"


def test_absolute_sqlite_path_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "abs" / "db.sqlite"
    path = write(tmp_path / "conf" / "c.toml", f'[store]\nurl = "sqlite:///{target}"\n')
    assert load_config(path, environ={}).sqlite_path() == target


def test_a_postgres_url_is_kept_as_given_and_its_password_masked() -> None:
    url = "postgresql://ss:hunter2@db:5432/sharedstream"
    config = load_config(None, environ={"SHAREDSTREAM__STORE__URL": url,
                                        "SHAREDSTREAM__STORE__POOL_SIZE": "8"})
    assert (config.store.url, config.store.pool_size) == (url, 8)
    assert config.as_dict()["store"]["url"] == "postgresql://ss:********@db:5432/sharedstream"
    assert "hunter2" not in config.to_toml()
    assert config.as_dict(mask_secrets=False)["store"]["url"] == url
    assert load_config(None, environ={"SHAREDSTREAM__STORE__URL": "postgres://db/x"}).store.url


def test_a_driver_suffix_is_refused_and_hides_the_password() -> None:
    env = {"SHAREDSTREAM__STORE__URL": "postgresql+psycopg://ss:hunter2@db:5432/sharedstream"}
    error = load_error(environ=env)
    assert error.option == "store.url"
    assert "[store] url" in str(error)
    assert "hunter2" not in str(error)


# --- secrets and output --------------------------------------------------------


def keyed_config(tmp_path: Path) -> Config:
    path = write(tmp_path / "c.toml", "[triggerer]\ncapacity = 12\nshutdown_timeout = 4\n")
    return load_config(path, environ={"SHAREDSTREAM__STORE__KWARGS_KEY": KEY})


def test_as_dict_masks_a_set_secret_and_shows_an_unset_one_as_none(tmp_path: Path) -> None:
    config = keyed_config(tmp_path)
    masked = config.as_dict()
    assert masked["store"]["kwargs_key"] == "********"
    assert KEY not in repr(masked)
    assert config.as_dict(mask_secrets=False)["store"]["kwargs_key"] == KEY
    assert masked["triggerer"]["capacity"] == 12
    assert Config().as_dict()["store"]["kwargs_key"] is None
    assert KEY not in repr(config)


def test_masked_toml_never_contains_the_secret(tmp_path: Path) -> None:
    text = keyed_config(tmp_path).to_toml()
    assert KEY not in text
    assert tomllib.loads(text)["store"]["kwargs_key"] == "********"


def test_unmasked_toml_parses_back_to_the_same_values(tmp_path: Path) -> None:
    config = keyed_config(tmp_path)
    text = config.to_toml(mask_secrets=False)
    assert tomllib.loads(text) == config.as_dict(mask_secrets=False)
    reloaded = load_config(write(tmp_path / "again" / "c.toml", text), environ={})
    assert (reloaded.triggerer, reloaded.store) == (config.triggerer, config.store)


def test_toml_omits_an_unset_secret_and_escapes_strings(tmp_path: Path) -> None:
    odd = tmp_path / 'we"ird\\dir\n\x7f\t\u00e9' / "db"
    config = Config(store=StoreConfig(url=f"sqlite:///{odd}"))
    parsed = tomllib.loads(config.to_toml(mask_secrets=False))
    assert "kwargs_key" not in parsed["store"]
    assert parsed["store"]["url"] == f"sqlite:///{odd}"


def test_toml_comments_say_where_values_came_from(tmp_path: Path) -> None:
    text = keyed_config(tmp_path).to_toml()
    assert f"capacity = 12  # from file {tmp_path / 'c.toml'}" in text
    assert "# from env SHAREDSTREAM__STORE__KWARGS_KEY" in text


# --- write_default_config ------------------------------------------------------


def test_default_file_round_trips_through_load_config(tmp_path: Path) -> None:
    path = tmp_path / "proj" / "sharedstream.toml"
    path.parent.mkdir()
    write_default_config(path, kwargs_key=KEY, store_url="sqlite:///state/ss.db")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = load_config(path, environ={})
    assert dataclasses.asdict(config.triggerer) == AIRFLOW_TRIGGERER_DEFAULTS
    assert config.store.kwargs_key == KEY
    assert config.sqlite_path() == tmp_path / "proj" / "state" / "ss.db"
    defaults = dataclasses.asdict(StoreConfig())
    assert config.store.persist_batch_max == defaults["persist_batch_max"]
    assert config.store.persist_linger_ms == defaults["persist_linger_ms"]
    every_option = {f"{s}.{o}" for s, options in Config().as_dict().items() for o in options}
    assert set(config.source) == every_option


def test_default_file_is_never_overwritten(tmp_path: Path) -> None:
    path = write(tmp_path / "sharedstream.toml", "# mine\n")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        write_default_config(path, kwargs_key=KEY, store_url="sqlite:///x.db")
    assert path.read_text(encoding="utf-8") == "# mine\n"


def test_default_file_refuses_bad_values_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sharedstream.toml"
    with pytest.raises(ConfigError, match="kwargs_key") as info:
        write_default_config(path, kwargs_key="not-a-key", store_url="sqlite:///x.db")
    assert "not-a-key" not in str(info.value)
    with pytest.raises(ConfigError, match="expected sqlite"):
        write_default_config(path, kwargs_key=KEY, store_url="mysql://db/ss")
    assert not path.exists()


def test_retention_is_an_age_or_nothing(tmp_path: Path) -> None:
    assert load_config(write(tmp_path / "a.toml", '[store]\nretention = "30d"\n')
                       ).store.retention_period == timedelta(days=30)
    assert load_config(write(tmp_path / "b.toml", "")).store.retention_period is None
    message = str(load_error(write(tmp_path / "c.toml", '[store]\nretention = "30 days"\n')))
    assert "invalid [store] retention = '30 days'" in message
    assert "expected an age such as 30d, 12h, 90m, 3600s or 2w" in message
