import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from siftmq.protocol import rocketmq_v2_pb2 as _rocketmq_v2_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageColumns(_message.Message):
    __slots__ = ("body", "message_id", "tag", "keys", "property_count", "property_name", "property_value", "queue_id", "queue_offset", "delivery_attempt", "born_timestamp_ms", "store_timestamp_ms", "receipt_handle")
    BODY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_NAME_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_VALUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    body: _containers.RepeatedScalarFieldContainer[bytes]
    message_id: _containers.RepeatedScalarFieldContainer[str]
    tag: _containers.RepeatedScalarFieldContainer[str]
    keys: _containers.RepeatedScalarFieldContainer[str]
    property_count: _containers.RepeatedScalarFieldContainer[int]
    property_name: _containers.RepeatedScalarFieldContainer[str]
    property_value: _containers.RepeatedScalarFieldContainer[str]
    queue_id: _containers.RepeatedScalarFieldContainer[int]
    queue_offset: _containers.RepeatedScalarFieldContainer[int]
    delivery_attempt: _containers.RepeatedScalarFieldContainer[int]
    born_timestamp_ms: _containers.RepeatedScalarFieldContainer[int]
    store_timestamp_ms: _containers.RepeatedScalarFieldContainer[int]
    receipt_handle: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, body: _Optional[_Iterable[bytes]] = ..., message_id: _Optional[_Iterable[str]] = ..., tag: _Optional[_Iterable[str]] = ..., keys: _Optional[_Iterable[str]] = ..., property_count: _Optional[_Iterable[int]] = ..., property_name: _Optional[_Iterable[str]] = ..., property_value: _Optional[_Iterable[str]] = ..., queue_id: _Optional[_Iterable[int]] = ..., queue_offset: _Optional[_Iterable[int]] = ..., delivery_attempt: _Optional[_Iterable[int]] = ..., born_timestamp_ms: _Optional[_Iterable[int]] = ..., store_timestamp_ms: _Optional[_Iterable[int]] = ..., receipt_handle: _Optional[_Iterable[str]] = ...) -> None: ...

class PullBatchResponse(_message.Message):
    __slots__ = ("status", "messages", "next_offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    messages: MessageColumns
    next_offset: int
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., messages: _Optional[_Union[MessageColumns, _Mapping]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ReceiveBatchResponse(_message.Message):
    __slots__ = ("status", "messages", "delivery_timestamp")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    messages: MessageColumns
    delivery_timestamp: _timestamp_pb2.Timestamp
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., messages: _Optional[_Union[MessageColumns, _Mapping]] = ..., delivery_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SendBatchRequest(_message.Message):
    __slots__ = ("topic", "body", "message_id", "tag", "key_count", "key", "property_count", "property_name", "property_value", "born_timestamp_ms", "born_host")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEY_COUNT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_NAME_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_VALUE_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    topic: _rocketmq_v2_pb2.Resource
    body: _containers.RepeatedScalarFieldContainer[bytes]
    message_id: _containers.RepeatedScalarFieldContainer[str]
    tag: _containers.RepeatedScalarFieldContainer[str]
    key_count: _containers.RepeatedScalarFieldContainer[int]
    key: _containers.RepeatedScalarFieldContainer[str]
    property_count: _containers.RepeatedScalarFieldContainer[int]
    property_name: _containers.RepeatedScalarFieldContainer[str]
    property_value: _containers.RepeatedScalarFieldContainer[str]
    born_timestamp_ms: _containers.RepeatedScalarFieldContainer[int]
    born_host: str
    def __init__(self, topic: _Optional[_Union[_rocketmq_v2_pb2.Resource, _Mapping]] = ..., body: _Optional[_Iterable[bytes]] = ..., message_id: _Optional[_Iterable[str]] = ..., tag: _Optional[_Iterable[str]] = ..., key_count: _Optional[_Iterable[int]] = ..., key: _Optional[_Iterable[str]] = ..., property_count: _Optional[_Iterable[int]] = ..., property_name: _Optional[_Iterable[str]] = ..., property_value: _Optional[_Iterable[str]] = ..., born_timestamp_ms: _Optional[_Iterable[int]] = ..., born_host: _Optional[str] = ...) -> None: ...

class SendBatchResponse(_message.Message):
    __slots__ = ("status", "queue_id", "queue_offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    queue_id: _containers.RepeatedScalarFieldContainer[int]
    queue_offset: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., queue_id: _Optional[_Iterable[int]] = ..., queue_offset: _Optional[_Iterable[int]] = ...) -> None: ...

class UpdateOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: _rocketmq_v2_pb2.Resource
    topic: _rocketmq_v2_pb2.Resource
    queue_id: _containers.RepeatedScalarFieldContainer[int]
    offset: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[_Union[_rocketmq_v2_pb2.Resource, _Mapping]] = ..., topic: _Optional[_Union[_rocketmq_v2_pb2.Resource, _Mapping]] = ..., queue_id: _Optional[_Iterable[int]] = ..., offset: _Optional[_Iterable[int]] = ...) -> None: ...

class UpdateOffsetsResponse(_message.Message):
    __slots__ = ("status", "assigned_queue_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    assigned_queue_id: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., assigned_queue_id: _Optional[_Iterable[int]] = ...) -> None: ...

class AckAndReceiveRequest(_message.Message):
    __slots__ = ("ack", "receive")
    ACK_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_FIELD_NUMBER: _ClassVar[int]
    ack: _rocketmq_v2_pb2.AckMessageRequest
    receive: _rocketmq_v2_pb2.ReceiveMessageRequest
    def __init__(self, ack: _Optional[_Union[_rocketmq_v2_pb2.AckMessageRequest, _Mapping]] = ..., receive: _Optional[_Union[_rocketmq_v2_pb2.ReceiveMessageRequest, _Mapping]] = ...) -> None: ...

class AckAndReceiveResponse(_message.Message):
    __slots__ = ("status", "ack", "receive")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    ack: _rocketmq_v2_pb2.AckMessageResponse
    receive: ReceiveBatchResponse
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., ack: _Optional[_Union[_rocketmq_v2_pb2.AckMessageResponse, _Mapping]] = ..., receive: _Optional[_Union[ReceiveBatchResponse, _Mapping]] = ...) -> None: ...
