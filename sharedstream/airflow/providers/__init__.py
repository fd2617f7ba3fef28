"""Mirror of the ``airflow.providers`` package (see :mod:`sharedstream.airflow`)."""
