"""Git revisions for the benchmarks: which commit ran, and a commit's files exported to run.

Lets a benchmark measure fixed commits (``--ours-rev``, ``revisions.py``)
while the working tree is being edited.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent


def git(*args: str) -> str | None:
    """``git args`` in the repository; its stripped output, or ``None`` if it failed."""
    try:
        proc = subprocess.run(
            ["git", *args], cwd=REPO_DIR, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return proc.stdout.strip()


def working_tree_revision() -> str | None:
    """``HEAD``'s short hash, suffixed ``+dirty`` when ``sharedstream/`` has local changes."""
    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return None
    dirty = git("status", "--porcelain", "--", "sharedstream", "producers", "triggers")
    return head + ("+dirty" if dirty else "")


def export_revision(rev: str, dest: Path, *, paths: Sequence[str] = ()) -> str:
    """Extract ``paths`` (default: the whole tree) as committed at ``rev`` into ``dest``.

    Returns the full hash. ``SystemExit`` with one line when ``rev`` is not a
    commit of the repository.
    """
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    if not sha:
        raise SystemExit(f"{rev!r} is not a commit of {REPO_DIR}")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha, *paths],
        cwd=REPO_DIR, capture_output=True, check=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return sha
