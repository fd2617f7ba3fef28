"""The ``command`` target: run each DAG run here, as a Python callable or a command.

The built-in target ``local`` is one of these: with no orchestrator at all,
a DAG's runs *run*. What runs is the DAG's ``run=`` in the definitions file,
else the target's ``command`` option:

* a **callable** ``run(document)`` (a function or a coroutine function)
  gets the :class:`~sharedstream.dispatch.document.RunDocument`; it runs
  on a worker thread (a coroutine function: on the event loop). Returning
  ends the run ``success`` (a returned string is kept as its output);
  raising ends it ``failed``, with the exception as its detail and the
  traceback as its output.
* a **command line** (a list of strings, no shell) runs in a process
  group of its own with the run document as JSON on its standard input;
  an argument ``{run_file}`` is replaced by the path of a file holding the
  same JSON. It also gets ``SHAREDSTREAM_DAG_ID``, ``SHAREDSTREAM_RUN_ID``,
  ``SHAREDSTREAM_RUN_TYPE``, ``SHAREDSTREAM_ATTEMPT`` and (when the run has
  one) ``TRACEPARENT`` in its environment. Exit status 0 is ``success``,
  anything else ``failed``; standard output and error are captured
  together, their last ``output_limit`` characters kept.

``timeout`` (default one hour) bounds a run: a command's process group is
sent SIGTERM, then SIGKILL five seconds later, and the run is ``failed``; a
callable is ``failed`` too, but a function on a worker thread cannot be
stopped and finishes in the background (a coroutine function is cancelled).

Guarantee: at least once. A run is repeated only if the triggerer stopped
after starting it and before recording its end; what runs gets the run's
identity (``SHAREDSTREAM_RUN_ID``, ``document.run_id``) to notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sharedstream.dispatch.document import RunDocument
from sharedstream.dispatch.target import Delivery, Target, TargetError, TargetOption

__all__ = ["RUN_FILE", "CommandTarget"]

RUN_FILE = "{run_file}"
"""The argument a command line writes to get the run document's path."""

_KILL_GRACE = 5.0


class CommandTarget(Target):
    """Runs DAG runs in this process or as child processes (see the module docstring)."""

    options: ClassVar[dict[str, TargetOption]] = {
        "command": TargetOption(
            "argv", None, "The command line of DAGs that have no run= of their own "
            '(["python", "job.py"]); the run document comes on standard input.', per_dag=True),
        "output_limit": TargetOption(
            "int", 65536, "Characters of a command's output kept (its end).", minimum=0),
    }
    default_concurrency = 4
    default_timeout = 3600.0

    def _runnable(self, dag_id: str) -> object:
        runnable = self.context.runnables.get(dag_id) or self.settings.get("command")
        if runnable is None:
            raise TargetError(f"DAG {dag_id!r} has nothing to run here: give it run= in the "
                              f"definitions file, or the target {self.name!r} a command",
                              retryable=False)
        return runnable

    async def deliver(self, run: RunDocument, progress: Callable[[str], None]) -> Delivery:
        """Run it to its end; ``success`` or ``failed`` (see the module docstring)."""
        runnable = self._runnable(run.dag_id)
        progress("running")
        if callable(runnable):
            return await self._call(runnable, run)
        if isinstance(runnable, Sequence) and not isinstance(runnable, str):
            return await self._execute([str(part) for part in runnable], run)
        raise TargetError(f"DAG {run.dag_id!r}: run= must be a callable or a command line, got "
                          f"{type(runnable).__name__}", retryable=False)

    async def _call(self, function: Callable[..., Any], run: RunDocument) -> Delivery:
        try:
            async with asyncio.timeout(self.timeout):
                if inspect.iscoroutinefunction(function):
                    returned = await function(run)
                else:
                    returned = await asyncio.to_thread(function, run)
        except TimeoutError:
            return Delivery("failed", detail=f"did not finish within {self.timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - the user's code failed: that is the run's outcome
            first = str(exc).splitlines()[0] if str(exc) else ""
            return Delivery("failed", detail=f"{type(exc).__name__}: {first}".rstrip(": "),
                            output=self._cut("".join(traceback.format_exception(exc))))
        return Delivery("success", output=self._cut(returned) if isinstance(returned, str)
                        else None)

    async def _execute(self, argv: list[str], run: RunDocument) -> Delivery:
        body = json.dumps(run.to_json()).encode()
        if RUN_FILE not in argv:
            return await self._spawn(argv, body, run)
        with tempfile.NamedTemporaryFile("wb", prefix="sharedstream-run-",
                                         suffix=".json") as handle:
            handle.write(body)
            handle.flush()
            path = Path(handle.name).as_posix()
            return await self._spawn([path if part == RUN_FILE else part for part in argv],
                                     body, run)

    async def _spawn(self, argv: list[str], body: bytes, run: RunDocument) -> Delivery:
        env = {**os.environ, "SHAREDSTREAM_DAG_ID": run.dag_id, "SHAREDSTREAM_RUN_ID": run.run_id,
               "SHAREDSTREAM_RUN_TYPE": run.run_type, "SHAREDSTREAM_ATTEMPT": str(run.attempt)}
        if run.trace_parent:
            env["TRACEPARENT"] = run.trace_parent
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            raise TargetError(f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                              retryable=False) from exc
        output = bytearray()
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.gather(self._feed(process, body), self._drain(process, output))
                code = await process.wait()
        except TimeoutError:
            await _stop_group(process)
            return Delivery("failed", detail=f"did not finish within {self.timeout:g} s; "
                            "stopped", output=self._text(output))
        except BaseException:
            await _stop_group(process)  # cancelled (a shutdown): the run is recovered later
            raise
        text = self._text(output)
        if code == 0:
            return Delivery("success", output=text)
        last = next((line for line in reversed((text or "").splitlines()) if line.strip()), "")
        why = f"exit status {code}" if code > 0 else f"killed by signal {-code}"
        return Delivery("failed", detail=f"{why}: {last}" if last else why, output=text)

    @staticmethod
    async def _feed(process: asyncio.subprocess.Process, body: bytes) -> None:
        if process.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it need not read
            process.stdin.write(body)
            await process.stdin.drain()
        process.stdin.close()

    async def _drain(self, process: asyncio.subprocess.Process, output: bytearray) -> None:
        """Read everything it prints, keeping only the last ``output_limit`` bytes."""
        limit = int(self.settings["output_limit"])
        if process.stdout is None:
            return
        while chunk := await process.stdout.read(65536):
            output += chunk
            if len(output) > limit:
                del output[: len(output) - limit]

    def _text(self, output: bytearray) -> str | None:
        return output.decode("utf-8", errors="replace") if output else None

    def _cut(self, text: str) -> str:
        limit = int(self.settings["output_limit"])
        return text[-limit:] if limit else ""


async def _stop_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the command's process group, SIGKILL it after a grace period; wait for it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            async with asyncio.timeout(_KILL_GRACE):
                await process.wait()
                return
        except TimeoutError:
            continue
