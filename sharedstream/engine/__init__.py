"""The engine: Airflow's shared-stream contract, fast.

One poll per stream key fanned out to many filtering subscribers, with the
broker advanced only once every subscriber resolved each raw event: fan-out
(:mod:`.fanout`), resolution and the ack book (:mod:`.resolution` with
:mod:`.records`, :mod:`.ack_subscriber`, :mod:`.seqs` and :mod:`.failures`,
the only modules that change resolution state), the
subscriber iterators (:mod:`.stream`), the poll (:mod:`.pump`), timeouts
(:mod:`.timeouts`), a running group (:mod:`.group`) and the manager that owns
the groups (:mod:`.manager`, :mod:`.membership`), the trigger and producer
contracts (:mod:`.trigger`, :mod:`.producer`), errors and instruments.

The engine imports nothing from :mod:`sharedstream.runtime`, the store or any
broker module (checked by ``tests/test_import_contracts.py``).
"""
