"""The import rule ``airflow.X`` -> ``sharedstream.airflow.X``, held to the modules and the docs.

For every public module under :mod:`sharedstream.airflow` (no path component
starting with ``_``), the table in ``docs/airflow.md`` must name it, with the
Airflow module the rule gives and exactly the names the module exports
(``__all__``). Each exported class or function is either the module's own
(an adapter with Airflow's signature) or the very object of the module that
implements it (a re-export: nothing is defined twice).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import sharedstream.airflow

DOC = Path(__file__).resolve().parents[2] / "docs" / "airflow.md"
ROW = re.compile(r"^\| `(?P<airflow>airflow(?:\.\w+)*)` \| `(?P<ours>sharedstream\.airflow[\w.]*)` "
                 r"\| (?P<names>[^|]+) \|", re.MULTILINE)


def mirror_modules() -> dict[str, ModuleType]:
    """Every public module of the mirror that exports names, by module name."""
    found = {}
    for info in pkgutil.walk_packages(sharedstream.airflow.__path__, "sharedstream.airflow."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        if getattr(module, "__all__", None):
            found[info.name] = module
    return found


def documented() -> dict[str, tuple[str, set[str]]]:
    """The docs table: our module -> (Airflow module, names)."""
    return {row["ours"]: (row["airflow"], set(re.findall(r"`(\w+)`", row["names"])))
            for row in ROW.finditer(DOC.read_text(encoding="utf-8"))}


def test_every_mirror_module_is_in_the_docs_table_and_nothing_else_is() -> None:
    assert set(documented()) == set(mirror_modules())


def test_the_rule_gives_each_modules_airflow_path_and_the_table_its_names() -> None:
    table = documented()
    for name, module in mirror_modules().items():
        airflow, names = table[name]
        assert name == f"sharedstream.{airflow}", name
        assert names == set(module.__all__), name


def test_each_exported_name_is_the_modules_own_or_the_implementations_object() -> None:
    for name, module in mirror_modules().items():
        for export in module.__all__:
            value = getattr(module, export)
            home = getattr(value, "__module__", None)
            if home is None or home == name:
                continue  # a constant, or an adapter defined here
            implementation = importlib.import_module(home)
            assert not home.startswith("sharedstream.airflow.") or home.split(".")[2].startswith(
                "_"), f"{name}.{export} re-exports another mirror module's {home}"
            assert getattr(implementation, value.__qualname__) is value, f"{name}.{export}"


def test_the_trigger_base_names_are_sharedstreams_own() -> None:
    from sharedstream import TriggerEvent  # noqa: PLC0415 - the object compared
    from sharedstream.airflow.triggers.base import TriggerEvent as Mirrored  # noqa: PLC0415

    assert Mirrored is TriggerEvent
