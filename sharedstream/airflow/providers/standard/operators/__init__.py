"""Mirror of ``airflow.providers.standard.operators`` (see :mod:`sharedstream.airflow`)."""
