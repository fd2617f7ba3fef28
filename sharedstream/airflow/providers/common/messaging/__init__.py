"""Mirror of ``airflow.providers.common.messaging`` (see :mod:`sharedstream.airflow`)."""
