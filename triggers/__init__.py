"""Broker triggers (``BaseEventTrigger`` classes), one module per broker."""
