"""``sharedstream status``: the operations overview in a terminal, from the endpoint or the store.

With ``[api] enabled`` (or ``--url``), the overview is the running
triggerer's ``/status`` (:mod:`sharedstream.runtime.api`): live streams,
lanes, lag, the brokers' own backlog and every watcher's counts. When no endpoint is configured, or
it does not answer within :data:`ENDPOINT_TIMEOUT` seconds, the overview is
read from the store instead (one line on stderr says why): the watchers
with their stored counts and last errors, the triggerers, recent dead
letters and DAG runs - everything but the live parts. ``--json`` prints
the same document as JSON; the text form is what :func:`render` returns.

Pure reads: nothing here changes the store or the triggerer.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sharedstream.runtime.cli_output import time_text
from sharedstream.runtime.config import Config
from sharedstream.runtime.ops_view import RECENT, letter_record, run_record, trigger_record
from sharedstream.store import MetadataStore, redact_url

__all__ = ["ENDPOINT_TIMEOUT", "endpoint_url", "fetch_status", "from_endpoint", "from_store",
           "render"]

ENDPOINT_TIMEOUT = 3.0
"""Seconds ``status`` waits for the endpoint before reading the store instead."""

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 - listening addresses, mapped


def endpoint_url(config: Config) -> str | None:
    """``http://host:port`` of the configured endpoint, ``None`` when ``[api]`` is off.

    A wildcard listening address (``0.0.0.0``, ``::``) is reached on loopback.
    """
    if not config.api.enabled:
        return None
    host = _WILDCARDS.get(config.api.host, config.api.host)
    return f"http://[{host}]:{config.api.port}" if ":" in host else (
        f"http://{host}:{config.api.port}")


def from_endpoint(base: str, timeout: float = ENDPOINT_TIMEOUT) -> dict[str, Any]:
    """The endpoint's ``/status`` document, with ``"source"`` added.

    Raises ``OSError`` (``URLError`` included) if it does not answer with it.
    """
    url = base.rstrip("/") + "/status"
    if not url.startswith(("http://", "https://")):
        raise OSError(f"not an http(s) URL: {base}")
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - checked above
        status: dict[str, Any] = json.load(response)
    status["source"] = f"endpoint {base}"
    return status


def from_store(store: MetadataStore, config: Config) -> dict[str, Any]:
    """The overview the store alone can give (no live streams, lag or readiness)."""
    now = datetime.now(UTC)
    threshold = config.triggerer.triggerer_health_check_threshold
    return {
        "source": f"store {redact_url(config.store.url)}",
        "triggerers": [{"id": row.id, "host": row.hostname, "pid": row.pid,
                        "alive": row.alive(now, threshold),
                        "heartbeat_at": row.heartbeat_at.isoformat(),
                        "running": list(row.running)} for row in store.triggerers()],
        "streams": [],
        "watchers": [trigger_record(row) for row in store.list_triggers()],
        "dead_letters": [letter_record(row) for row in store.dead_letters(RECENT)],
        "dag_runs": [run_record(row) for row in store.list_runs(limit=RECENT)],
        "errors": {},
    }


def _table(title: str, columns: Sequence[str], rows: list[list[Any]]) -> list[str]:
    lines = ["", title]
    if not rows:
        return [*lines, "  (none)"]
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines.append("  " + "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths,
                                                                        strict=True)).rstrip())
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return lines


def _when(value: str | None) -> str | None:
    """A status's time (ISO 8601 in its JSON) as people read it: :func:`time_text`."""
    return None if value is None else time_text(value)


def _cell(value: Any, width: int = 60) -> str:
    text = "-" if value is None else ",".join(map(str, value)) if isinstance(value, list) else (
        str(value))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render(status: dict[str, Any]) -> str:
    """The overview as text: a header, then streams, watchers, dead letters and DAG runs."""
    lines = [f"source: {status['source']}"]
    ready = status.get("ready")
    if ready is not None:
        failed = [f"{name} ({check['detail']})" for name, check in ready.items()
                  if not check["ok"]]
        lines.append("ready: " + ("yes" if not failed else "NO - " + "; ".join(failed)))
    triggerer = status.get("triggerer")
    if triggerer is not None:
        lines.append(f"triggerer: {triggerer['id']}, {triggerer['triggers_running']} triggers "
                     f"running, intake {_cell(triggerer['intake'])}")
    totals = status.get("totals")
    if totals is not None:
        lines.append("totals: " + ", ".join(f"{key.replace('_', ' ')} {value}"
                                            for key, value in totals.items()))
    for part, error in status.get("errors", {}).items():
        lines.append(f"({part} not read: {error})")
    if "triggerers" in status:
        lines += _table("TRIGGERERS", ["id", "host", "pid", "alive", "heartbeat_at", "running"],
                        [[t["id"], t["host"], t["pid"], t["alive"], _when(t["heartbeat_at"]),
                          t["running"]] for t in status["triggerers"]])
    if "totals" in status:  # live: the endpoint answered
        lines += _table("STREAMS", ["stream", "live", "connected", "outstanding",
                                    "oldest_age_s", "lanes"],
                        [[s["stream"], s["live"], s["connected"], s["outstanding"],
                          round(s["oldest_unresolved_age"], 1),
                          [f"{lane['lane']}:{lane['outstanding']}" for lane in s["lanes"]]]
                         for s in status["streams"]])
        lines += _table("BROKER BACKLOG", ["stream", "lane", "backlog", "age_s", "detail"],
                        [row for s in status["streams"] for row in _backlog_rows(s)])
        lines += _table("LIVE WATCHERS", ["stream", "watchers", "queued", "seen", "skipped",
                                          "emitted", "rejected", "failed", "last_reject"],
                        [[s["stream"], w["names"] or w["trigger"], w["queued"], w["seen"],
                          w.get("skipped", "-"), w["emitted"], w["rejected"], w["failed"],
                          w["last_reject"]]
                         for s in status["streams"] for w in s["watchers"]])
    lines += _table("WATCHERS", ["trigger", "watchers", "state", "events_stored", "errors",
                                 "last_error"],
                    [[w["trigger"], w["names"], w["state"], w["events_stored"], w["errors"],
                      w["last_error"]] for w in status["watchers"]])
    lines += _table("RECENT DEAD LETTERS", ["id", "at", "stream", "source", "reason"],
                    [[d["id"], _when(d["at"]), d["stream"], d["source"], d["reason"]]
                     for d in status["dead_letters"]])
    if status.get("dispatch"):
        lines += _table("DISPATCH", ["target", "delivering", "queued", "dispatching",
                                     "at_target", "succeeded", "failed", "undeliverable",
                                     "last_error"],
                        [[t["target"] or "(no target)", f"{t['delivering']}/{t['capacity']}",
                          t["queued"], t["dispatching"], t["at_target"], t["succeeded"],
                          t["failed"], t["undeliverable"], t["last_error"]]
                         for t in status["dispatch"]])
    lines += _table("RECENT DAG RUNS", ["dag", "run_id", "state", "at", "target", "assets"],
                    [[r["dag"], r["run_id"], r["state"], _when(r["at"]), r.get("target"),
                      r["assets"]] for r in status["dag_runs"]])
    return "\n".join(lines) + "\n"


def _backlog_rows(stream: dict[str, Any]) -> list[list[Any]]:
    """A stream's broker backlog as table rows: one per lane, or one saying why there is none.

    Never a 0 the broker did not say: ``n/a`` (it cannot tell), ``unknown``
    (its last answer failed), ``pending`` (not asked yet).
    """
    backlog = stream.get("broker_backlog")
    if backlog is None:  # an endpoint of an older version
        return []
    if backlog["state"] != "ok" or not backlog["lanes"]:
        state = backlog["state"] if backlog["state"] != "ok" else "no lanes"
        return [[stream["stream"], None, state, backlog["age_seconds"], backlog["detail"]]]
    return [[stream["stream"], lane["lane"],
             ", ".join(f"{kind} {n}" for kind, n in lane.items() if kind != "lane"),
             backlog["age_seconds"], None] for lane in backlog["lanes"]]


def fetch_status(config: Config, url: str | None, open_store: Any) -> tuple[dict[str, Any],
                                                                           str | None]:
    """The overview and, when it had to fall back to the store, why.

    ``url`` (``--url``) wins over ``[api]``; ``open_store()`` opens the
    migrated store (the CLI's), closed here after reading.
    """
    base = url or endpoint_url(config)
    note = None
    if base is not None:
        try:
            return from_endpoint(base), None
        except (OSError, ValueError) as exc:  # unreachable (URLError is an OSError), or not JSON
            note = f"the endpoint {base} did not answer ({exc}); reading the store instead"
    with open_store() as store:
        return from_store(store, config), note

