"""siftmq.auth: who is calling (RocketMQ's v2 HMAC signature) and what they may do (ACL 2.0 policies).

Pure: no gRPC, no broker. The edge (:mod:`siftmq.server.auth`) reads the call's metadata, asks
:func:`~siftmq.auth.signature.verify` who signed it and :meth:`~siftmq.auth.acl.AuthTable.decide`
whether that user may take the action on the resource.
"""
