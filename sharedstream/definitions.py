"""What a definitions file imports: assets, their watchers, and DAGs.

The public home of the names a definitions file uses (as ``airflow.sdk`` is
for a DAG file); they are defined in :mod:`sharedstream.runtime.definitions`,
which also loads such a file.
"""

from sharedstream.runtime.definitions import (
    Asset,
    AssetAll,
    AssetAny,
    AssetWatcher,
    Dag,
    DefinitionsError,
)

__all__ = ["Asset", "AssetAll", "AssetAny", "AssetWatcher", "Dag", "DefinitionsError"]
