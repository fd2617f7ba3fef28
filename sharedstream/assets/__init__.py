"""Assets: what a DAG can be scheduled on, and the watchers that feed them.

The classes live in :mod:`sharedstream.assets.conditions`; this package
hands them on. A definitions file imports them from
:mod:`sharedstream.definitions`, with ``Dag``.
"""

from sharedstream.assets.conditions import (
    Asset,
    AssetAll,
    AssetAny,
    AssetCondition,
    AssetWatcher,
    DefinitionsError,
)

__all__ = ["Asset", "AssetAll", "AssetAny", "AssetCondition", "AssetWatcher", "DefinitionsError"]
