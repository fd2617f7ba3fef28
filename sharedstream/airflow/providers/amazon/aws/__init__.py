"""Mirror of ``airflow.providers.amazon.aws``: its SQS shared-stream trigger only."""
