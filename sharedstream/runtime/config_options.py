"""What each configuration option accepts: the catalogue, the conversions, the one error.

:data:`SPECS` lists every ``[section] option`` with its kind, bounds and help
text (``config show`` and the generated file print the help);
:func:`convert_value` turns a value as given (TOML value or environment
text) into the option's type or raises :class:`ConfigError`, one line naming
the option, the value (:data:`MASK` for a secret, the URL without its
password), what was expected and where it came from.
:mod:`sharedstream.runtime.config` layers the sources and builds the
:class:`~sharedstream.runtime.config.Config`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Literal

from sharedstream.engine.errors import SharedStreamError
from sharedstream.store import redact_url

__all__ = ["MASK", "SECRETS", "SPECS", "SQLITE_PREFIX", "ConfigError", "OptionSpec",
           "convert_value", "invalid", "parse_age"]

MASK = "********"
"""What a secret shows as, in messages and (unless asked otherwise) in ``config show``."""
SQLITE_PREFIX = "sqlite:///"
_POSTGRES_PREFIXES = ("postgresql://", "postgres://")
_FERNET_KEY_BYTES = 32


class ConfigError(SharedStreamError):
    """The configuration is invalid; raised at start-up, before anything runs.

    The message is a single line. ``option`` is the ``section.option`` the
    error is about (just the section name for an unknown section), or
    ``None`` when it concerns a whole file. ``source`` says where the
    offending value came from (``"file /path"``, ``"env NAME"``), or ``None``.
    Not retryable: the same configuration fails the same way.
    """

    retryable = False

    def __init__(
        self, message: str, *, option: str | None = None, source: str | None = None
    ) -> None:
        super().__init__(message)
        self.option = option
        self.source = source


@dataclass(frozen=True)
class OptionSpec:
    """How one option is parsed, bounded and described."""

    kind: Literal["int", "float", "store_url", "secret", "choice", "bool", "host", "name",
                  "names", "age"]
    help: str
    minimum: float = 0
    maximum: float = math.inf
    strict: bool = True  # value must be > minimum; otherwise >= minimum
    choices: tuple[str, ...] = ()  # kind "choice": the accepted words (any case)


SPECS: dict[str, dict[str, OptionSpec]] = {
    "triggerer": {
        "capacity": OptionSpec("int", "Triggers one triggerer process runs at most."),
        "shared_stream_subscriber_queue_size": OptionSpec(
            "int", "Raw events a subscriber may have waiting before it fails (SubscriberOverflow)."
        ),
        "shared_stream_ack_timeout": OptionSpec(
            "float",
            "Seconds a subscriber may take to resolve an event before it fails (AckTimeout).",
        ),
        "shared_stream_cohort_grace_period": OptionSpec(
            "float",
            "Seconds a new shared-stream group waits before its first poll.",
            strict=False,
        ),
        "job_heartbeat_sec": OptionSpec(
            "float", "Seconds between the triggerer's heartbeats in the metadata database."
        ),
        "triggerer_health_check_threshold": OptionSpec(
            "float",
            "Seconds after its last heartbeat a triggerer counts as dead: its standalone "
            "triggers go to another triggerer (keep it several job_heartbeat_sec).",
        ),
        "restart_backoff_initial": OptionSpec(
            "float", "Seconds before the first restart of a trigger that failed."
        ),
        "restart_backoff_max": OptionSpec(
            "float", "Longest delay, in seconds, between restarts (>= restart_backoff_initial)."
        ),
        "shutdown_timeout": OptionSpec(
            "float", "Seconds a graceful shutdown may take; unfinished work is redelivered."
        ),
        "gc_gen0_threshold": OptionSpec(
            "int",
            "Allocations between two young-generation collections of Python's garbage "
            "collector while the triggerer runs (Python's default is 700; 0: leave it).",
            strict=False,
        ),
        "queues": OptionSpec(
            "names", "Trigger queues this triggerer runs, comma-separated; \"\": the triggers "
            "with no queue."
        ),
    },
    "store": {
        "url": OptionSpec(
            "store_url",
            "Metadata database: sqlite:///path (relative to this file), or "
            "postgresql://user:password@host:port/database for several triggerers.",
        ),
        "pool_size": OptionSpec(
            "int", "PostgreSQL only: most connections the store's pool keeps open."
        ),
        "persist_batch_max": OptionSpec(
            "int", "Most trigger events written in one transaction (group commit)."
        ),
        "persist_linger_ms": OptionSpec(
            "float", "Milliseconds a batch waits for more events before committing.", strict=False
        ),
        "switch_interval_ms": OptionSpec(
            "float",
            "Python's thread switch interval while the triggerer runs, so the database thread "
            "gets the GIL back quickly (0: leave Python's setting).",
            strict=False,
        ),
        "retention": OptionSpec(
            "age",
            "How long finished DAG runs, the events no run needs, dead letters and dead "
            "triggerers are kept: the triggerer prunes older ones itself (30d, 12h, 2w; empty: "
            "keep everything). Keep it longer than the broker's longest redelivery.",
        ),
        "kwargs_key": OptionSpec(
            "secret",
            "SECRET. Fernet key(s) encrypting trigger kwargs at rest; comma-separated to rotate.",
        ),
    },
    "scheduler": {
        "batch_asset_events": OptionSpec(
            "bool",
            "Airflow 3.4's option: false (the default) makes a DAG run per asset event that "
            "satisfies its schedule; true makes runs batches of what a DAG's queue holds "
            "(per DAG: Dag(batch_asset_events=..., max_events=..., max_wait=...)).",
        ),
        "max_catchup_runs_per_loop": OptionSpec(
            "int",
            "Most time-based runs of one DAG the schedule loop queues per pass when catching "
            "up (the rest follow in the next passes, in order).",
        ),
    },
    "dispatch": {
        "enabled": OptionSpec(
            "bool",
            "Hand queued DAG runs to their targets (docs/dispatch.md); false: they wait in "
            "the store for something else to read them.",
        ),
        "default_target": OptionSpec(
            "name",
            "The target of DAGs that name none and have no run= (a [targets.<name>], or "
            "local); empty: their runs wait in the store.",
        ),
        "poll_interval": OptionSpec(
            "float",
            "Seconds between looks for runs this triggerer was not told of (queued by "
            "another triggerer or the CLI, retries coming due, claims of dead triggerers).",
        ),
        "follow_interval": OptionSpec(
            "float",
            "Seconds between questions to targets that can tell what became of a run they "
            "accepted (Airflow: running, success, failed).",
        ),
        "claim_batch": OptionSpec("int", "Most runs one claim takes from the store."),
        "claim_ahead": OptionSpec(
            "int",
            "Runs per target claimed ahead of a free slot, waiting to start at once "
            "(0: claim only for free slots).",
            strict=False,
        ),
    },
    "logging": {
        "format": OptionSpec(
            "choice",
            "Log lines: text (one readable line each) or json (one JSON object per line, "
            "with timestamp, level, logger, message and the key-values as fields).",
            choices=("text", "json"),
        ),
    },
    "api": {
        "enabled": OptionSpec(
            "bool",
            "Serve /healthz, /readyz, /metrics and the status page over HTTP (needs the "
            "ops extra: pip install 'sharedstream[ops]').",
        ),
        "host": OptionSpec(
            "host",
            "Address the endpoint listens on; loopback unless you mean to expose it "
            "(0.0.0.0: every interface).",
        ),
        "port": OptionSpec(
            "int", "TCP port of the endpoint (0: any free port, logged at start-up).",
            strict=False, maximum=65535,
        ),
        "backlog_interval": OptionSpec(
            "float",
            "Seconds between questions to the brokers about each stream's own backlog "
            "(Kafka group lag, queue depths), shown in /metrics and /status.",
        ),
        "replays": OptionSpec(
            "bool",
            "Accept POST /replays and POST /replays/ID/cancel (ask for or cancel a watcher's "
            "replay). Off by default: the endpoint has no authentication, and a replay queues "
            "DAG runs.",
        ),
    },
    "traces": {
        "enabled": OptionSpec(
            "bool",
            "Trace every raw event with OpenTelemetry: process, fan-out, filter, store and "
            "settle spans, continuing the trace context the message carries.",
        ),
        "exporter": OptionSpec(
            "choice",
            "Where spans go: otlp (OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT; needs the ops "
            "extra), console (JSON on standard output), or global (the provider the process "
            "already has).",
            choices=("otlp", "console", "global"),
        ),
    },
}
SECRETS = frozenset({"store.kwargs_key"})


def invalid(section: str, option: str, shown: object, source: str, expected: str) -> ConfigError:
    """The one-line error for a bad value (``shown`` as given, or masked by the caller)."""
    return ConfigError(
        f"invalid [{section}] {option} = {shown!r} (from {source}): {expected}",
        option=f"{section}.{option}",
        source=source,
    )




def _check_fernet_keys(value: str) -> bool:
    """True if ``value`` is one or more comma-separated Fernet keys.

    Blank entries are ignored, as the kwargs cipher ignores them; at least one
    key must remain.
    """
    keys = [key.strip() for key in value.split(",") if key.strip()]
    if not keys:
        return False
    for key in keys:
        try:
            decoded = base64.urlsafe_b64decode(key.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            return False
        if len(decoded) != _FERNET_KEY_BYTES:
            return False
    return True


def _convert_number(
    section: str, option: str, raw: object, source: str, spec: OptionSpec, *, from_text: bool
) -> int | float:
    integral = spec.kind == "int"
    bound = f"{'>' if spec.strict else '>='} {spec.minimum:g}"
    if spec.maximum != math.inf:
        bound += f" and <= {spec.maximum:g}"
    expected = f"expected {'an integer' if integral else 'a number'} {bound}"
    value: object = raw
    if from_text and isinstance(raw, str):
        try:
            value = int(raw) if integral else float(raw)
        except ValueError:
            raise invalid(section, option, raw, source, expected) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(section, option, raw, source, expected)
    if integral and not isinstance(value, int):
        raise invalid(section, option, raw, source, expected)
    number: int | float = value if integral else float(value)
    too_small = number <= spec.minimum if spec.strict else number < spec.minimum
    too_small = too_small or number > spec.maximum  # out of range, either way
    if not math.isfinite(number):
        raise invalid(
            section, option, raw, source, expected.replace("a number", "a finite number")
        )
    if too_small:
        raise invalid(section, option, raw, source, expected)
    return number


_TRUE_WORDS = ("true", "1", "yes", "on")
_FALSE_WORDS = ("false", "0", "no", "off")


def _convert_bool(section: str, option: str, raw: object, source: str, *, from_text: bool) -> bool:
    """A TOML boolean, or (environment only) one of true/false, 1/0, yes/no, on/off."""
    if isinstance(raw, bool):
        return raw
    if from_text and isinstance(raw, str):
        word = raw.strip().lower()
        if word in _TRUE_WORDS or word in _FALSE_WORDS:
            return word in _TRUE_WORDS
    expected = "expected true or false" + (" (or 1/0, yes/no, on/off)" if from_text else "")
    raise invalid(section, option, raw, source, expected)


def _convert_host(section: str, option: str, raw: object, source: str) -> str:
    """An IP address or host name to listen on: no scheme, port, path or blanks."""
    expected = "expected an IP address or host name, such as 127.0.0.1, ::1 or 0.0.0.0"
    if not isinstance(raw, str) or not raw or len(raw) > 253:
        raise invalid(section, option, raw, source, expected)
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not _HOST_NAME.fullmatch(raw):
            raise invalid(section, option, raw, source, expected) from None
    return raw


_NAME = re.compile(r"[A-Za-z0-9_.-]*")
_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _is_age(text: str) -> bool:
    try:
        parse_age(text)
    except ValueError:
        return False
    return True


def parse_age(text: str) -> dt.timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` as a duration; ``ValueError`` otherwise."""
    match = _AGE.fullmatch(text.strip())
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"expected an age such as 30d, 12h, 90m, 3600s or 2w, got {text!r}")
    return dt.timedelta(seconds=float(match[1]) * _AGE_UNITS[match[2]])

_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _convert_store_url(option: str, raw: object, source: str) -> str:
    expected = "expected sqlite:///path/to/file.db or postgresql://user@host:port/database"
    if not isinstance(raw, str):
        raise invalid("store", option, raw, source, expected)
    if raw.startswith(_POSTGRES_PREFIXES):
        return raw
    if raw.startswith("postgresql+"):
        raise invalid("store", option, redact_url(raw), source,
                       f"no driver suffix (psycopg is the driver); {expected}")
    path = raw.removeprefix(SQLITE_PREFIX)
    if not raw.startswith(SQLITE_PREFIX) or not path.strip() or path == ":memory:":
        raise invalid("store", option, redact_url(raw), source, expected)
    return raw


def _convert_text(section: str, option: str, raw: object, source: str, spec: OptionSpec) -> str:
    """A ``name``, ``choice`` or ``secret`` option: text that must match its rule."""
    if spec.kind == "names":
        names = [name.strip() for name in raw.split(",")] if isinstance(raw, str) else None
        if names is None or (any(names) and not all(
                name and _NAME.fullmatch(name) for name in names)):
            raise invalid(section, option, raw, source, "expected comma-separated names "
                          "(letters, digits, '_', '.', '-'), or \"\" for none")
        return ",".join(name for name in names if name)
    if spec.kind == "name":
        if not isinstance(raw, str) or not _NAME.fullmatch(raw):
            raise invalid(section, option, raw, source,
                          "expected a name (letters, digits, '_', '.', '-'), or \"\" for none")
        return raw
    if spec.kind == "age":
        if not isinstance(raw, str) or (raw and not _is_age(raw)):
            raise invalid(section, option, raw, source, "expected an age such as 30d, 12h, "
                          "90m, 3600s or 2w, or \"\" for none")
        return raw
    if spec.kind == "choice":
        if not isinstance(raw, str) or raw.lower() not in spec.choices:
            raise invalid(section, option, raw, source,
                           f"expected one of: {', '.join(spec.choices)}")
        return raw.lower()
    if not isinstance(raw, str) or not _check_fernet_keys(raw):
        # Never echo a secret, not even inside a mistyped value.
        expected = "expected one or more comma-separated Fernet keys (32 base64url bytes)"
        raise invalid(section, option, MASK, source, expected)
    return raw


def convert_value(
    section: str, option: str, raw: object, source: str, *, from_text: bool
) -> int | float | str:
    """Parse and bound one raw value; ``from_text`` (environment) parses strings."""
    spec = SPECS[section][option]
    if spec.kind == "store_url":
        return _convert_store_url(option, raw, source)
    if spec.kind == "bool":
        return _convert_bool(section, option, raw, source, from_text=from_text)
    if spec.kind == "host":
        return _convert_host(section, option, raw, source)
    if spec.kind in ("name", "names", "choice", "secret", "age"):
        return _convert_text(section, option, raw, source, spec)
    return _convert_number(section, option, raw, source, spec, from_text=from_text)
