"""Mirror of ``airflow.providers.apache`` (see :mod:`sharedstream.airflow`)."""
