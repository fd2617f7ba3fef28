"""Turning the operations endpoint on: ``[api] enabled``, and the ``ops`` extra it needs.

The endpoint (:mod:`sharedstream.runtime.api`) needs aiohttp and
prometheus-client, which only the ``ops`` extra installs. This module is
what the triggerer imports: it never imports them unless the endpoint is
on, and says in one line which extra is missing when it is.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.ops_base import ObservedTriggerer

if TYPE_CHECKING:  # the ops extra: imported only once it is known to be installed
    from sharedstream.runtime.api import OpsEndpoint

__all__ = ["OPS_EXTRA_MODULES", "OpsExtraMissing", "open_endpoint"]

OPS_EXTRA_MODULES = ("aiohttp", "prometheus_client")
"""What the ``ops`` extra installs, by import name."""


class OpsExtraMissing(SharedStreamError):
    """``[api] enabled = true`` but the ``ops`` extra is not installed (not retryable)."""

    retryable = False


def open_endpoint(triggerer: ObservedTriggerer) -> OpsEndpoint | None:
    """The triggerer's endpoint if ``[api] enabled``, else ``None``; it is not serving yet.

    Called from the triggerer's constructor, so a missing extra stops the
    triggerer before it registers anything: raises :class:`OpsExtraMissing`.
    """
    if not triggerer.config.api.enabled:
        return None
    missing = [name for name in OPS_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise OpsExtraMissing(
            "[api] enabled = true needs the ops extra: pip install 'sharedstream[ops]' "
            f"({', '.join(missing)} not installed)")
    from sharedstream.runtime.api import OpsEndpoint  # noqa: PLC0415 - the ops extra

    return OpsEndpoint(triggerer)
