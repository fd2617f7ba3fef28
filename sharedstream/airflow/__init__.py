"""Airflow's module paths, mirrored: ``airflow.X`` is ``sharedstream.airflow.X``.

Code written for Apache Airflow 3.3 ports by one mechanical rule applied to
its imports: replace the leading ``airflow.`` with ``sharedstream.airflow.``
(``from airflow.triggers.base import BaseEventTrigger`` becomes
``from sharedstream.airflow.triggers.base import BaseEventTrigger``). Every
module here re-exports, under Airflow's names, the objects of
:mod:`sharedstream` that implement them; nothing is defined twice, so
``sharedstream.airflow.triggers.base.TriggerEvent is sharedstream.TriggerEvent``.

Mirrored so far: ``airflow.triggers.base`` and
``airflow.triggers.shared_stream``. See ``docs/airflow.md`` for what
differs.
"""
