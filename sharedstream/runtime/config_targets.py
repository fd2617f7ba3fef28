"""The config file's ``[targets.<name>]`` tables: where DAG runs go (``docs/dispatch.md``).

Each table names a target: ``type`` (a target type: ``command``,
``webhook``, ``airflow``, or one a plugin registers) and that type's
options (:func:`sharedstream.dispatch.target.check_options`). Secrets never
go here: a target that needs one names a connection (``conn_id``), which
the environment can hold. The built-in target ``local`` (type ``command``)
exists without a table; a ``[targets.local]`` table tunes it.

:mod:`sharedstream.runtime.config` reads the section with
:func:`read_targets` (turning :class:`TargetConfigError` into its
``ConfigError``) and shows it with :func:`render_targets`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharedstream.dispatch.target import (
    LOCAL_TARGET,
    TargetConfigError,
    check_options,
    target_type,
)

__all__ = ["TargetConfig", "local_target", "read_targets", "render_targets"]

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class TargetConfig:
    """One configured target: its name, type, the options as given, and every setting.

    ``settings`` holds every option of the type, defaults filled in;
    ``options`` only those the table set (what ``config show`` prints).
    ``source`` says where it was read (``"config file /path"``, or
    ``"built in"`` for the default ``local``).
    """

    name: str
    type: str
    options: dict[str, Any]
    settings: dict[str, Any]
    source: str


def local_target() -> TargetConfig:
    """The built-in ``local`` target, as it is when no ``[targets.local]`` table tunes it."""
    cls = target_type("command")
    return TargetConfig(LOCAL_TARGET, "command", {}, check_options(cls, {}, "[targets.local]"),
                        "built in")


def read_targets(section: Mapping[str, Any], path: Path) -> dict[str, TargetConfig]:
    """The targets of a config file's ``[targets]`` section, by name.

    Raises :class:`TargetConfigError` (one line naming the table, the option
    and what it expects) for a name that is not a plain word, an entry that
    is not a table, a missing or unknown ``type``, or a bad option.
    """
    found: dict[str, TargetConfig] = {}
    for name, table in section.items():
        where = f"[targets.{name}] in config file {path}"
        if not _NAME.fullmatch(name):
            raise TargetConfigError(f"{where}: a target's name is letters, digits, '_', '.' "
                                    "and '-'")
        if not isinstance(table, dict):
            raise TargetConfigError(f"{where}: expected a table with type = \"...\" and its "
                                    f"options, got a {type(table).__name__}")
        options = dict(table)
        kind = options.pop("type", None)
        if kind is None and name == LOCAL_TARGET:
            kind = "command"
        if not isinstance(kind, str) or not kind:
            raise TargetConfigError(f"{where}: needs type = \"command\", \"webhook\", "
                                    "\"airflow\" (or a plugin's type)")
        if name == LOCAL_TARGET and kind != "command":
            raise TargetConfigError(f"{where}: the built-in target 'local' is of type "
                                    "'command'; give yours another name")
        settings = check_options(target_type(kind), options, where)
        found[name] = TargetConfig(name, kind, options, settings, f"config file {path}")
    return found


def render_targets(targets: Mapping[str, TargetConfig]) -> dict[str, dict[str, Any]]:
    """``name -> {"type": ..., option: value}`` of the configured targets (nothing secret)."""
    return {name: {"type": target.type, **target.options} for name, target in targets.items()}
