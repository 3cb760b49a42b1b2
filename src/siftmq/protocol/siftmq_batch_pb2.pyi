import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from siftmq.protocol import rocketmq_v2_pb2 as _rocketmq_v2_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullBatchResponse(_message.Message):
    __slots__ = ("status", "messages", "next_offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    messages: _containers.RepeatedCompositeFieldContainer[_rocketmq_v2_pb2.Message]
    next_offset: int
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[_rocketmq_v2_pb2.Message, _Mapping]]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ReceiveBatchResponse(_message.Message):
    __slots__ = ("status", "messages", "delivery_timestamp")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    status: _rocketmq_v2_pb2.Status
    messages: _containers.RepeatedCompositeFieldContainer[_rocketmq_v2_pb2.Message]
    delivery_timestamp: _timestamp_pb2.Timestamp
    def __init__(self, status: _Optional[_Union[_rocketmq_v2_pb2.Status, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[_rocketmq_v2_pb2.Message, _Mapping]]] = ..., delivery_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
