"""Broker producers (``SharedStreamProducer`` implementations), one module per broker."""
