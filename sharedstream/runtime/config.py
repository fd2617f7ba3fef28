"""Runtime configuration: defaults, then a TOML file, then environment variables.

:func:`load_config` is called once at start-up and either returns a fully
validated, immutable :class:`Config` or raises :class:`ConfigError` whose
message is one line naming the option, the bad value, what was expected and
where the value came from. Nothing past start-up ever sees an invalid value.

Invariants:

- Layers apply in a fixed order; a later layer wins: the dataclass defaults,
  the TOML file, then ``SHAREDSTREAM__<SECTION>__<OPTION>`` environment
  variables (section and option matched case-insensitively).
- Unknown sections and options are errors, never silently ignored, so a typo
  cannot leave a default in force unnoticed.
- The ``[triggerer]`` options keep Airflow's names and defaults.
- The secret (``store.kwargs_key``) never appears in an error message, and
  appears in :meth:`Config.as_dict` / :meth:`Config.to_toml` only when
  ``mask_secrets=False`` is asked for explicitly.
- ``[store] url`` is ``sqlite:///path`` or ``postgresql://...`` (also
  ``postgres://``); its password never appears in an error message either.
- A relative ``sqlite:///`` path is made absolute at load time: against the
  config file's directory when the URL came from that file, otherwise against
  the working directory at the time of the call. Later ``chdir`` calls do not
  move the database.
- The file's ``[connections.<conn_id>]`` tables become :attr:`Config.connections`
  (:mod:`sharedstream.runtime.config_connections`); a connection's password
  and secret-looking extra keys are masked like the secret option.

What each option accepts, and the conversions and messages, are in
:mod:`sharedstream.runtime.config_options`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sharedstream.connections import Connection, InvalidConnection
from sharedstream.dispatch.target import LOCAL_TARGET, TargetConfigError
from sharedstream.runtime.config_connections import (
    connections_as_dict,
    read_connections,
    render_connections,
)
from sharedstream.runtime.config_options import (
    MASK,
    SECRETS,
    SPECS,
    SQLITE_PREFIX,
    ConfigError,
    convert_value,
    invalid,
    parse_age,
)
from sharedstream.runtime.config_targets import (
    TargetConfig,
    local_target,
    read_targets,
    render_targets,
)
from sharedstream.store import MetadataStore, open_store, redact_url

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_FILENAME",
    "ENV_PREFIX",
    "ApiConfig",
    "Config",
    "ConfigError",
    "DispatchConfig",
    "LoggingConfig",
    "SchedulerConfig",
    "StoreConfig",
    "TracesConfig",
    "TriggererConfig",
    "load_config",
    "write_default_config",
]

ENV_PREFIX = "SHAREDSTREAM__"
"""Prefix of the per-option environment variables (matched case-insensitively)."""

CONFIG_ENV_VAR = "SHAREDSTREAM_CONFIG"
"""Environment variable naming the config file when no path is passed."""

DEFAULT_CONFIG_FILENAME = "sharedstream.toml"
"""File discovered in the working directory when neither a path nor the env var is given."""


_Setting = tuple[float, object, str]
"""An option's parsed value, its value as given (for messages) and its source."""


def _check_backoff(initial: _Setting, maximum: _Setting) -> None:
    """Refuse ``restart_backoff_max < restart_backoff_initial``, blaming the one that was set."""
    (low, low_shown, low_source), (high, high_shown, high_source) = initial, maximum
    if high >= low:
        return
    if high_source == "default":
        expected = f"expected a number <= restart_backoff_max ({high!r}, the default)"
        raise invalid("triggerer", "restart_backoff_initial", low_shown, low_source, expected)
    where = "the default" if low_source == "default" else f"from {low_source}"
    expected = f"expected a number >= restart_backoff_initial ({low!r}, {where})"
    raise invalid("triggerer", "restart_backoff_max", high_shown, high_source, expected)


def _validate_fields(
    instance: TriggererConfig | StoreConfig | SchedulerConfig | DispatchConfig | LoggingConfig
    | ApiConfig | TracesConfig,
    section: str,
) -> None:
    """Validate a directly constructed section; ints given for floats become floats."""
    for item in dataclasses.fields(instance):
        value = getattr(instance, item.name)
        if value is None and SPECS[section][item.name].kind == "secret":
            continue
        source = f"{type(instance).__name__}({item.name}=...)"
        converted = convert_value(section, item.name, value, source, from_text=False)
        object.__setattr__(instance, item.name, converted)


@dataclass(frozen=True)
class TriggererConfig:
    """The ``[triggerer]`` section; names and defaults follow Airflow's triggerer.

    Validated on construction (:class:`ConfigError` naming the option);
    integers given for float options are stored as floats.
    """

    capacity: int = 1000
    shared_stream_subscriber_queue_size: int = 1024
    shared_stream_ack_timeout: float = 300.0
    shared_stream_cohort_grace_period: float = 0.0
    job_heartbeat_sec: float = 5.0
    triggerer_health_check_threshold: float = 30.0
    restart_backoff_initial: float = 1.0
    restart_backoff_max: float = 300.0
    shutdown_timeout: float = 30.0
    gc_gen0_threshold: int = 7000
    queues: str = ""

    @property
    def served_queues(self) -> frozenset[str]:
        """The trigger queues ``queues`` names (empty: this triggerer runs unqueued triggers)."""
        return frozenset(name for name in self.queues.split(",") if name)

    def __post_init__(self) -> None:
        _validate_fields(self, "triggerer")
        low, high = self.restart_backoff_initial, self.restart_backoff_max
        _check_backoff(
            (low, low, "TriggererConfig(restart_backoff_initial=...)"),
            (high, high, "TriggererConfig(restart_backoff_max=...)"),
        )


@dataclass(frozen=True)
class StoreConfig:
    """The ``[store]`` section: the metadata database and how events are persisted.

    ``url`` is ``sqlite:///path`` (a relative path is relative to the working
    directory unless :func:`load_config` already made it absolute) or
    ``postgresql://user:password@host:port/database``; ``pool_size`` bounds
    a PostgreSQL store's connections; ``retention`` (``"30d"``, ``""`` for
    never) is how long finished runs and what only they need are kept. ``kwargs_key`` is the
    secret: one Fernet key, or several separated by commas (the first
    encrypts, all decrypt), or ``None`` when unset. Validated on construction.
    """

    url: str = "sqlite:///sharedstream.db"
    pool_size: int = 4
    persist_batch_max: int = 2000
    persist_linger_ms: float = 2.0
    switch_interval_ms: float = 0.5
    retention: str = ""
    kwargs_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _validate_fields(self, "store")

    @property
    def retention_period(self) -> timedelta | None:
        """``retention`` as a duration, or ``None`` when the triggerer prunes nothing."""
        return parse_age(self.retention) if self.retention else None

    def sqlite_path(self) -> Path:
        """The database file of a ``sqlite:///`` URL, absolute (relative to the cwd now)."""
        if not self.url.startswith(SQLITE_PREFIX):
            raise ConfigError(
                f"[store] url {redact_url(self.url)!r} is not a sqlite:/// URL",
                option="store.url",
            )
        return Path.cwd() / self.url.removeprefix(SQLITE_PREFIX)

    def open_store(self, *, create: bool = False) -> MetadataStore:
        """The metadata store of ``url`` (:func:`sharedstream.store.open_store`), not migrated.

        ``create`` lets an SQLite file be created (``init``, the demo).
        Raises :class:`~sharedstream.store.StoreError` (one line, password
        hidden) when it cannot be opened.
        """
        return open_store(self.url, create=create, pool_size=self.pool_size)


@dataclass(frozen=True)
class SchedulerConfig:
    """The ``[scheduler]`` section: the schedule loop of time-scheduled DAGs (Airflow's section).

    ``batch_asset_events`` (Airflow 3.4's option and default) makes
    asset-triggered runs batches, for DAGs that do not say;
    ``max_catchup_runs_per_loop`` bounds the runs of one DAG a pass of the
    loop queues while catching up. Validated on construction.
    """

    batch_asset_events: bool = False
    max_catchup_runs_per_loop: int = 16

    def __post_init__(self) -> None:
        _validate_fields(self, "scheduler")


@dataclass(frozen=True)
class DispatchConfig:
    """The ``[dispatch]`` section: handing queued runs to their targets (``docs/dispatch.md``).

    ``enabled`` turns the triggerer's dispatcher on; ``default_target`` is
    the target of DAGs that name none and have no ``run=`` (``""``: none);
    ``poll_interval``, ``follow_interval``, ``claim_batch`` and
    ``claim_ahead`` pace it.
    Validated on construction.
    """

    enabled: bool = True
    default_target: str = ""
    poll_interval: float = 1.0
    follow_interval: float = 5.0
    claim_batch: int = 100
    claim_ahead: int = 1

    def __post_init__(self) -> None:
        _validate_fields(self, "dispatch")


@dataclass(frozen=True)
class LoggingConfig:
    """The ``[logging]`` section: how the triggerer writes its log lines.

    ``format`` is ``"text"`` (the default) or ``"json"`` (one JSON object per
    line; see :class:`sharedstream.runtime.logs.JsonFormatter`). Validated
    on construction; stored in lower case.
    """

    format: str = "text"

    def __post_init__(self) -> None:
        _validate_fields(self, "logging")


@dataclass(frozen=True)
class ApiConfig:
    """The ``[api]`` section: the triggerer's operations endpoint (:mod:`sharedstream.runtime.api`).

    Off unless ``enabled``; ``host`` defaults to loopback, so turning it on
    exposes nothing beyond the machine until ``host`` says so; ``port`` 0
    takes any free port; ``backlog_interval`` is how often the brokers are asked
    for each stream's backlog (:mod:`sharedstream.runtime.ops_backlog`);
    ``replays`` lets ``POST /replays`` ask for and cancel replays.
    Validated on construction.
    """

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8794
    backlog_interval: float = 30.0
    replays: bool = False

    def __post_init__(self) -> None:
        _validate_fields(self, "api")


@dataclass(frozen=True)
class TracesConfig:
    """The ``[traces]`` section: OpenTelemetry spans (:mod:`sharedstream.runtime.traces`).

    Off unless ``enabled``; ``exporter`` is ``otlp``, ``console`` or
    ``global``. Validated on construction.
    """

    enabled: bool = False
    exporter: str = "otlp"

    def __post_init__(self) -> None:
        _validate_fields(self, "traces")


@dataclass(frozen=True)
class Config:
    """The whole, validated configuration of one process.

    ``source`` maps ``"section.option"`` to where a value that did not come
    from the defaults was read (``"file /abs/path"`` or ``"env NAME"``);
    options left at their defaults are absent from it. ``connections`` are
    the file's ``[connections.<conn_id>]`` tables by conn id (each says its
    own source); ``targets`` the file's ``[targets.<name>]`` tables by name
    (:meth:`target` adds the built-in ``local``); ``file`` is the file
    read, if any.
    """

    triggerer: TriggererConfig = field(default_factory=TriggererConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    traces: TracesConfig = field(default_factory=TracesConfig)
    source: dict[str, str] = field(default_factory=dict)
    connections: Mapping[str, Connection] = field(default_factory=dict)
    targets: Mapping[str, TargetConfig] = field(default_factory=dict)
    file: Path | None = None

    def sqlite_path(self) -> Path:
        """The SQLite database file (absolute); :class:`ConfigError` for other URLs."""
        return self.store.sqlite_path()

    def target(self, name: str) -> TargetConfig | None:
        """The target ``name``: a ``[targets.<name>]``, the built-in ``local``, or ``None``."""
        found = self.targets.get(name)
        if found is None and name == LOCAL_TARGET:
            return local_target()
        return found

    def as_dict(self, *, mask_secrets: bool = True) -> dict[str, dict[str, Any]]:
        """Every option by section; a set secret (and a URL's password) shows as ``"********"``.

        Unless ``mask_secrets=False``.

        An unset secret is ``None`` either way. Connections, when there are
        any, are under ``"connections"`` by conn id, with only the fields
        that are set. The result is a fresh dict.
        """
        result: dict[str, dict[str, Any]] = {}
        for section in SPECS:
            values = dataclasses.asdict(getattr(self, section))
            for option, value in values.items():
                if mask_secrets and value is not None and f"{section}.{option}" in SECRETS:
                    values[option] = MASK
                elif mask_secrets and f"{section}.{option}" == "store.url":
                    values[option] = redact_url(value)  # a password in a PostgreSQL URL
            result[section] = values
        if self.connections:
            result["connections"] = connections_as_dict(self.connections,
                                                        mask_secrets=mask_secrets)
        if self.targets:
            result["targets"] = render_targets(self.targets)
        return result

    def to_toml(self, *, mask_secrets: bool = True) -> str:
        """The configuration as TOML, each non-default value commented with its source.

        Unmasked, the output loads back (``tomllib``) to the same values; an
        unset secret is written as a comment. Masked, a set secret is written
        as ``"********"``, which is readable but not a valid key.
        """
        values = self.as_dict(mask_secrets=mask_secrets)
        values.pop("connections", None)
        targets = values.pop("targets", {})
        notes = {key: f"from {where}" for key, where in self.source.items()}
        text = _render_toml(values, header=["sharedstream configuration"], trailing=notes)
        lines = render_connections(self.connections, mask_secrets=mask_secrets)
        for name, options in targets.items():
            lines += ["", _comment(f"from {self.targets[name].source}"), f"[targets.{name}]"]
            lines += [f"{option} = {_toml_value(value)}" for option, value in options.items()]
        return text + "".join(line + "\n" for line in lines)


def _toml_string(text: str) -> str:
    # TOML basic strings: escape the quote, the backslash and every control character.
    def escape(char: str) -> str:
        if char in '"\\':
            return "\\" + char
        return f"\\u{ord(char):04X}" if ord(char) < 0x20 or ord(char) == 0x7F else char

    return '"' + "".join(map(escape, text)) + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"cannot write {value!r} as a TOML value")
    return repr(value)


def _comment(text: str) -> str:
    # TOML comments may not hold control characters (a newline would end the comment).
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _render_toml(
    values: Mapping[str, Mapping[str, Any]],
    *,
    header: list[str],
    help_comments: bool = False,
    trailing: Mapping[str, str] | None = None,
) -> str:
    lines = [_comment(line) for line in header]
    for section, options in values.items():
        lines += ["", f"[{section}]"]
        for option, value in options.items():
            if help_comments:
                lines.append(_comment(SPECS[section][option].help))
            if value is None:
                lines.append(_comment(f"{option} is not set"))
                continue
            line = f"{option} = {_toml_value(value)}"
            note = (trailing or {}).get(f"{section}.{option}")
            lines.append(f"{line}  {_comment(note)}" if note else line)
    return "\n".join(lines) + "\n"


def _suggest(name: str, candidates: list[str]) -> str:
    match = difflib.get_close_matches(name, candidates, n=1)
    if match:
        return f"did you mean {match[0]}?"
    return f"expected one of: {', '.join(candidates)}"


_RawValues = dict[tuple[str, str], tuple[object, str]]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist", source=f"file {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in file {path}: {exc}", source=f"file {path}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text: {exc.reason} at byte {exc.start}",
            source=f"file {path}",
        ) from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {path}: {exc.strerror}", source=f"file {path}"
        ) from exc


def _named_tables(document: dict[str, Any], path: Path, name: str, item: str) -> dict[str, Any]:
    """Take the ``[<name>]`` section (``[<name>.<item>]`` tables) out of ``document``."""
    section = document.pop(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"[{name}] in file {path} must hold [{name}.<{item}>] tables, got a "
                          f"{type(section).__name__}", option=name, source=f"file {path}")
    return section


def _file_connections(document: dict[str, Any], path: Path) -> dict[str, Connection]:
    """Take the ``[connections]`` section out of ``document`` and read it."""
    section = _named_tables(document, path, "connections", "conn_id")
    try:
        return read_connections(section, path)
    except InvalidConnection as exc:
        option = ".".join(["connections", exc.conn_id, *([exc.key] if exc.key else [])])
        raise ConfigError(str(exc), option=option, source=f"file {path}") from None


def _file_targets(document: dict[str, Any], path: Path) -> dict[str, TargetConfig]:
    """Take the ``[targets]`` section out of ``document`` and read it."""
    section = _named_tables(document, path, "targets", "name")
    try:
        return read_targets(section, path)
    except TargetConfigError as exc:
        raise ConfigError(str(exc), option="targets", source=f"file {path}") from None


def _file_values(document: dict[str, Any], path: Path) -> _RawValues:
    source = f"file {path}"
    raw: _RawValues = {}
    for section, table in document.items():
        if section not in SPECS:
            owners = [name for name, specs in SPECS.items() if section in specs]
            hint = (
                f"options go in a section: [{owners[0]}] {section}"
                if owners
                else _suggest(section, [*SPECS, "connections", "targets"])
            )
            raise ConfigError(
                f"unknown section [{section}] in {source}: {hint}", option=section, source=source
            )
        if not isinstance(table, dict):
            raise ConfigError(
                f"[{section}] in {source} must be a table, got a {type(table).__name__}",
                option=section,
                source=source,
            )
        for option, value in table.items():
            if option not in SPECS[section]:
                raise ConfigError(
                    f"unknown option [{section}] {option} in {source}: "
                    + _suggest(option, list(SPECS[section])),
                    option=f"{section}.{option}",
                    source=source,
                )
            raw[section, option] = (value, source)
    return raw


def _env_name(section: str, option: str) -> str:
    return f"{ENV_PREFIX}{section}__{option}".upper()


def _env_hint(parts: list[str]) -> str:
    """Suggest the variable a misspelt ``SHAREDSTREAM__...`` name probably meant."""
    if parts and parts[0] == "connections":
        return "a connection is set with SHAREDSTREAM_CONN_<ID> (one underscore; URI or JSON)"
    if len(parts) != 2 or not all(parts):
        return f"expected {ENV_PREFIX}<SECTION>__<OPTION>"
    section, option = parts
    if section not in SPECS:
        match = difflib.get_close_matches(section, list(SPECS), n=1)
        if not match:
            return f"unknown section {section!r}; " + _suggest(section, list(SPECS))
        section = match[0]
    match = difflib.get_close_matches(option, list(SPECS[section]), n=1)
    if not match:
        return f"unknown option {option!r} of [{section}]; " + _suggest(
            option, list(SPECS[section])
        )
    return f"did you mean {_env_name(section, match[0])}?"


def _env_values(environ: Mapping[str, str]) -> _RawValues:
    raw: _RawValues = {}
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        source = f"env {name}"
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        section, option = parts if len(parts) == 2 else ("", "")
        if option not in SPECS.get(section, {}):
            raise ConfigError(
                f"unknown environment variable {name}: {_env_hint(parts)}",
                option=".".join(p for p in parts if p) or None,
                source=source,
            )
        if (section, option) in raw:
            raise ConfigError(
                f"[{section}] {option} is set twice, by {raw[section, option][1]} and {source}",
                option=f"{section}.{option}",
                source=source,
            )
        raw[section, option] = (environ[name], source)
    return raw


def _pick_file(path: Path | None, environ: Mapping[str, str]) -> Path | None:
    if path is not None:
        return path.absolute()
    named = environ.get(CONFIG_ENV_VAR, "")
    if named:
        chosen = Path(named).absolute()
        if not chosen.exists():
            raise ConfigError(
                f"config file {chosen} named by {CONFIG_ENV_VAR} does not exist",
                source=f"env {CONFIG_ENV_VAR}",
            )
        return chosen
    discovered = Path.cwd() / DEFAULT_CONFIG_FILENAME
    return discovered if discovered.exists() else None


def load_config(path: Path | None = None, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read, validate and freeze the configuration; call once at start-up.

    The file is ``path`` if given (it must exist), else the file named by
    ``SHAREDSTREAM_CONFIG`` (it must exist; an empty value counts as unset),
    else ``./sharedstream.toml`` if there is one, else none. Environment
    variables ``SHAREDSTREAM__<SECTION>__<OPTION>`` (any case) override the
    file. Strings are parsed only from the environment; file values must have
    the right TOML type (an integer is accepted for a float, a boolean never
    for a number). ``environ`` defaults to ``os.environ``; it is only read.

    Raises :class:`ConfigError` (one line: option, value, expectation,
    source) for any unknown, mistyped or out-of-range value, an unreadable
    file, or a TOML syntax error (naming the file and line).
    """
    env = os.environ if environ is None else environ
    file = _pick_file(path, env)
    document = _read_toml(file) if file is not None else {}
    connections = _file_connections(document, file) if file is not None else {}
    targets = _file_targets(document, file) if file is not None else {}
    raw = _file_values(document, file) if file is not None else {}
    raw |= _env_values(env)

    converted: dict[str, dict[str, Any]] = {section: {} for section in SPECS}
    for (section, option), (value, source) in raw.items():
        from_text = source.startswith("env ")
        converted[section][option] = convert_value(section, option, value, source,
                                                   from_text=from_text)

    def setting(option: str) -> _Setting:
        default = getattr(TriggererConfig, option)
        shown, source = raw.get(("triggerer", option), (default, "default"))
        return converted["triggerer"].get(option, default), shown, source

    _check_backoff(setting("restart_backoff_initial"), setting("restart_backoff_max"))

    url = converted["store"].get("url", StoreConfig().url)
    if url.startswith(SQLITE_PREFIX):
        url_source = raw.get(("store", "url"), (None, "default"))[1]
        base = file.parent if file is not None and url_source.startswith("file ") else Path.cwd()
        converted["store"]["url"] = SQLITE_PREFIX + str(base / url.removeprefix(SQLITE_PREFIX))

    return Config(
        triggerer=TriggererConfig(**converted["triggerer"]),
        store=StoreConfig(**converted["store"]),
        scheduler=SchedulerConfig(**converted["scheduler"]),
        dispatch=DispatchConfig(**converted["dispatch"]),
        logging=LoggingConfig(**converted["logging"]),
        api=ApiConfig(**converted["api"]),
        traces=TracesConfig(**converted["traces"]),
        source={f"{section}.{option}": source for (section, option), (_, source) in raw.items()},
        connections=connections,
        targets=targets,
        file=file,
    )


def _refuse_overwrite(path: Path) -> ConfigError:
    return ConfigError(
        f"refusing to overwrite existing file {path} (it may hold the key your stored trigger "
        "kwargs are encrypted with); pass --path to write a new one, or set up the database "
        f"it names with `sharedstream --config {path} db upgrade`",
        source=f"file {path}",
    )


def write_default_config(
    path: Path, *, kwargs_key: str, store_url: str, source: str = "sharedstream init --db",
    check: Callable[[Config], None] | None = None,
) -> None:
    """Write a commented TOML file with every option at its default (``sharedstream init``).

    ``kwargs_key`` and ``store_url`` are validated first and written as
    given (a relative SQLite path stays relative to the file's directory).
    The file is created exclusively with mode 0600, as it holds the secret.
    Raises :class:`ConfigError` if the file exists (never overwritten), a
    value is invalid (``source`` says where the value came from), or the
    file cannot be written.

    ``check`` (``init``: the database must answer) is called with the
    configuration as it will load from ``path``, environment included,
    before ``path`` exists: the file is written to a temporary name beside
    it and linked to ``path`` only once ``check`` returned. When ``check``
    raises, that is raised and nothing is left behind.
    """
    convert_value("store", "kwargs_key", kwargs_key, source, from_text=False)
    convert_value("store", "url", store_url, source, from_text=False)
    values = Config().as_dict(mask_secrets=False)
    values["store"] |= {"url": store_url, "kwargs_key": kwargs_key}
    header = [
        "sharedstream configuration (written by `sharedstream init`).",
        "Every option is shown at its default. Environment variables",
        "SHAREDSTREAM__<SECTION>__<OPTION> override this file. It holds a secret: keep it private.",
    ]
    text = _render_toml(values, header=header, help_comments=True)
    if check is None:
        _create(path, path, text)
        return
    if path.exists():  # before anything is checked or written
        raise _refuse_overwrite(path)
    draft = path.with_name(f".{path.name}.{os.getpid()}.init")
    _create(draft, path, text)
    try:
        check(load_config(draft))
        try:
            os.link(draft, path)  # exclusive, like O_EXCL: never overwrites
        except FileExistsError:
            raise _refuse_overwrite(path) from None
        except OSError as exc:
            raise ConfigError(f"cannot create {path}: {exc.strerror}",
                              source=f"file {path}") from exc
    finally:
        draft.unlink(missing_ok=True)


def _create(file: Path, path: Path, text: str) -> None:
    """Create ``file`` exclusively (mode 0600) holding ``text``; errors name ``path``."""
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise _refuse_overwrite(path) from None
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc.strerror}", source=f"file {path}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
