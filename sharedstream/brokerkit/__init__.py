"""The broker kit: what every broker's producer and trigger modules build on.

:mod:`.codecs` decodes payloads and compiles declarative matches into
prefilters. A broker module under ``sharedstream.producers`` /
``sharedstream.triggers`` should hold only what is specific to its broker.
The kit imports no broker SDK.
"""
