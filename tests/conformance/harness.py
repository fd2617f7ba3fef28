"""Moved to :mod:`sharedstream.testing` (harness, scripts, runner); re-exported for old imports."""

from sharedstream.testing.harness import BrokerHarness, DeadLetter, Features, Stream
from sharedstream.testing.runner import SupervisedRunner, eventually, eventually_async
from sharedstream.testing.scripts import SCRIPTS, Script, ScriptedFailure, act, pace

__all__ = [
    "SCRIPTS",
    "BrokerHarness",
    "DeadLetter",
    "Features",
    "Script",
    "ScriptedFailure",
    "Stream",
    "SupervisedRunner",
    "act",
    "eventually",
    "eventually_async",
    "pace",
]
