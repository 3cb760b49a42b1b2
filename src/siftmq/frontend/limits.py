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
#: Calls a connection may open beyond a pull of every queue of the largest topic (its Telemetry
#: stream, sends, acks), and at least: see :func:`streams_per_connection`.
STREAM_HEADROOM: Final = 76
MIN_STREAMS: Final = 1100
#: Calls gRPC core holds for the server before the process takes them up, over every connection:
#: past the soft bound it refuses new ones at random (CANCELLED), past the hard one (twice the soft)
#: all of them. At core's defaults (1,000 and 3,000) one connection resetting streams as fast as it
#: opens them kept that queue full and 65% of other clients' calls failed; above what this many
#: connections can hold (each up to its stream bound), and some, a few hostile connections cost
#: others time (their calls wait their turn), not failures: 5,000 at the least stream bound.
PENDING_CONNECTIONS: Final = 4
PENDING_ROOM: Final = 600
#: Metadata of one call, in HTTP/2's count (each entry's key and value and 32 bytes): gRPC's own
#: default, made explicit because it is what the server advertises (SETTINGS_MAX_HEADER_LIST_SIZE)
#: and enforces once the client has acknowledged that. The official clients send under 1 KiB.
MAX_METADATA: Final = 16 * 1024
#: gRPC core refuses metadata between its soft bound (default 8 KiB) and the hard one at random, in
#: proportion to the size; before a client has acknowledged the server's settings the hard bound is
#: HTTP/2's 16 MiB, so the same call was served or refused by chance. A soft bound above every hard
#: one turns that off: refused exactly when past the hard bound (the bound above, or 16 MiB for a
#: client that sent its headers first, whose call a front-end also refuses by size: frames.CALL_ROOM).
_NO_RANDOM_REFUSAL: Final = 2**31 - 1
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


def streams_per_connection(queue_nums: int) -> int:
    """Calls open at once on one connection: beyond it a call is refused (REFUSED_STREAM), not
    queued. Room for a pull of every queue of the largest topic at once (``queue_nums``: siftmq's
    PullConsumer holds one per queue) and the connection's other calls, 1,100 at least (a client's
    long polls, sends and consumers share a connection whatever the topics' sizes); not much more,
    as gRPC core counts a stream the client reset until the server has let it go (HTTP/2 rapid
    reset: see :data:`PENDING_CONNECTIONS`)."""
    return max(MIN_STREAMS, queue_nums + STREAM_HEADROOM)


def server_options(
    frame_limit: int, max_connections: int, max_streams: int, *, reuse_port: bool
) -> list[tuple[str, int]]:
    """The options of a gRPC server process; ``max_connections`` as :func:`connection_limit` gives
    it, ``max_streams`` as :func:`streams_per_connection` does."""
    pending = PENDING_CONNECTIONS * max_streams + PENDING_ROOM
    return [
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.max_receive_message_length", frame_limit),
        ("grpc.max_send_message_length", frame_limit),
        ("grpc.absolute_max_metadata_size", MAX_METADATA),
        ("grpc.max_metadata_size", _NO_RANDOM_REFUSAL),
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.max_concurrent_streams", max_streams),
        # refuses a stream past the bound while reset ones are still counted (core's default, relied on)
        ("grpc.http.overload_protection", 1),
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", 2 * pending),
        ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    ]
