"""Mirror of ``airflow.providers.amazon`` (see :mod:`sharedstream.airflow`)."""
