"""Mirror of ``airflow.providers.common.messaging.triggers`` (see :mod:`sharedstream.airflow`)."""
