"""Mirror of ``airflow.providers.amazon.aws.triggers`` (see :mod:`sharedstream.airflow`)."""
