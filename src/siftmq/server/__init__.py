"""siftmq.server: the grpc.aio edge. It only translates: protobuf <-> broker types, errors -> status codes."""
