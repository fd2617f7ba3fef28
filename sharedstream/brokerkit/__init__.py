"""The broker kit: what every broker's producer and trigger modules build on.

A broker module under ``sharedstream.producers`` / ``sharedstream.triggers``
holds only what is specific to its broker; everything else is here, each
piece with its contract in its module docstring:

* triggers: :mod:`.trigger` (``BrokerTrigger``: payload formats, the
  declarative match compiled once, decode / reject / payload, the prefilter,
  vouched payloads) and :mod:`.codecs` (decoders, match compilation);
* producers: :mod:`.sdk` (the SDK imported on first use, one-line hint when
  missing), :mod:`.errors` (the error hierarchy), :mod:`.retry` (retries with
  backoff), :mod:`.inflight` (the in-flight limit), :mod:`.deadletters`
  (reasons, annotations, dead letter or store fallback or discard, counts),
  :mod:`.redelivery` (poison and ``unseen`` accounting), :mod:`.lease`
  (renewing leases: SQS visibility, Pub/Sub ack deadlines, Service Bus
  locks), :mod:`.workers` (a poll's background tasks and the inbox they fill),
  :mod:`.cancellation` (a cancellation an SDK call lost, raised again),
  :mod:`.settle` (settle senders: a bounded backlog of deletes, acks
  or completes sent in batches by a few senders, drained on close),
  :mod:`.batches`, :mod:`.fingerprints` (settings fingerprints, one consumer
  per source), :mod:`.message_identity` (message fingerprints beside
  raw event names) and :mod:`.coalesced_commits` (cumulative commits).

The kit imports only the engine and itself, never a broker SDK (checked by
``tests/test_import_contracts.py``).
"""
