"""Time-based schedules: Airflow's timetables (see ``docs/schedules.md``).

:mod:`~sharedstream.timetables.base` holds the contract every timetable
implements, run ids and the registry stored timetables are rebuilt from;
the other modules hold the built-in timetables, under Airflow's names.
"""
