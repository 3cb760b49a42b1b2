"""siftmq: a RocketMQ-compatible message broker in Python with server-side message filtering."""

__version__ = "0.1.0"
