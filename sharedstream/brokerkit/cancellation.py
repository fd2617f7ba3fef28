"""Keeping a task's cancellation across an SDK call that loses it.

A broker SDK may consume a cancellation meant for the task that called it
and carry on as if nothing happened. azure-servicebus 7.15 on Python 3.11
does: its AMQP transport reads each frame under ``asyncio.wait_for``, and
3.11's ``wait_for`` returns the read's result when the frame arrives in the
same loop turn as the cancellation, dropping the ``CancelledError``
(CPython gh-86296, fixed in 3.12). Any number of its other ``wait_for``
calls can do the same, or turn the cancellation into the SDK's own timeout
error. A receive loop that retries on that error then never ends, and
whoever cancelled it waits forever.

:func:`cancellation_kept` is the guard around one such call. Invariants
(each checked in ``tests/unit/test_cancellation_kept.py``):

1. A cancellation requested while the block ran, and still pending when
   it ends (``Task.cancelling()`` higher than on entry: nobody called
   ``uncancel()``), leaves it as ``CancelledError``, whether the block
   returned or raised another exception (that one becomes the cause).
2. A block that was not cancelled ends as it would without the guard:
   its result or exception passes unchanged, nothing else is done.
3. A cancellation the block took in the ordinary way (its own
   ``CancelledError`` propagating) passes unchanged. So does one that a
   ``TaskGroup`` or ``asyncio.timeout`` inside the block requested and
   withdrew (``uncancel``): the count is back where it was.

Because the guard raises ``CancelledError`` proper, an ``asyncio.timeout``
around it turns a deadline the SDK lost into ``TimeoutError``, as it would
have had the SDK not lost it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cancellation_kept"]


@contextmanager
def cancellation_kept() -> Iterator[None]:
    """Raise ``CancelledError`` when the block ends if it lost a cancellation (module docstring).

    Enter it in the task whose cancellation matters (a plain ``with`` in a
    coroutine); outside any task it does nothing. Nested guards each
    compare with the count at their own entry.
    """
    task = asyncio.current_task()
    if task is None:
        yield
        return
    requested = task.cancelling()
    try:
        yield
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if task.cancelling() > requested:
            raise asyncio.CancelledError from exc
        raise
    if task.cancelling() > requested:
        raise asyncio.CancelledError
