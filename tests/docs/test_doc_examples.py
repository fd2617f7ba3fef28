"""Execute every ``python`` code block of the user documentation.

Each fenced block opened with three backticks and ``python`` in ``docs/`` is
a complete little program: it is compiled under the name of its page, with
its line numbers kept, and executed in a fresh namespace. Examples check
what they show with ``assert``, so a page whose example drifts away from the
engine fails here. Code that is only an illustration is fenced as ``text``
instead; a block fenced in any other python-like way (``py``, ``python3``,
``pycon``) fails the suite, so no example escapes execution unnoticed.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

PAGES = (
    "index.md",
    "concepts.md",
    "writing-triggers.md",
    "writing-producers.md",
    "configuration.md",
    "runtime.md",
    "sqs.md",
    "testing.md",
    "pubsub.md",
    "servicebus.md",
    "postgresql.md",
    "airflow.md",
    "schedules.md",
    "connections.md",
    "traces.md",
    "dispatch.md",
    "replay.md",
)
"""The pages whose examples this suite owns."""

README = "../README.md"
"""The project's front page: its examples run too (its links are the repository's, not
checked here)."""

MAX_SECONDS = 5.0
"""Generous ceiling per example; each one is written to finish in well under a second."""
PAGE_SECONDS = {"servicebus.md": 10.0, "replay.md": 30.0}
"""Pages whose examples cannot be that quick: the Service Bus SDK takes ~0.5 s to open
each sender or receiver (about 4 s for the page's example); the replay page runs a Kafka
broker, two triggerers one after the other and six CLI commands (about 14 s)."""

PAGE_MARKS = {"servicebus.md": (pytest.mark.filterwarnings("ignore::ResourceWarning"),)}
"""The Service Bus SDK may leave a socket for the collector to finalize (see
``tests/servicebus/conftest.py``): its warning is not the example's fault."""

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_ODD_FENCE = re.compile(r"^(?:[ \t]+(?:```|~~~)|~~~)[ \t]*(?P<info>\S*)")
_PYTHON_LIKE = re.compile(r"^(py|python\d*|pycon|ipython)\b")
_LINK = re.compile(r"\]\((?P<target>[^)#\s]*?(?:\.md)?)(?:#(?P<anchor>[^)\s]*))?\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.+?)[ \t]*$", re.MULTILINE)


def _anchors(page: str) -> set[str]:
    """The heading anchors of ``page``, slugged the way GitHub renders them."""
    text = _FENCE.sub("", (DOCS / page).read_text(encoding="utf-8"))
    return {
        re.sub(r"[^\w\- ]", "", match["title"].lower()).replace(" ", "-")
        for match in _HEADING.finditer(text)
    }


def _fences(page: str) -> list[tuple[str, int, str]]:
    """``(info string, first body line, body)`` of every fenced block on ``page``.

    A missing page has no blocks; :func:`test_every_page_exists_and_has_examples`
    reports it instead of the whole module failing to collect.
    """
    path = DOCS / page
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    return [
        (match["info"].strip(), text.count("\n", 0, match.start("body")) + 1, match["body"])
        for match in _FENCE.finditer(text)
    ]


def _examples() -> list[Any]:
    params: list[Any] = []
    for page in (*PAGES, README):
        blocks = [b for b in _fences(page) if b[0].split(" ", 1)[0] == "python"]
        for number, (_, line, body) in enumerate(blocks, 1):
            params.append(pytest.param(
                page, line, body, marks=PAGE_MARKS.get(page, ()), id=f"{page}#{number}@L{line}",
            ))
    return params


EXAMPLES = _examples()


@pytest.mark.parametrize(("page", "line", "body"), EXAMPLES)
def test_example_runs(page: str, line: int, body: str) -> None:
    """The example runs to completion and every assertion in it holds."""
    # Pad with blank lines so tracebacks point at the line in the markdown page.
    code = compile("\n" * (line - 1) + body, str(DOCS / page), "exec")
    namespace: dict[str, Any] = {"__name__": f"docs_example_{Path(page).stem.replace('-', '_')}"}
    here = os.getcwd()
    started = time.monotonic()
    exec(code, namespace)  # noqa: S102 - the documentation's own examples, by design
    elapsed = time.monotonic() - started
    # A chdir into a directory the example then removes breaks every later test.
    assert os.getcwd() == here, f"{page}:{line} changed the working directory"
    limit = PAGE_SECONDS.get(page, MAX_SECONDS)
    assert elapsed < limit, f"{page}:{line} took {elapsed:.2f}s; keep examples fast"


def test_every_page_exists_and_has_examples() -> None:
    """Every page exists, and all but the landing page carry runnable examples."""
    absent = [page for page in PAGES if not (DOCS / page).is_file()]
    assert not absent, f"missing pages: {absent}"
    counts = dict.fromkeys((*PAGES, README), 0)
    for param in EXAMPLES:
        counts[param.values[0]] += 1
    missing = [page for page, count in counts.items() if page != "index.md" and not count]
    assert not missing, f"pages without a runnable example: {missing}"


@pytest.mark.parametrize("page", [*PAGES, README])
def test_no_python_block_escapes_execution(page: str) -> None:
    """A python-looking fence the extractor does not run would silently go untested."""
    for info, line, _ in _fences(page):
        language = info.split(" ", 1)[0]
        assert language == "python" or not _PYTHON_LIKE.match(language), (
            f"{page}:{line}: fence ```{info}``` is not executed; use ```python or ```text"
        )
    path = DOCS / page
    if not path.is_file():
        return
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = _ODD_FENCE.match(text)
        assert fence is None or not _PYTHON_LIKE.match(fence["info"]), (
            f"{page}:{number}: indented or ~~~ python fences are not executed; "
            "start the fence with ```python at the beginning of the line"
        )


@pytest.mark.parametrize("page", PAGES)
def test_links_between_pages_resolve(page: str) -> None:
    """Links to the pages of this suite, and to their headings, resolve."""
    path = DOCS / page
    if not path.is_file():
        pytest.skip(f"{page} does not exist (reported by the page check)")
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))  # code is not prose
    for match in _LINK.finditer(text):
        target = match["target"] or page  # "(#anchor)" points into this page
        if "://" in target or Path(target).name not in PAGES:
            continue  # external, or a page owned elsewhere (benchmarks.md)
        assert (DOCS / target).is_file(), f"{page} links to missing {target}"
        anchor = match["anchor"]
        assert not anchor or anchor in _anchors(target), (
            f"{page} links to missing {target}#{anchor}"
        )
