"""The gRPC front-ends of ``siftmq broker --workers N``: stateless processes that terminate the
protocol and pass calls to the core process over a Unix socket (:mod:`siftmq.frontend.frames`)."""
