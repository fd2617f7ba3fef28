"""Tasks in a DAG body, accepted and never run: sharedstream queues DAG runs, it runs no tasks.

A watcher definitions file written for Airflow declares its DAG's tasks
(``@task`` functions, ``EmptyOperator(task_id=...)``) and their order
(``a >> b``). sharedstream stores asset events and queues DAG runs; executing
tasks is the job of whatever consumes those runs. So that such a file
imports and loads unchanged, this module offers inert stand-ins:

* :class:`InertTask` - built with any arguments, chained with ``>>`` and
  ``<<`` (also with lists), and otherwise inert;
* :func:`task` - the decorator, bare (``@task``) or called
  (``@task(task_id=..., retries=...)``); calling the decorated function
  returns an :class:`InertTask` and never runs its body.

Not mirrored: operator behaviour of any kind (templating, XCom, retries,
``execute``). Nothing here is an Airflow module path (the leading
underscore), so the import rule does not cover it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

__all__ = ["InertTask", "task"]


class InertTask:
    """A task declared in a DAG body: it keeps its ``task_id`` and is never executed."""

    def __init__(self, *args: Any, task_id: str | None = None, **kwargs: Any) -> None:
        self.task_id = task_id
        self.args = args
        self.kwargs = kwargs

    def __rshift__(self, other: Any) -> Any:
        """``self >> other``: ``other`` (so chains read as in Airflow); nothing is recorded."""
        return other

    def __lshift__(self, other: Any) -> Any:
        """``self << other``: ``other``."""
        return other

    def __rrshift__(self, other: Any) -> InertTask:
        """``[a, b] >> self``: ``self``."""
        return self

    def __rlshift__(self, other: Any) -> InertTask:
        """``[a, b] << self``: ``self``."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task_id={self.task_id!r})"


@overload
def task(python_callable: Callable[..., Any], /) -> Callable[..., InertTask]: ...


@overload
def task(
    python_callable: None = None, /, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., InertTask]]: ...


def task(python_callable: Callable[..., Any] | None = None, /, **kwargs: Any) -> Any:
    """``@task`` or ``@task(...)``: the function, when called, declares an inert task.

    The task's id is ``task_id`` when given, else the function's name. The
    function's body never runs (see the module docstring).
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., InertTask]:
        task_id = kwargs.get("task_id") or function.__name__

        @functools.wraps(function)
        def declare(*args: Any, **call_kwargs: Any) -> InertTask:
            return InertTask(*args, task_id=task_id, **call_kwargs)

        return declare

    if python_callable is not None:
        return decorate(python_callable)
    return decorate
