"""The runtime: the triggerer process around the engine.

The triggerer (:mod:`.triggerer`) runs the watchers of a definitions file
(:mod:`.definitions`, classes looked up in :mod:`.registry`), stores their
events through the persistence gate (:mod:`.persist`) before the broker is
advanced, and is configured by :mod:`.config`; trigger kwargs are serialized
(:mod:`.serde`) and encrypted (:mod:`.crypto`); :mod:`.cli` is the
``sharedstream`` command and :mod:`.logs` its log set-up.

The runtime imports no broker module or SDK (checked by
``tests/test_import_contracts.py``): brokers are reached through the trigger
classes a definitions file names.
"""
