"""The triggerer configuration the end-to-end benchmarks run the in-process triggerer with."""

from __future__ import annotations

import os
from pathlib import Path

from sharedstream.runtime.config import Config, load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.store.sqlite import SqliteStore

BENCH_ENVIRONMENT = {
    "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "10",
    "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.2",
    "SHAREDSTREAM__TRIGGERER__SHUTDOWN_TIMEOUT": "15",
}
"""A short ack timeout, quick restarts: the overrides every benchmarked triggerer runs with
(in process, :func:`make_config`; as processes, ``scale_out.py``)."""


def make_config(workdir: Path) -> Config:
    """A fresh config and SQLite store in ``workdir``, with :data:`BENCH_ENVIRONMENT`."""
    path = workdir / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///sharedstream.db")
    config = load_config(path, environ={**os.environ, **BENCH_ENVIRONMENT})
    with SqliteStore(config.sqlite_path()) as store:  # what `sharedstream init` does
        store.migrate()
    return config
