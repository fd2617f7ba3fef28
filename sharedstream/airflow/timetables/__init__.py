"""Mirror of the ``airflow.timetables`` package (see :mod:`sharedstream.airflow`)."""
