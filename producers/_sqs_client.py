"""SQS: the SDK, loaded lazily, and the aiobotocore client every SQS caller uses.

Private to :mod:`sharedstream.producers.sqs`, which re-exports
:func:`sqs_client` (import it from there). aiobotocore is imported only
when a client is made (:data:`SDK`): without the ``sqs`` extra, the
producer's constructor says how to install it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sharedstream import __version__
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.producers._sqs_types import SqsConfigError, SqsSettings

__all__ = ["SDK", "sqs_client"]

SDK = OptionalSdk(broker="SQS", package="aiobotocore", extra="sqs", error=SqsConfigError)
"""aiobotocore and botocore, imported on first use; a missing extra is a :class:`SqsConfigError`."""


def sqs_client(settings: SqsSettings) -> contextlib.AbstractAsyncContextManager[Any]:
    """An aiobotocore SQS client of ``settings``: an async context manager, no I/O until entered.

    The producer's, its re-drives' and ``sharedstream send``'s: botocore's
    standard retries (``settings.retries``), a 5 s connect timeout, a read
    timeout above the long poll, a connection pool for the concurrent calls.
    """
    s = settings
    session = SDK("aiobotocore.session").get_session()
    config = SDK("aiobotocore.config").AioConfig(**{
        "connect_timeout": 5,
        "read_timeout": s.wait_time_seconds + 10,
        "retries": {"mode": "standard", "max_attempts": s.retries + 1},
        "max_pool_connections": s.receive_concurrency + s.delete_concurrency + 4,
        # Two per-request costs the SDK pays in Python on every call, about a
        # fifth of its CPU per call together: checking the request against
        # the model (ours are built here from validated settings) and
        # rebuilding the User-Agent header twice (a fixed one instead).
        "parameter_validation": False,
        "user_agent": f"sharedstream/{__version__} aiobotocore/{SDK().__version__}",
        **dict(s.client_config),
    })
    extra: dict[str, Any] = {} if s.verify is None else {"verify": s.verify}
    client: contextlib.AbstractAsyncContextManager[Any] = session.create_client(
        "sqs", region_name=s.region_name, endpoint_url=s.endpoint_url, config=config,
        **dict(s.credentials), **extra,
    )
    return client
