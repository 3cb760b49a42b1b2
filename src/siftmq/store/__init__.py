"""siftmq.store: the message store (CommitLog, ConsumeQueue, ConsumeQueueExt, dispatch, recovery, retention).

Imports only ``siftmq.errors`` (never filter, broker, server, client or spark). The broker uses
:class:`MessageStore` and implements :class:`MessageFilter`, :class:`CommitLogDispatcher` and
:class:`BitmapDispatcher`.
"""

from siftmq.hashing import java_string_hash
from siftmq.store.codec import (
    MIN_RECORD_SIZE,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    BatchEntry,
    Message,
    StoredMessage,
    check_properties,
    encode_host,
    tags_code_of,
)
from siftmq.store.commitlog import AppendedRecord
from siftmq.store.config import StoreConfig
from siftmq.store.consumequeue_ext import CqExtBlock, CqExtUnit
from siftmq.store.decoding import RawRecord
from siftmq.store.dispatch import BitmapDispatcher, CommitLogDispatcher, DispatchRequest
from siftmq.store.filtering import BlockMessageFilter, GetMessageResult, GetMessageStatus, MessageFilter
from siftmq.store.reput import MessageArrivingListener
from siftmq.store.retention import RetentionResult
from siftmq.store.store import MessageStore

__all__ = [
    "MIN_RECORD_SIZE",
    "PROPERTY_KEYS",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQ_KEY",
    "AppendedRecord",
    "BatchEntry",
    "BitmapDispatcher",
    "BlockMessageFilter",
    "CommitLogDispatcher",
    "CqExtBlock",
    "CqExtUnit",
    "DispatchRequest",
    "GetMessageResult",
    "GetMessageStatus",
    "Message",
    "MessageArrivingListener",
    "MessageFilter",
    "MessageStore",
    "RawRecord",
    "RetentionResult",
    "StoreConfig",
    "StoredMessage",
    "check_properties",
    "encode_host",
    "java_string_hash",
    "tags_code_of",
]
