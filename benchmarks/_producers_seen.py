"""Producers built by a benchmark's generated triggers, so it can read their call counts.

The generated definitions file appends each producer its trigger class
creates; the benchmark reads ``calls`` from them afterwards. This keeps the
measured process free of an OpenTelemetry SDK, which would otherwise record
every instrument of the runtime (the raw loop it is compared with has none).
"""

from __future__ import annotations

from typing import Any

PRODUCERS: list[Any] = []
