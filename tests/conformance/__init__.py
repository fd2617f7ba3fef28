"""Moved: the conformance suite is now :mod:`sharedstream.testing` (importable by broker packages).

These modules only re-export the kit's names for the test modules that still
import them from here; new code imports from ``sharedstream.testing``. Delete
this package once nothing imports it.
"""
