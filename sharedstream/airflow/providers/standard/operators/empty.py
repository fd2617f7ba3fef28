"""Mirror of ``airflow.providers.standard.operators.empty``: ``EmptyOperator``, inert.

``EmptyOperator(task_id="done")`` in a watcher DAG's body is accepted and
chains with ``>>`` / ``<<``; sharedstream runs no tasks (see
:mod:`sharedstream.airflow._inert_tasks` and ``docs/airflow.md``).
"""

from sharedstream.airflow._inert_tasks import InertTask

__all__ = ["EmptyOperator"]


class EmptyOperator(InertTask):
    """A task that does nothing, in Airflow as here (where no task runs at all)."""
