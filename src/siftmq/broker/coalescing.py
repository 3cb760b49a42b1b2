"""Single sends that arrive together, appended together; receives that arrive together, one pass
of the queues; acks that arrive together, one thread hop.

An official client sends one message per call. Concurrent clients' calls reach the event loop in
the same turn (a front-end's frames arrive as one read), and appending each alone pays the
per-append work — validation set-up, the send locks, the store's append lock, the dispatch
hand-off — once per message. Here the single sends of one turn are grouped by topic and appended
as one batch; each caller gets its own result. A batch that is refused (one message's fault, or
the store's) is sent again message by message, so each caller gets the answer its own message
earns, as if it had been sent alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Final, TypeVar

from siftmq.broker.model import Delivery, ProducedMessage, SendResult, Subscription
from siftmq.broker.send import MAX_BATCH_MESSAGES

#: Messages appended together at most (a batch of one topic goes to one queue).
MAX_COALESCED: Final = min(64, MAX_BATCH_MESSAGES)
#: Receives served by one pass at most (what a pass copies is bounded by its bytes as well).
MAX_COALESCED_RECEIVES: Final = 64

_Waiting = tuple[ProducedMessage, "asyncio.Future[SendResult]"]
_T = TypeVar("_T")


class SendCoalescer:
    """``await coalescer.send(message)`` on the event loop: one append per topic and loop turn."""

    def __init__(self, send_many: Callable[[Sequence[ProducedMessage]], list[SendResult]]) -> None:
        self._send_many = send_many
        self._waiting: list[_Waiting] = []

    def send(self, message: ProducedMessage) -> asyncio.Future[SendResult]:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[SendResult] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._flush)  # after the calls already scheduled for this turn
        self._waiting.append((message, result))
        return result

    def _flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        try:
            by_topic: dict[str, list[_Waiting]] = {}
            for item in waiting:
                by_topic.setdefault(item[0].topic, []).append(item)
            for items in by_topic.values():
                for at in range(0, len(items), MAX_COALESCED):
                    self._append(items[at : at + MAX_COALESCED])
        except BaseException as exc:  # no caller may wait for ever on an answer that cannot come
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            raise

    def _append(self, items: list[_Waiting]) -> None:
        if len(items) > 1:
            try:
                results = self._send_many([m for m, _ in items])
            except Exception:
                pass  # every message alone below: each caller gets its own message's answer
            else:
                for (_, future), result in zip(items, results, strict=True):
                    _settle(future, result)
                return
        for message, future in items:
            try:
                _settle(future, self._send_many([message])[0])
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)


def _settle(future: asyncio.Future[SendResult], result: SendResult) -> None:
    if not future.done():  # the caller may have gone (its call was cancelled)
        future.set_result(result)


#: group, subscription, invisible time, auto renew: receives alike, made together
_ReceiveKey = tuple[str, Subscription, "int | None", bool]
#: client id, batch size, queue id, the answer
_Receiving = tuple[str, int, int, "asyncio.Future[list[Delivery] | None]"]


class ReceiveCoalescer:
    """``await coalescer.try_receive(...)``: :meth:`Broker.try_receive`'s answer, made on the event
    loop with the other receives of this turn that ask alike (group, filter, invisible time,
    renewal), in as few passes as give each what it would get alone
    (:meth:`Broker.try_receive_shared`). None: make the receive alone, in a thread.

    The first receive of a turn is made at once, alone (receives that come one at a time wait
    for nothing); the others of the turn wait for its end. A pass starts at the first receive's
    queue (a receive alone reads the queue it names first, then the others): which queue a
    message comes from is the broker's choice, as in RocketMQ, whose proxy takes only the
    broker's name from the queue a receive names."""

    def __init__(self, try_receive_shared: Callable[..., list[list[Delivery] | None]]) -> None:
        self._shared = try_receive_shared
        self._waiting: dict[_ReceiveKey, list[_Receiving]] = {}
        self._turn_open = False  # a receive was made at once this turn: the next ones wait for its end

    def try_receive(
        self,
        group: str,
        subscription: Subscription,
        *,
        client_id: str,
        queue_id: int,
        batch_size: int,
        invisible_ms: int | None,
        auto_renew: bool,
    ) -> asyncio.Future[list[Delivery] | None]:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[list[Delivery] | None] = loop.create_future()
        key = (group, subscription, invisible_ms, auto_renew)
        if self._turn_open:
            self._waiting.setdefault(key, []).append((client_id, batch_size, queue_id, result))
            return result
        self._turn_open = True
        loop.call_soon(self._flush)  # after the calls already scheduled for this turn
        try:
            result.set_result(self._pass_of(key, [(client_id, batch_size, queue_id)])[0])
        except Exception as exc:
            result.set_exception(exc)
        return result

    def _flush(self) -> None:
        self._turn_open = False
        waiting, self._waiting = self._waiting, {}
        try:
            for key, asks in waiting.items():
                for at in range(0, len(asks), MAX_COALESCED_RECEIVES):
                    self._answer(key, asks[at : at + MAX_COALESCED_RECEIVES])
        except BaseException as exc:  # no caller may wait for ever on an answer that cannot come
            for asks in waiting.values():
                for *_, future in asks:
                    if not future.done():
                        future.set_exception(exc)
            raise

    def _answer(self, key: _ReceiveKey, asks: list[_Receiving]) -> None:
        # A receive cancelled since it asked (its deadline, its client gone) takes no share: its
        # messages would stay in flight for nobody until their invisible time is over.
        asks = [ask for ask in asks if not ask[3].done()]
        if not asks:
            return
        try:
            shares = self._pass_of(key, [ask[:3] for ask in asks])
        except Exception as exc:  # (raised for one receive alone: its own error)
            for *_, future in asks:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), share in zip(asks, shares, strict=True):
            if not future.done():  # the caller may have gone (its call was cancelled)
                future.set_result(share)

    def _pass_of(self, key: _ReceiveKey, asks: list[tuple[str, int, int]]) -> list[list[Delivery] | None]:
        group, subscription, invisible_ms, auto_renew = key
        return self._shared(
            group,
            subscription,
            [(client_id, size) for client_id, size, _ in asks],
            queue_id=asks[0][2],
            invisible_ms=invisible_ms,
            auto_renew=auto_renew,
        )


class OneHop:
    """Blocking calls made in one turn of the event loop, run together in one hop to a worker
    thread (``await hop.run(fn)``): an official client acks one message per call, and a hop to a
    thread and back costs more than an ack. Each caller gets its own result or exception."""

    def __init__(self, executor: Executor | None = None) -> None:
        self._executor = executor
        self._waiting: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []

    def run(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[_T] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._hop)
        self._waiting.append((fn, result))
        return result

    def _hop(self) -> None:
        waiting, self._waiting = self._waiting, []

        def run_all() -> list[tuple[bool, Any]]:
            outcomes: list[tuple[bool, Any]] = []
            for fn, _ in waiting:
                try:
                    outcomes.append((True, fn()))
                except Exception as exc:
                    outcomes.append((False, exc))
            return outcomes

        def settle(done: asyncio.Future[list[tuple[bool, Any]]]) -> None:
            if done.cancelled() or done.exception() is not None:
                error = done.exception() if not done.cancelled() else asyncio.CancelledError()
                for _, future in waiting:
                    if not future.done():
                        future.set_exception(error or RuntimeError("the worker thread failed"))
                return
            for (_, future), (ok, value) in zip(waiting, done.result(), strict=True):
                if future.done():
                    continue  # the caller went away; the call itself has run
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

        try:
            hop = asyncio.get_running_loop().run_in_executor(self._executor, run_all)
        except RuntimeError as exc:  # the executor is shut down (the broker stopping): no caller may hang
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        hop.add_done_callback(settle)
