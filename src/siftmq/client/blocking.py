"""A thin blocking wrapper for scripts: the asyncio clients run on one private event loop thread.

    from siftmq.client import blocking, FilterExpression

    with blocking.Producer("127.0.0.1:8081") as producer:
        producer.send("Orders", b"...", tag="Pay")
    with blocking.SimpleConsumer("127.0.0.1:8081", "g", {"Orders": FilterExpression.tag("Pay")}) as consumer:
        for m in consumer.receive(16, 30):
            consumer.ack(m)

Every coroutine method of the wrapped client becomes a plain method (same arguments); other
attributes are passed through.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from siftmq.client import consumers, producer

# what hands out objects whose coroutines would run on no loop (the wrapper makes methods blocking, not them)
_ASYNC_ONLY = {
    "prefetching": "use siftmq.client.SimpleConsumer in an event loop, or receive(ack=...) here",
}
_lock = threading.Lock()
_loops: list[asyncio.AbstractEventLoop] = []  # the one shared loop, once started


def _shared_loop() -> asyncio.AbstractEventLoop:
    with _lock:
        if not _loops or _loops[0].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="siftmq-client-loop", daemon=True).start()
            _loops[:] = [loop]
        return _loops[0]


class _Blocking:
    def __init__(self, factory: Callable[[], Any], timeout: float | None) -> None:
        self._loop = _shared_loop()
        self._timeout = timeout

        async def make() -> Any:
            return factory()  # grpc.aio channels belong to the loop they are created on

        self._client = self._run(make())

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._timeout)

    def __getattr__(self, name: str) -> Any:
        if name in _ASYNC_ONLY:
            raise AttributeError(f"{name} is asyncio only: {_ASYNC_ONLY[name]}")
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._run(attr(*args, **kwargs))

            return call
        return attr

    def __enter__(self) -> Any:
        self._run(self._client.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self._client.stop())


def Producer(*args: Any, timeout: float | None = 60.0, **kwargs: Any) -> Any:
    """A blocking :class:`siftmq.client.Producer`."""
    return _Blocking(lambda: producer.Producer(*args, **kwargs), timeout)


def SimpleConsumer(*args: Any, timeout: float | None = 120.0, **kwargs: Any) -> Any:
    """A blocking :class:`siftmq.client.SimpleConsumer`."""
    return _Blocking(lambda: consumers.SimpleConsumer(*args, **kwargs), timeout)


def PullConsumer(*args: Any, timeout: float | None = 120.0, **kwargs: Any) -> Any:
    """A blocking :class:`siftmq.client.PullConsumer`."""
    return _Blocking(lambda: consumers.PullConsumer(*args, **kwargs), timeout)
