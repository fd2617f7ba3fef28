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

Every import is read from the syntax tree (``import``, ``from``, and
``importlib.import_module`` with a literal name), so a lazy import inside a
function counts as much as one at the top.
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
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not name.startswith(OUTSIDE_CORE):
            yield name, path


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
            if target in ("sharedstream", "sharedstream.engine"):  # from sharedstream import x
                yield from (f"{target}.{alias.name}" for alias in node.names)
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
