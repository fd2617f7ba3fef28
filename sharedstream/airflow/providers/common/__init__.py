"""Mirror of ``airflow.providers.common`` (see :mod:`sharedstream.airflow`)."""
