"""Single sends that arrive together, appended together; receives that arrive together, one pass
of the queues; acks that arrive together, one pass of their queues' locks, else one thread hop.

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
from typing import Any, Final, Generic, TypeVar

from siftmq.broker.model import Delivery, ProducedMessage, SendResult, Subscription
from siftmq.broker.send import MAX_BATCH_MESSAGES

#: Messages appended together at most (a batch of one topic goes to one queue).
MAX_COALESCED: Final = min(64, MAX_BATCH_MESSAGES)
#: Receives served by one pass at most (what a pass copies is bounded by its bytes as well).
MAX_COALESCED_RECEIVES: Final = 64
#: Acks made in one pass at most (each of at most the entries one AckMessage may carry).
MAX_COALESCED_ACKS: Final = 64

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


_K = TypeVar("_K")
_A = TypeVar("_A")


class _TurnPasses(Generic[_K, _A]):
    """Calls of one turn of the event loop made together: the first at once, alone (calls that
    come one at a time wait for nothing), the others of the turn at its end, one pass per key
    (:meth:`_made`: each ask's answer, in order). ``await self._ask(key, ask)``."""

    #: a call whose caller has gone (cancelled) before its pass is left out of it
    drop_cancelled = False

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._waiting: dict[_K, list[tuple[_A, asyncio.Future[Any]]]] = {}
        self._turn_open = False  # a call was made at once this turn: the next ones wait for its end

    def _made(self, key: _K, asks: list[_A]) -> list[Any]:
        raise NotImplementedError

    def _ask(self, key: _K, ask: _A) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        if self._turn_open:
            self._waiting.setdefault(key, []).append((ask, result))
            return result
        self._turn_open = True
        loop.call_soon(self._flush)  # after the calls already scheduled for this turn
        try:
            result.set_result(self._made(key, [ask])[0])
        except Exception as exc:
            result.set_exception(exc)
        return result

    def _flush(self) -> None:
        self._turn_open = False
        waiting, self._waiting = self._waiting, {}
        try:
            for key, asks in waiting.items():
                for at in range(0, len(asks), self._limit):
                    self._pass(key, asks[at : at + self._limit])
        except BaseException as exc:  # no caller may wait for ever on an answer that cannot come
            for asks in waiting.values():
                for _, future in asks:
                    if not future.done():
                        future.set_exception(exc)
            raise

    def _pass(self, key: _K, asks: list[tuple[_A, asyncio.Future[Any]]]) -> None:
        if self.drop_cancelled:
            asks = [item for item in asks if not item[1].done()]
            if not asks:
                return
        try:
            answers = self._made(key, [ask for ask, _ in asks])
        except Exception as exc:  # (raised for one call alone: its own error)
            for _, future in asks:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), answer in zip(asks, answers, strict=True):
            if not future.done():  # the caller may have gone (its call was cancelled)
                future.set_result(answer)


#: group, subscription, invisible time, auto renew: receives alike, made together
_ReceiveKey = tuple[str, Subscription, "int | None", bool]


class ReceiveCoalescer(_TurnPasses[_ReceiveKey, tuple[str, int, int]]):
    """``await coalescer.try_receive(...)``: :meth:`Broker.try_receive`'s answer, made on the event
    loop with the other receives of this turn that ask alike (group, filter, invisible time,
    renewal), in as few passes as give each what it would get alone
    (:meth:`Broker.try_receive_shared`). None: make the receive alone, in a thread.

    A pass starts at the first receive's queue (a receive alone reads the queue it names first,
    then the others): which queue a message comes from is the broker's choice, as in RocketMQ,
    whose proxy takes only the broker's name from the queue a receive names."""

    # A receive cancelled since it asked (its deadline, its client gone) takes no share: its
    # messages would stay in flight for nobody until their invisible time is over.
    drop_cancelled = True

    def __init__(self, try_receive_shared: Callable[..., list[list[Delivery] | None]]) -> None:
        super().__init__(MAX_COALESCED_RECEIVES)
        self._shared = try_receive_shared

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
        return self._ask((group, subscription, invisible_ms, auto_renew), (client_id, batch_size, queue_id))

    def _made(self, key: _ReceiveKey, asks: list[tuple[str, int, int]]) -> list[list[Delivery] | None]:
        group, subscription, invisible_ms, auto_renew = key
        return self._shared(
            group,
            subscription,
            [(client_id, size) for client_id, size, _ in asks],
            queue_id=asks[0][2],
            invisible_ms=invisible_ms,
            auto_renew=auto_renew,
        )


class AckCoalescer(_TurnPasses[tuple[str, str], tuple[str, Sequence[str]]]):
    """``await coalescer.try_ack(group, topic, handles, client_id=...)``:
    :meth:`Broker.try_ack_many`'s answer, made on the event loop with the other acks of this
    turn for the same group and topic, in one pass (:meth:`Broker.try_ack_shared`). None: a lock
    was held elsewhere; ack alone, in a thread. An ack whose call was cancelled is made all the
    same (what its client meant)."""

    def __init__(self, try_ack_shared: Callable[..., list[list[Any] | None]]) -> None:
        super().__init__(MAX_COALESCED_ACKS)
        self._shared = try_ack_shared

    def try_ack(
        self, group: str, topic: str, handles: Sequence[str], *, client_id: str
    ) -> asyncio.Future[list[Any] | None]:
        return self._ask((group, topic), (client_id, handles))

    def _made(self, key: tuple[str, str], asks: list[tuple[str, Sequence[str]]]) -> list[list[Any] | None]:
        return self._shared(*key, asks)


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
