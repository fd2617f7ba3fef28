"""Fixtures every test directory shares.

``airflow_server`` (the testing kit's real Apache Airflow 3, session-scoped)
is imported here once: imported into several test modules, each module would
get an Airflow of its own (about 1.5 GB and 10-20 s each).
"""

from sharedstream.testing.fixtures import airflow_server

__all__ = ["airflow_server"]
