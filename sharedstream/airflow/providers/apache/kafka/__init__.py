"""Mirror of ``airflow.providers.apache.kafka``: its shared-stream trigger only."""
