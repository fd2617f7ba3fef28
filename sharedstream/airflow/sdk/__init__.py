"""Mirror of ``airflow.sdk``: the names a watcher definitions file uses.

``from airflow.sdk import Asset, AssetWatcher, DAG, dag, task`` ports as
``from sharedstream.airflow.sdk import ...``. The objects are built on
:mod:`sharedstream.runtime.definitions`, which loads such a file:

* :class:`AssetWatcher`, :class:`AssetAll`, :class:`AssetAny` - ours, as is
  (same arguments as Airflow's);
* :class:`Asset` - ours, taking Airflow's ``Asset(name=None, uri=None, *,
  group="asset", extra=None, watchers=())``; one of ``name`` and ``uri``
  stands for the other when only one is given (as in Airflow). Assets are
  identified by ``name`` here;
* :class:`DAG` - ours, taking Airflow's ``DAG(dag_id, ..., schedule=...)``
  and usable as ``with DAG(...) as dag:``. ``schedule``, ``start_date``,
  ``end_date`` and ``catchup`` are forwarded; the arguments that concern
  running tasks (``description``, ``tags``,
  ``default_args``, ``max_active_runs``, ``doc_md``, ``params``, callbacks,
  ...) are accepted and ignored, since sharedstream queues DAG runs and runs
  no tasks; an argument Airflow does not have is a ``TypeError``;
* :func:`dag` - the decorator: calling the decorated function builds the
  :class:`DAG` (named after the function unless ``dag_id`` is given) and
  runs the body inside it;
* :func:`task` - inert (see :mod:`sharedstream.airflow._inert_tasks`);
* :class:`BaseHook` and :class:`Variable` - connections and variables
  (see :mod:`sharedstream.airflow._hooks`);
* :class:`AssetTriggeredTimetable` - Airflow 3.4's: ``DAG(schedule=
  AssetTriggeredTimetable(assets, batch_asset_events=True))`` schedules on
  ``assets`` with that batching (see
  :class:`sharedstream.timetables.assets.AssetTriggeredTimetable`).
  3.4's ``AssetAndTimeSchedule`` is not offered.

Differences are listed in ``docs/airflow.md``.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from sharedstream.airflow._hooks import BaseHook, Variable
from sharedstream.airflow._inert_tasks import task
from sharedstream.runtime.definitions import Asset as _Asset
from sharedstream.runtime.definitions import (
    AssetAll,
    AssetAny,
    AssetWatcher,
    Dag,
    DefinitionsError,
)
from sharedstream.timetables.assets import AssetTriggeredTimetable

__all__ = ["DAG", "Asset", "AssetAll", "AssetAny", "AssetTriggeredTimetable", "AssetWatcher",
           "BaseHook", "Variable", "dag", "task"]

IGNORED_DAG_ARGUMENTS = frozenset({
    "description", "default_args", "tags", "max_active_runs", "max_active_tasks",
    "max_consecutive_failed_dag_runs", "dagrun_timeout", "doc_md", "params", "owner_links",
    "access_control", "is_paused_upon_creation", "render_template_as_native_obj",
    "template_searchpath", "template_undefined", "user_defined_macros", "user_defined_filters",
    "jinja_environment_kwargs", "on_success_callback", "on_failure_callback",
    "sla_miss_callback", "fail_fast", "fail_stop", "dag_display_name", "auto_register",
    "deadline", "disable_bundle_versioning", "default_view", "orientation",
})
"""Airflow ``DAG`` arguments accepted and ignored: they concern running tasks or the UI."""


class Asset(_Asset):
    """Our :class:`~sharedstream.runtime.definitions.Asset` with Airflow's signature.

    ``uri``, ``group`` and ``extra`` are kept as attributes; the asset is
    identified by ``name`` (``uri`` when no name is given).
    """

    def __init__(
        self,
        name: str | None = None,
        uri: str | None = None,
        *,
        group: str = "asset",
        extra: Mapping[str, Any] | None = None,
        watchers: Sequence[AssetWatcher] = (),
    ) -> None:
        if name is None and uri is None:
            raise DefinitionsError("Asset needs a name or a uri")
        super().__init__(name if name is not None else str(uri), watchers=watchers)
        self.uri = uri if uri is not None else self.name
        self.group = group
        self.extra = dict(extra or {})


class DAG(Dag):
    """Our :class:`~sharedstream.runtime.definitions.Dag` with Airflow's signature.

    ``schedule``, ``start_date``, ``end_date`` and ``catchup`` are forwarded
    (see the parent for what each may be); the arguments in
    :data:`IGNORED_DAG_ARGUMENTS` are accepted and ignored. ``with DAG(...) as
    dag:`` gives the DAG; what its body declares (tasks) is inert.
    """

    def __init__(
        self,
        dag_id: str,
        description: str | None = None,
        *,
        schedule: Any = None,
        start_date: dt.datetime | None = None,
        end_date: dt.datetime | None = None,
        catchup: bool = False,
        **arguments: Any,
    ) -> None:
        unknown = sorted(set(arguments) - IGNORED_DAG_ARGUMENTS)
        if unknown:
            raise TypeError(f"DAG {dag_id!r}: unexpected arguments {', '.join(unknown)}")
        super().__init__(dag_id, schedule=schedule, start_date=start_date, end_date=end_date,
                         catchup=catchup)
        self.description = description

    def __enter__(self) -> DAG:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


def dag(
    dag_id: str | Callable[..., Any] | None = None, /, **arguments: Any
) -> Callable[..., Any]:
    """``@dag(...)`` or ``@dag``: calling the decorated function builds a :class:`DAG`.

    The DAG's id is ``dag_id`` (first argument or keyword) or the
    function's name; the body runs inside ``with DAG(...)`` and its tasks
    are inert. Returns the built :class:`DAG`.
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., DAG]:
        given = arguments.pop("dag_id", None) if not isinstance(dag_id, str) else dag_id

        @functools.wraps(function)
        def build(*args: Any, **kwargs: Any) -> DAG:
            with DAG(given or function.__name__, **arguments) as built:
                function(*args, **kwargs)
            return built

        return build

    if callable(dag_id):
        return decorate(dag_id)
    return decorate
