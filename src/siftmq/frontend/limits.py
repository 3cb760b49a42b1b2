"""What every gRPC server of siftmq bounds, served in one process or by front-ends.

grpcio bounds nothing of this by default: a client could hold connections until the process ran out
of file descriptors (the store's index files and state writes fail with it), open streams without
end on one connection, or hold connections silent for ever.
"""

from __future__ import annotations

import resource
from typing import Final

#: A connection without a call for this long is closed (clients reconnect at their next call; the
#: official clients hold a Telemetry stream open, so theirs are never idle).
IDLE_CONNECTION_MS: Final = 5 * 60 * 1000
#: A connection must finish its TLS and HTTP/2 handshake within this.
HANDSHAKE_TIMEOUT_MS: Final = 20_000
#: Calls open at once on one connection: beyond it a call is refused (REFUSED_STREAM), not queued,
#: so it leaves room for a pull of every queue of the largest topic (1,024) at once and more.
MAX_STREAMS_PER_CONNECTION: Final = 4096
#: Connections when the open-file limit cannot tell.
_FALLBACK_CONNECTIONS: Final = 16_384


def connection_limit(configured: int) -> int:
    """``configured``, or when 0 a quarter of this process's open-file limit (half of it is the
    store's index files, the rest its segments, state files and the admin server's connections)."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _FALLBACK_CONNECTIONS
    return max(64, soft // 4)


def server_options(frame_limit: int, max_connections: int, *, reuse_port: bool) -> list[tuple[str, int]]:
    """The options of a gRPC server process; ``max_connections`` as :func:`connection_limit` gives it."""
    return [
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.max_receive_message_length", frame_limit),
        ("grpc.max_send_message_length", frame_limit),
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    ]
