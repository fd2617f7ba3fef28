"""Mirror of ``airflow.providers.standard`` (see :mod:`sharedstream.airflow`)."""
