"""What a definitions file imports: assets, their watchers, and DAGs.

The public home of the names a definitions file uses (as ``airflow.sdk`` is
for a DAG file). The assets are defined in :mod:`sharedstream.assets`, ``Dag``
in :mod:`sharedstream.runtime.definitions`, which also loads such a file.
"""

from sharedstream.assets import Asset, AssetAll, AssetAny, AssetWatcher, DefinitionsError
from sharedstream.runtime.definitions import Dag

__all__ = ["Asset", "AssetAll", "AssetAny", "AssetWatcher", "Dag", "DefinitionsError"]
