"""The option tables of ``docs/configuration.md`` match ``sharedstream.runtime.config``.

Every option of every section is listed once, under its section, with the
default the code uses; an option added, renamed or re-defaulted in the code
without the page fails here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.config import (
    ApiConfig,
    Config,
    DispatchConfig,
    LoggingConfig,
    SchedulerConfig,
    StoreConfig,
    TracesConfig,
    TriggererConfig,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SECTIONS: dict[
    str, type[TriggererConfig | StoreConfig | SchedulerConfig | DispatchConfig | LoggingConfig
              | ApiConfig | TracesConfig]
] = {
    "triggerer": TriggererConfig,
    "store": StoreConfig,
    "scheduler": SchedulerConfig,
    "dispatch": DispatchConfig,
    "logging": LoggingConfig,
    "api": ApiConfig,
    "traces": TracesConfig,
}

_ROW = re.compile(r"^\| `(?P<option>[a-z0-9_]+)` \| [^|]+ \| (?P<default>[^|]+?) \|", re.MULTILINE)


def documented(section: str) -> dict[str, str]:
    """``option -> default cell`` of the table under ``### `[section]` ``."""
    text = PAGE.read_text(encoding="utf-8")
    heading = f"\n### `[{section}]`\n"
    assert heading in text, f"configuration.md has no {heading.strip()} table"
    body = text.partition(heading)[2].split("\n#", 1)[0]
    rows = [(m["option"], m["default"]) for m in _ROW.finditer(body)]
    options = [option for option, _ in rows]
    assert len(options) == len(set(options)), f"[{section}] lists an option twice"
    return dict(rows)


def parse_default(cell: str) -> Any:
    """The value a default cell shows: a backquoted TOML-ish literal, or "not set"."""
    if cell == "not set":
        return None
    literal = cell.strip("`")
    return json.loads(literal)


@pytest.mark.parametrize("section", SECTIONS)
def test_every_option_is_documented_with_its_default(section: str) -> None:
    """Names and defaults of the table are the dataclass's fields and defaults."""
    table = documented(section)
    fields = {f.name: f.default for f in dataclasses.fields(SECTIONS[section])}
    assert list(table) == list(fields)
    for option, cell in table.items():
        assert parse_default(cell) == fields[option], f"[{section}] {option}: {cell}"


def test_the_sections_are_all_the_sections() -> None:
    """A new section in ``Config`` needs a table too."""
    assert set(Config().as_dict()) == set(SECTIONS)
