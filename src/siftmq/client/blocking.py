"""A thin blocking wrapper for scripts: the asyncio clients run on one private event loop thread.

    from siftmq.client import blocking, FilterExpression

    with blocking.Producer("127.0.0.1:8081") as producer:
        producer.send("Orders", b"...", tag="Pay")
    with blocking.SimpleConsumer("127.0.0.1:8081", "g", {"Orders": FilterExpression.tag("Pay")}) as consumer:
        for m in consumer.receive(16, 30):
            consumer.ack(m)

Every method of the wrapped client becomes a blocking one (same arguments) run on that loop's
thread, and a call given up on (``timeout``, Ctrl-C) is cancelled before the error is raised;
other attributes are passed through.
"""

from __future__ import annotations

import asyncio
import contextlib
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
# plain methods that touch nothing the loop's tasks use: called on the caller's thread
_PURE = {"message"}
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
        """Run ``coro`` on the loop thread for its result. A call given up on (the timeout passed,
        Ctrl-C) is cancelled and waited for before the error is raised: left running, a poll would
        take messages out of the buffer for nobody, and the next commit would skip them."""
        running: list[asyncio.Future[Any]] = []

        async def call() -> Any:
            running.append(task := asyncio.ensure_future(coro))
            return await asyncio.shield(task)

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result(self._timeout)
        except BaseException:
            future.cancel()  # not started yet: it never will
            asyncio.run_coroutine_threadsafe(_cancelled(running), self._loop).result()
            raise

    def _run_plain(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A plain method, called on the loop thread too: it may touch what the loop's tasks use."""

        async def call() -> Any:
            return fn(*args, **kwargs)

        return self._run(call())

    def __getattr__(self, name: str) -> Any:
        if name in _ASYNC_ONLY:
            raise AttributeError(f"{name} is asyncio only: {_ASYNC_ONLY[name]}")
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._run(attr(*args, **kwargs))

            return call
        if inspect.ismethod(attr) and name not in _PURE:

            @functools.wraps(attr)
            def plain(*args: Any, **kwargs: Any) -> Any:
                return self._run_plain(attr, *args, **kwargs)

            return plain
        return attr

    def __enter__(self) -> Any:
        try:
            self._run(self._client.start())
        except BaseException:  # no __exit__ follows: the channel would stay open
            self._run(self._client.connection.close())
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self._client.stop())


async def _cancelled(running: list[asyncio.Future[Any]]) -> None:
    """Cancel the call (if it started and is not done) and wait until it has ended."""
    for task in running:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def Producer(*args: Any, timeout: float | None = 60.0, **kwargs: Any) -> Any:
    """A blocking :class:`siftmq.client.Producer`."""
    return _Blocking(lambda: producer.Producer(*args, **kwargs), timeout)


def SimpleConsumer(*args: Any, timeout: float | None = 120.0, **kwargs: Any) -> Any:
    """A blocking :class:`siftmq.client.SimpleConsumer`."""
    return _Blocking(lambda: consumers.SimpleConsumer(*args, **kwargs), timeout)


def PullConsumer(*args: Any, timeout: float | None = 120.0, **kwargs: Any) -> Any:
    """A blocking :class:`siftmq.client.PullConsumer`."""
    return _Blocking(lambda: consumers.PullConsumer(*args, **kwargs), timeout)
