"""Airflow-style variables: string values named by a key, read from the environment.

A trigger (or a definitions file) written for Airflow reads settings with
``Variable.get("key")``. Here a variable is found, in this order, in

1. ``SHAREDSTREAM_VAR_<KEY>``, then
2. ``AIRFLOW_VAR_<KEY>`` (Airflow's own environment form, so a deployment's
   variables work unchanged),

``<KEY>`` being the key upper-cased, as Airflow does. There is no
metadata-database or secrets-backend lookup. The environment is read at
each call (a value set later is seen), so nothing is cached.

Invariants: an empty variable is a defined, empty value (as in Airflow);
a key that is not a non-empty string is a ``ValueError``; a missing one is
:class:`VariableNotFound` (a ``KeyError``) naming both variables it looked
for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["VAR_ENV_PREFIXES", "VariableNotFound", "get_variable"]

VAR_ENV_PREFIXES = ("SHAREDSTREAM_VAR_", "AIRFLOW_VAR_")
"""Environment variable prefixes, in lookup order; the key follows, upper-cased."""


class VariableNotFound(KeyError):
    """No place defines the variable; the message names where it was looked for."""

    def __init__(self, key: str) -> None:
        names = " or ".join(prefix + key.upper() for prefix in VAR_ENV_PREFIXES)
        self.key = key
        self.message = f"variable {key!r} not found: set {names}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def get_variable(key: str, *, environ: Mapping[str, str] | None = None) -> str:
    """The value of variable ``key`` (see the module docstring for where it is looked up).

    ``environ`` defaults to ``os.environ``, read now. Raises
    :class:`VariableNotFound` when no place defines it and ``ValueError``
    for a key that is not a non-empty string.
    """
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"a variable key must be a non-empty string, got {key!r}")
    env = os.environ if environ is None else environ
    for prefix in VAR_ENV_PREFIXES:
        value = env.get(prefix + key.upper())
        if value is not None:
            return value
    raise VariableNotFound(key)
