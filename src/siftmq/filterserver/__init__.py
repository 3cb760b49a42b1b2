"""siftmq.filterserver: consumers' own filter programs, run on the broker host in sandboxed worker
processes (RocketMQ's FilterServer, made safe).

* :mod:`~siftmq.filterserver.program` — what a program may be (checked statically, without running it);
* :mod:`~siftmq.filterserver.message` — the read-only message a program's ``match`` sees;
* :mod:`~siftmq.filterserver.wire` — the frames between the broker and a worker (the broker parses
  what a worker says as untrusted input);
* :mod:`~siftmq.filterserver.sandbox` and :mod:`~siftmq.filterserver.worker` — the worker process:
  limits, an unprivileged user, a seccomp allow-list, then the program;
* :mod:`~siftmq.filterserver.pool` — the broker's side: workers started, fed, timed and replaced.

Nothing here imports the broker, the store or the edge.
"""
