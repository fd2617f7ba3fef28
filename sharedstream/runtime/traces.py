"""The triggerer's tracer provider, from the ``[traces]`` section.

``enabled = false`` (the default): no provider, no spans, nothing imported.
Otherwise the ``exporter`` says where spans go:

* ``otlp`` - OpenTelemetry's own SDK with a batching OTLP/HTTP exporter (the
  ``ops`` extra installs it), configured by the standard ``OTEL_*``
  environment variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), headers, timeouts;
  ``OTEL_SERVICE_NAME`` names the service (``sharedstream-triggerer`` when
  unset);
* ``console`` - the same SDK printing each finished span as JSON on standard
  output (for trying it out);
* ``global`` - whatever provider the process already has
  (``opentelemetry.trace.get_tracer_provider()``), for a host that set one
  up itself, such as ``opentelemetry-instrument``.

:func:`open_tracer_provider` returns the provider and a function that
flushes and shuts down what it created (``None`` for ``global``). A missing
exporter package is a :class:`TracesUnavailable` naming the extra to
install: the triggerer refuses to start rather than run without the traces
it was asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.config import TracesConfig

__all__ = ["DEFAULT_SERVICE_NAME", "TracesUnavailable", "open_tracer_provider"]

DEFAULT_SERVICE_NAME = "sharedstream-triggerer"
"""``service.name`` of the spans when ``OTEL_SERVICE_NAME`` does not say."""


class TracesUnavailable(SharedStreamError):
    """Traces were asked for and the package that exports them is not installed."""


def open_tracer_provider(
    config: TracesConfig,
) -> tuple[TracerProvider | None, Callable[[], None] | None]:
    """The provider ``config`` asks for (``None`` when off) and what shuts it down, if ours."""
    if not config.enabled:
        return None, None
    if config.exporter == "global":
        return trace.get_tracer_provider(), None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError as exc:
        raise TracesUnavailable(
            "[traces] enabled needs the OpenTelemetry SDK: pip install 'sharedstream[ops]'"
        ) from exc
    exporter: SpanExporter
    if config.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise TracesUnavailable(
                "[traces] exporter = \"otlp\" needs the OTLP exporter: "
                "pip install 'sharedstream[ops]' (or set exporter = \"console\" or \"global\")"
            ) from exc
        exporter = OTLPSpanExporter()
    name = os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    provider = SdkTracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, provider.shutdown
