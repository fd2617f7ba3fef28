"""Airflow's module paths, mirrored: ``airflow.X`` is ``sharedstream.airflow.X``.

Code written for Apache Airflow 3.3 and its providers ports by one
mechanical rule applied to its imports: replace the leading ``airflow.``
with ``sharedstream.airflow.`` (``from airflow.triggers.base import
BaseEventTrigger`` becomes ``from sharedstream.airflow.triggers.base import
BaseEventTrigger``). The rule holds for every module mirrored here:

* ``airflow.triggers.base`` and ``airflow.triggers.shared_stream`` - the
  trigger contract;
* ``airflow.sdk`` - what a definitions file declares (``Asset``,
  ``AssetWatcher``, ``DAG``, ``dag``, ``task``);
* ``airflow.timetables.*`` - the timetables a DAG is scheduled on;
* ``airflow.providers.apache.kafka.triggers.shared_stream`` and
  ``airflow.providers.amazon.aws.triggers.shared_stream`` - the providers'
  shared-stream watchers, reading Airflow connections;
* ``airflow.providers.standard.operators.empty`` - ``EmptyOperator``, inert.

Where Airflow's name and signature match ours, a module re-exports the
object of :mod:`sharedstream` that implements it, so
``sharedstream.airflow.triggers.base.TriggerEvent is sharedstream.TriggerEvent``;
where the signature differs, it adapts ours (a subclass taking Airflow's
arguments). Nothing is defined twice. Modules whose name starts with ``_``
are helpers, not Airflow paths. ``docs/airflow.md`` has the table of every
mirrored module and its names (``tests/unit/test_airflow_mirror_rule.py``
holds the table to the modules) and what differs.
"""
