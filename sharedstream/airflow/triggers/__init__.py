"""Mirror of the ``airflow.triggers`` package (see :mod:`sharedstream.airflow`)."""
