"""Snapshot files of the kit's test servers (``--state-file``): read whole, replaced atomically.

Both test servers that keep their state across a restart (Pub/Sub's and
Service Bus's ``state_file`` modules) write a whole JSON document after
changes. The one invariant kept here: a write replaces the file through a
temporary file renamed over it, so a server killed at any moment leaves the
last complete document, never a partial one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_snapshot", "replace_snapshot"]


def read_snapshot(path: Path) -> Any | None:
    """The JSON document at ``path``; ``None`` when there is no file yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return json.loads(raw)


def replace_snapshot(path: Path, document: Any) -> None:
    """Write ``document`` to ``path`` as compact JSON, replacing the file atomically."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(json.dumps(document, separators=(",", ":")).encode())
    temporary.replace(path)
