"""The RocketMQ 5 gRPC protocol as siftmq speaks it.

``rocketmq_v2.proto`` is siftmq's own description of the subset of ``apache.rocketmq.v2`` it
serves; ``rocketmq_v2_pb2`` is generated from it (``python -m siftmq.protocol.generate``) and
``service`` holds the RPC table with the wire method paths.
"""
