"""The layers of the package, as import rules checked on the source.

* the engine (``sharedstream.engine``) imports only itself and the standard
  library (and the OpenTelemetry API for its instruments);
* the store and the broker kit import only the engine and themselves;
* core (everything under ``sharedstream`` but the broker modules - with the
  Airflow providers' mirrors, ``sharedstream.airflow.providers`` - the demo and
  the testing kit) imports no broker module, no demo or testing code and no
  broker SDK, not even inside a function; the declared exceptions are the
  CLI's ``demo`` command, which imports the demo when it is run, its
  ``broker start`` command, which imports the testing kit's local brokers
  when it is run, and the
  PostgreSQL store (``sharedstream.store.postgres`` and its private modules),
  which imports its driver, psycopg, and is itself imported only when a
  ``postgresql://`` URL is opened.

* the timetables import only themselves, the assets and the engine (a
  lower floor never reaches up into the runtime), and the assets and the
  connections only what is below them;
* no module of the package, broker modules included, imports itself back
  through others: there is no import circle, and the circles that were
  broken (the engine's resolution modules, the manager and its
  memberships, the triggerer and its operations modules, the timetable
  contract and its built-ins) are named, so a new one fails with its name;
* the package root holds no loose module: every part has its folder.

Every import is read from the syntax tree (``import``, ``from``, and
``importlib.import_module`` with a literal name), so a lazy import inside a
function, or one under ``if TYPE_CHECKING:``, counts as much as one at the
top: a circle is broken by moving the shared piece down or by a protocol,
not by hiding an import from the checker.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sharedstream"
OUTSIDE_CORE = ("sharedstream.producers", "sharedstream.triggers", "sharedstream.demo",
                "sharedstream.testing", "sharedstream.airflow.providers")
BROKER_SDKS = ("aiokafka", "kafka", "aiobotocore", "botocore", "boto3", "moto", "google",
               "azure", "proton", "asyncpg", "psycopg", "testcontainers")
ALLOWED = {
    ("sharedstream.runtime.cli", "sharedstream.demo"),  # the demo command, when run
    ("sharedstream.runtime.cli_broker", "sharedstream.testing"),  # broker start, when run
    ("sharedstream.store.postgres", "psycopg"),  # the PostgreSQL store and its driver
    ("sharedstream.store.postgres", "psycopg_pool"),
    ("sharedstream.store._postgres_events", "psycopg"),
}
# Loaded only on demand (a postgresql:// URL); importing them loads their driver.
ON_DEMAND = ("sharedstream.store.postgres",)
LAYERS = {
    "sharedstream.engine": ("sharedstream.engine", "opentelemetry"),
    "sharedstream.store": ("sharedstream.store", "sharedstream.engine"),
    "sharedstream.brokerkit": ("sharedstream.brokerkit", "sharedstream.engine"),
    "sharedstream.assets": ("sharedstream.assets", "sharedstream.engine"),
    "sharedstream.timetables": ("sharedstream.timetables", "sharedstream.assets",
                                "sharedstream.engine"),
    "sharedstream.connections": ("sharedstream.connections", "sharedstream.brokerkit",
                                 "sharedstream.engine"),
}
# Import circles that were broken (issue 31): each named so its return fails by name.
BROKEN_CIRCLES = {
    "engine resolution": ("sharedstream.engine.resolution", "sharedstream.engine.ack_subscriber",
                          "sharedstream.engine.failures", "sharedstream.engine.seqs"),
    "engine manager": ("sharedstream.engine.manager", "sharedstream.engine.membership"),
    "triggerer and ops": ("sharedstream.runtime.triggerer", "sharedstream.runtime.ops",
                          "sharedstream.runtime.api", "sharedstream.runtime.ops_view",
                          "sharedstream.runtime.ops_metrics", "sharedstream.runtime.ops_dispatch",
                          "sharedstream.runtime.progress_log"),
    "timetables": ("sharedstream.timetables.base", "sharedstream.timetables.interval",
                   "sharedstream.timetables.simple", "sharedstream.timetables.trigger",
                   "sharedstream.timetables.assets", "sharedstream.runtime.definitions"),
}
# What may stand loose at the package root: the package, ``python -m`` and the public
# names of a definitions file. Everything else lives in a folder that says what it is.
ROOT_MODULES = ("__init__.py", "__main__.py", "definitions.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not name.startswith(OUTSIDE_CORE):
            yield name, path


def all_modules() -> dict[str, Path]:
    """Every module of the package by name, the broker modules (symlinked folders) too."""
    paths = [*PACKAGE.rglob("*.py"), *PACKAGE.glob("producers/*.py"),
             *PACKAGE.glob("triggers/*.py")]
    return {module_name(path): path for path in sorted(paths)}


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports, anywhere in it.

    An imported name that is not a module (``from pkg.mod import Name``
    read as ``pkg.mod.Name``) stands for the module that holds it, and a
    package for its ``__init__``.
    """
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports(path, name):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each a sorted list of modules that reach each other."""
    reach = {module: reachable(graph, module) for module in graph}
    found = {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph if module in reach[module]
    }
    return sorted(sorted(circle) for circle in found)


def imports(path: Path, name: str) -> Iterator[str]:
    """Every absolute module name ``path`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (
                node.module or "")
            yield target
            # from sharedstream import producers; from pkg import module: the module too
            yield from (f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.args[0].value


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in prefixes)


def test_core_imports_no_broker_module_demo_testing_kit_or_sdk() -> None:
    found = [
        f"{name} imports {target}"
        for name, path in core_modules()
        for target in imports(path, name)
        if within(target, OUTSIDE_CORE + BROKER_SDKS + ("psycopg_pool",)) and not any(
            name == src and within(target, (dst,)) for src, dst in ALLOWED)
    ]
    assert found == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_what_is_below_it(layer: str) -> None:
    allowed = LAYERS[layer]
    found = [
        f"{name} imports {target}"
        for name, path in core_modules() if within(name, (layer,))
        for target in imports(path, name)
        if within(target, ("sharedstream", *BROKER_SDKS, "opentelemetry"))
        and not within(target, allowed)
        and not any(name == src and within(target, (dst,)) for src, dst in ALLOWED)
    ]
    assert found == []


def test_the_rules_see_lazy_relative_and_importlib_imports(tmp_path: Path) -> None:
    probe = PACKAGE / "engine" / "fanout.py"
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "def later():\n"
        "    from ..runtime import triggerer\n"
        "    importlib.import_module('aiokafka')\n"
    )
    found = set(imports(source, module_name(probe)))
    assert {"sharedstream.runtime", "aiokafka"} <= found


def test_importing_all_of_core_loads_no_sdk() -> None:
    names = [name for name, _ in core_modules()
             if not name.endswith("__main__") and name not in ON_DEMAND]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {BROKER_SDKS!r}"
        f" or m.startswith({OUTSIDE_CORE!r}))\n"
        "print(bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_the_package_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


@pytest.mark.parametrize("circle", sorted(BROKEN_CIRCLES))
def test_a_broken_circle_stays_broken(circle: str) -> None:
    members = set(BROKEN_CIRCLES[circle])
    graph = import_graph()
    assert members <= graph.keys()
    back = [sorted(set(found) & members) for found in circles(graph)
            if len(set(found) & members) > 1]
    assert back == []


def test_the_circle_finder_sees_a_circle_through_a_type_checking_import(tmp_path: Path) -> None:
    probe = PACKAGE / "engine" / "seqs.py"
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from sharedstream.engine.resolution import ResolutionBook\n"
    )
    graph = import_graph()
    graph["sharedstream.engine.seqs"] = set(imports(source, module_name(probe))) & graph.keys()
    pair = {"sharedstream.engine.resolution", "sharedstream.engine.seqs"}
    assert any(pair <= set(circle) for circle in circles(graph))


def test_the_package_root_holds_no_loose_module() -> None:
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in ROOT_MODULES)
    assert loose == []
