"""The runtime's own log lines are structlog-style: a constant message and key-values.

Operators filter and parse the triggerer's lines (``[logging] format =
"json"`` writes each key-value as a field), so a value baked into the text
with ``%``-style arguments or an f-string is a value they cannot read. This
test reads every module of the package (``sharedstream/``, and the broker
modules in ``producers/`` and ``triggers/``) and fails for:

* a module-level logger (``log``, ``_log``, ``_LOG``, ``logger``) that is not
  ``key_value_logger(...)``;
* a log call (``log.info(...)``, ``self.log.warning(...)``, ``log.log(level,
  ...)``) with positional arguments after its message, or whose message is an
  f-string, a ``%`` expression or a ``.format()`` call;
* a call on the standard library directly (``logging.info(...)``,
  ``logging.getLogger(name).warning(...)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("sharedstream", "producers", "triggers")

LEVEL_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical"})
LOGGER_NAMES = frozenset({"log", "_log", "_LOG", "logger", "_logger"})

IMPLEMENTATION = {"sharedstream/engine/keyvalue_log.py"}
"""The adapter itself forwards ``%``-style arguments to the standard logger."""


def _modules() -> Iterator[Path]:
    for folder in PACKAGE_DIRS:
        # rglob does not follow symlinks: sharedstream/producers and sharedstream/triggers
        # point at the top-level folders, which are read once, under their own name.
        yield from sorted((ROOT / folder).rglob("*.py"))


def _is_logger(node: ast.expr) -> bool:
    """``log``, ``self.log``, ``cls._log``: an expression naming a logger."""
    if isinstance(node, ast.Name):
        return node.id in LOGGER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in LOGGER_NAMES


def _is_stdlib(node: ast.expr) -> bool:
    """``logging`` itself, or ``logging.getLogger(...)``."""
    if isinstance(node, ast.Name):
        return node.id == "logging"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger" and _is_stdlib(node.func.value))


def _formats(message: ast.expr) -> bool:
    """Whether ``message`` builds its text from values (f-string, ``%``, ``.format``)."""
    if isinstance(message, ast.JoinedStr):
        return True
    if isinstance(message, ast.BinOp) and isinstance(message.op, ast.Mod):
        return True
    return (isinstance(message, ast.Call) and isinstance(message.func, ast.Attribute)
            and message.func.attr == "format")


def problems_in(source: str) -> list[str]:
    """What in one module's ``source`` is not structlog-style logging, one line each."""
    found = []
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and t.id in LOGGER_NAMES]
            value = node.value
            if names and not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                              and value.func.id == "key_value_logger"):
                found.append(f"line {node.lineno}: {names[0]} = {ast.unparse(value)} "
                             f"(use key_value_logger(name))")
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        method, receiver = call.func.attr, call.func.value
        if method not in LEVEL_METHODS | {"log"}:
            continue
        if _is_stdlib(receiver):
            found.append(f"line {call.lineno}: {ast.unparse(call.func)}() on the standard logger")
            continue
        if not _is_logger(receiver):
            continue
        first_text = 1 if method == "log" else 0  # log.log(level, message, ...)
        positional = call.args[first_text:]
        if len(positional) > 1:
            found.append(f"line {call.lineno}: {ast.unparse(call.func)}() with %-style "
                         f"arguments (pass them as key-values)")
        elif positional and _formats(positional[0]):
            found.append(f"line {call.lineno}: {ast.unparse(call.func)}() formats its message "
                         f"(pass the values as key-values)")
    return found


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_module_logs_structlog_style() -> None:
    wrong: list[str] = []
    for path in _modules():
        name = _relative(path)
        if name in IMPLEMENTATION:
            continue
        problems = problems_in(path.read_text(encoding="utf-8"))
        wrong += [f"{name}: {problem}" for problem in problems]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("source", "expected"), [
    ('log = logging.getLogger("x")\n', "use key_value_logger"),
    ('log.info("took %.1fs", elapsed)\n', "%-style arguments"),
    ('self.log.warning("failed %s", exc, exc_info=True)\n', "%-style arguments"),
    ('log.log(20, "took %.1fs", elapsed)\n', "%-style arguments"),
    ('log.info(f"took {elapsed}s")\n', "formats its message"),
    ('log.info("took %s" % elapsed)\n', "formats its message"),
    ('logging.getLogger("x").info("took")\n', "on the standard logger"),
    ('logging.warning("took")\n', "on the standard logger"),
])
def test_the_check_finds_the_old_style(source: str, expected: str) -> None:
    [problem] = problems_in(source)
    assert expected in problem


def test_the_check_accepts_key_values() -> None:
    assert problems_in(
        'log = key_value_logger("sharedstream.stream")\n'
        'log.info("shared stream started", stream=key, ack_mode=mode)\n'
        'log.log(level, event, entity=entity)\n'
        'log.exception("poll failed", stream=key)\n'
        '_sdk = logging.getLogger("azure.servicebus")\n'
        '_sdk.setLevel(logging.WARNING)\n'
    ) == []
