"""Moved to :mod:`sharedstream.testing.conformance`; re-exported for old imports."""

from sharedstream.testing.conformance import (
    MEASUREMENTS,
    ProducerConformance,
    Session,
    same,
    values,
)
from sharedstream.testing.conformance import unique_ids as _ids

__all__ = ["MEASUREMENTS", "ProducerConformance", "Session", "_ids", "same", "values"]
