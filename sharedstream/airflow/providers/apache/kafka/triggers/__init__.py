"""Mirror of ``airflow.providers.apache.kafka.triggers`` (see :mod:`sharedstream.airflow`)."""
