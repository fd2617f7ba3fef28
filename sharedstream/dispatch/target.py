"""The target contract: where DAG runs go, and how a new kind of target plugs in.

A *target type* is a :class:`Target` subclass registered under the entry
point group ``sharedstream.targets`` (``command``, ``webhook`` and
``airflow`` ship with sharedstream); adding one edits no core file. A
*target* is a named, configured instance of a type: the config file's
``[targets.<name>]`` table (``type = "airflow"`` and its options), or the
built-in ``local`` (a ``command`` target that runs each DAG's ``run=``).

Contract of a target, as the dispatcher (:mod:`sharedstream.dispatch.dispatcher`)
uses it:

1. It is built once per triggerer (and once more per distinct set of a
   DAG's ``target_options``) with its validated options; :meth:`Target.open`
   is awaited before the first :meth:`Target.deliver`, :meth:`Target.aclose`
   once at the end, even after a failure.
2. :meth:`Target.deliver` is called at most ``max_concurrency`` times at
   once across every instance of one target name, on the event loop. It
   returns a :class:`Delivery` (the target has the run, or it already ran
   it) or raises :class:`TargetError`: retryable (the dispatcher tries again
   later, with backoff, up to ``max_attempts``) or not (the run is
   ``undeliverable`` at once). Anything else it raises is a bug of the
   target: logged with its traceback and retried like a retryable error.
3. Delivery is at least once: a crash between a delivery and its record
   repeats it. A target that can find out whether it already has the run
   (the run's identity is :attr:`RunDocument.idempotency_key`; a repeat has
   ``recovered`` or ``attempt > 1``) makes that effectively once; it says
   what it guarantees in its docs.
4. :meth:`Target.status` (only when :attr:`Target.follows`) tells what
   became of a run it accepted (``running``, ``success``, ``failed``), or
   ``None`` when nothing new is known; it raises :class:`TargetError` when
   the target cannot be asked now (tried again at the next follow-up).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from sharedstream.connections import Connection
from sharedstream.dispatch.document import RunDocument
from sharedstream.engine.errors import SharedStreamError

__all__ = [
    "COMMON_OPTIONS",
    "ENTRY_POINT_GROUP",
    "LOCAL_TARGET",
    "Delivery",
    "Target",
    "TargetConfigError",
    "TargetContext",
    "TargetError",
    "TargetOption",
    "check_options",
    "target_type",
    "target_types",
]

ENTRY_POINT_GROUP = "sharedstream.targets"
"""The entry point group a target type registers under (its name is the ``type``)."""

LOCAL_TARGET = "local"
"""The built-in target (type ``command``) that runs each DAG's ``run=``."""


class TargetError(SharedStreamError):
    """A delivery failed; ``retryable`` says whether trying again later can help.

    The message is one line the store keeps as the attempt's detail (an
    HTTP status and the answer's first line, a connection error).
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(" ".join(message.split()))
        self.retryable = retryable


class TargetConfigError(SharedStreamError):
    """A target's configuration is wrong: unknown type or option, bad value. Not retryable."""

    retryable = False


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a target did with a run: its state there, and what to remember of it.

    ``state`` is ``dispatched`` (the target has it and will run it),
    ``running``, ``success`` or ``failed`` (it ran). ``detail`` is one line
    worth keeping (the answer, why it failed); ``external_id`` /
    ``external_url`` the target's own name of the run; ``output`` what a
    local command printed.
    """

    state: Literal["dispatched", "running", "success", "failed"]
    detail: str | None = None
    external_id: str | None = None
    external_url: str | None = None
    output: str | None = None


@dataclass(frozen=True, slots=True)
class TargetOption:
    """One option of a target type: its kind, default, help, and whether a DAG may set it.

    Kinds: ``str``, ``int``, ``float``, ``bool``, ``choice`` (one of
    ``choices``), ``argv`` (a non-empty list of strings: a command line).
    ``minimum`` bounds numbers (inclusive). ``per_dag``: a DAG's
    ``target_options`` may override it. ``required``: the target's table
    must set it (there is no sensible default).
    """

    kind: Literal["str", "int", "float", "bool", "choice", "argv"]
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float = -math.inf
    per_dag: bool = False
    required: bool = False


COMMON_OPTIONS: Mapping[str, TargetOption] = {
    "max_concurrency": TargetOption(
        "int", None, "Runs delivered at once by one triggerer (default: the type's).",
        minimum=1),
    "max_attempts": TargetOption(
        "int", 10, "Deliveries tried before a run is undeliverable.", minimum=1),
    "retry_backoff_initial": TargetOption(
        "float", 1.0, "Seconds before the first retry; doubles after each.", minimum=0),
    "retry_backoff_max": TargetOption(
        "float", 300.0, "Longest wait between two attempts, in seconds.", minimum=0),
    "timeout": TargetOption(
        "float", None, "Seconds one delivery may take (default: the type's).", minimum=0.001,
        per_dag=True),
}
"""The options every target has, whatever its type."""


@dataclass(frozen=True)
class TargetContext:
    """What a target may use besides its options.

    ``runnables``: each DAG's ``run=`` of the definitions file (a callable
    or a command line), by DAG id; ``connection``: finds a connection by id
    (environment first, then the config file), raising
    :class:`~sharedstream.connections.ConnectionNotFound`.
    """

    runnables: Mapping[str, object]
    connection: Callable[[str], Connection]


class Target(ABC):
    """One configured destination of DAG runs (see the module docstring for the contract).

    Subclasses declare :attr:`options` (their own options), the defaults of
    :attr:`default_concurrency` and :attr:`default_timeout`, and whether
    they :attr:`follows` runs after delivering them.
    """

    options: ClassVar[Mapping[str, TargetOption]] = {}
    """The type's own options (besides :data:`COMMON_OPTIONS`)."""
    default_concurrency: ClassVar[int] = 4
    default_timeout: ClassVar[float] = 30.0
    follows: bool = False
    """Whether :meth:`status` can tell what became of a delivered run (an instance may say
    otherwise than its class: a mode of its options may leave nothing to follow)."""

    def __init__(self, name: str, settings: Mapping[str, Any], context: TargetContext) -> None:
        """``settings``: every option validated, defaults filled in (:func:`check_options`)."""
        self.name = name
        self.settings = dict(settings)
        self.context = context

    @property
    def timeout(self) -> float:
        """Seconds one delivery may take."""
        return float(self.settings["timeout"])

    async def open(self) -> None:  # noqa: B027 - optional: most targets need nothing
        """Prepare (sessions, tokens) before the first delivery; may raise TargetError."""

    @abstractmethod
    async def deliver(self, run: RunDocument, progress: Callable[[str], None]) -> Delivery:
        """Hand ``run`` to the target; see the module docstring.

        ``progress("running")`` may be called once the run started, when the
        target runs it in place (a local command), so the store says so
        before the delivery returns.
        """

    async def status(self, run: RunDocument) -> Delivery | None:
        """What became of a delivered run at the target, or ``None`` (nothing new)."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional
        """Release what :meth:`open` took; called once, best effort."""


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def target_types() -> list[str]:
    """The names of every installed target type, sorted."""
    return sorted(_entry_points())


def target_type(name: str) -> type[Target]:
    """The :class:`Target` class registered as ``name``; :class:`TargetConfigError` if none."""
    found = _entry_points()
    if name not in found:
        near = difflib.get_close_matches(name, list(found), n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"installed: {', '.join(sorted(found))}"
        raise TargetConfigError(f"no target type {name!r}; {hint}")
    try:
        cls = found[name].load()
    except ImportError as exc:
        raise TargetConfigError(f"target type {name!r} cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Target)):
        raise TargetConfigError(f"target type {name!r} ({found[name].value}) is not a Target")
    return cls


def check_options(
    cls: type[Target], table: Mapping[str, Any], where: str, *, dag_only: bool = False
) -> dict[str, Any]:
    """Validate ``table`` against ``cls``'s options; every option's value, defaults filled in.

    ``where`` names the table in messages (``[targets.airflow] in file x``).
    With ``dag_only`` the table is a DAG's ``target_options``: only options
    marked ``per_dag`` are allowed and no default is filled in. Raises
    :class:`TargetConfigError`, one line naming the option and what it expects.
    """
    specs = {**COMMON_OPTIONS, **cls.options}
    allowed = {k: s for k, s in specs.items() if s.per_dag} if dag_only else specs
    values: dict[str, Any] = {}
    for option, value in table.items():
        if option not in allowed:
            if option in specs:
                raise TargetConfigError(f"{where}: {option!r} cannot be set per DAG "
                                        f"(per DAG: {', '.join(sorted(allowed)) or 'nothing'})")
            near = difflib.get_close_matches(option, list(allowed), n=1)
            hint = f"did you mean {near[0]!r}?" if near else (
                f"expected one of: {', '.join(sorted(allowed))}")
            raise TargetConfigError(f"{where}: unknown option {option!r}; {hint}")
        values[option] = _convert(specs[option], value, f"{where}: {option}")
    if not dag_only:
        missing = sorted(option for option, spec in specs.items()
                         if spec.required and option not in values)
        if missing:
            raise TargetConfigError(f"{where}: {missing[0]} is required "
                                    f"({specs[missing[0]].help})")
        for option, spec in specs.items():
            values.setdefault(option, spec.default)
        if values["max_concurrency"] is None:
            values["max_concurrency"] = cls.default_concurrency
        if values["timeout"] is None:
            values["timeout"] = cls.default_timeout
        if values["retry_backoff_max"] < values["retry_backoff_initial"]:
            raise TargetConfigError(f"{where}: retry_backoff_max must be >= "
                                    f"retry_backoff_initial ({values['retry_backoff_initial']})")
    return values


def _convert(spec: TargetOption, value: Any, what: str) -> Any:
    """``value`` as ``spec`` wants it, or :class:`TargetConfigError` naming ``what``."""
    kind = spec.kind
    if kind in ("str", "choice"):
        ok = isinstance(value, str) and bool(value) and (kind == "str" or value in spec.choices)
        if not ok:
            expected = "a non-empty string" if kind == "str" else (
                f"one of: {', '.join(spec.choices)}")
            raise TargetConfigError(f"{what} = {value!r}: expected {expected}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise TargetConfigError(f"{what} = {value!r}: expected true or false")
        return value
    if kind == "argv":
        if (not isinstance(value, list | tuple) or not value
                or not all(isinstance(part, str) and part for part in value)):
            raise TargetConfigError(f"{what} = {value!r}: expected a non-empty list of strings "
                                    '(a command line, e.g. ["python", "job.py"])')
        return list(value)
    number_ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "int":
        number_ok = number_ok and isinstance(value, int)
    if not number_ok or not math.isfinite(value) or value < spec.minimum:
        expected = "an integer" if kind == "int" else "a number"
        bound = f" >= {spec.minimum:g}" if spec.minimum != -math.inf else ""
        raise TargetConfigError(f"{what} = {value!r}: expected {expected}{bound}")
    return value if kind == "int" else float(value)
