"""siftmq.client: asyncio clients for siftmq (and any RocketMQ 5 gRPC broker).

``Producer`` (``send``, ``send_many``), ``SimpleConsumer`` (``receive``/``ack``, and ``prefetching`` for
receives made ahead), ``PushConsumer`` (listener), ``PullConsumer`` (``poll``/``seek``/``commit``).
Filters are validated locally (``FilterExpression.tag``/``.sql92``) and every delivered message is
re-checked on the client.
Depends only on the protocol stubs, the error types, the filter engine and durable file writes.
"""

from siftmq.client.consumers import PullConsumer, PushConsumer, SimpleConsumer
from siftmq.client.model import FilterExpression, OutgoingMessage, ReceivedMessage, SendReceipt
from siftmq.client.producer import Producer, new_message_id

__all__ = [
    "FilterExpression",
    "OutgoingMessage",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "ReceivedMessage",
    "SendReceipt",
    "SimpleConsumer",
    "new_message_id",
]
