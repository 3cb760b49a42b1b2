"""siftmq.broker: the broker's domain services (no gRPC).

Topics, sends with de-duplication, filtered receives with invisible time, acks, redelivery and
dead letters, SQL92 filter registrations feeding the store's bitmap dispatcher, client sessions
and long polling. :class:`~siftmq.broker.broker.Broker` ties them to a
:class:`~siftmq.store.MessageStore`; ``siftmq.server`` puts the gRPC protocol in front.
"""

from siftmq.broker.broker import Broker
from siftmq.broker.config import BrokerConfig
from siftmq.broker.model import Delivery, ProducedMessage, SendResult, Subscription

__all__ = ["Broker", "BrokerConfig", "Delivery", "ProducedMessage", "SendResult", "Subscription"]
