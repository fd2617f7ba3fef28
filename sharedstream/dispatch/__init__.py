"""Dispatch: queued DAG runs handed from the store to something that runs them.

The store is the outbox (:mod:`sharedstream.store.outbox`); the
:class:`~sharedstream.dispatch.dispatcher.Dispatcher` in each triggerer
claims runs and hands them to their DAG's target; target types are plugins
(:mod:`sharedstream.dispatch.target`, entry point group
``sharedstream.targets``): ``command`` (the built-in ``local``, runs each
DAG's ``run=`` here), ``webhook`` and ``airflow``.
"""

from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import (
    LOCAL_TARGET,
    Delivery,
    Target,
    TargetConfigError,
    TargetContext,
    TargetError,
    TargetOption,
)

__all__ = [
    "LOCAL_TARGET",
    "Delivery",
    "EventDocument",
    "RunDocument",
    "Target",
    "TargetConfigError",
    "TargetContext",
    "TargetError",
    "TargetOption",
]
