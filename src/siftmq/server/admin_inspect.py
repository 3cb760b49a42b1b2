"""The admin API's inspection routes, which the console reads: the broker's overview with a short
history of its counters, expressions checked and tried, queues browsed through a filter, and dead
letters listed and resent. The answers are the broker's (:mod:`siftmq.broker.inspect`); the one
thing kept here is :class:`History`, samples of the broker's own figures for the console's charts.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from siftmq import __version__
from siftmq.auth.acl import Action
from siftmq.broker.broker import Broker
from siftmq.errors import NotFoundError

_log = logging.getLogger(__name__)

SAMPLE_EVERY_S: Final = 5.0
HISTORY_SAMPLES: Final = 360  # half an hour
LAG_EVERY: Final = 6  # samples: the groups' matching lag every 30 s (it reads the index)
LAG_SAMPLES: Final = 120  # an hour of it
MAX_LAG_SERIES: Final = 200  # (group, topic) pairs followed
LAG_MAX_SCAN: Final = 200_000  # index entries read per queue for one lag figure (an estimate past it)


class ExpressionCheck(BaseModel):
    model_config = ConfigDict(strict=True)  # true is no count of messages
    type: Literal["TAG", "SQL92"] = "SQL92"
    expression: str = Field(max_length=65_536)


class ExpressionTry(ExpressionCheck):
    last: int = Field(default=100, ge=1, le=1000)


class History:
    """The broker's totals every :data:`SAMPLE_EVERY_S` seconds (the overview's sparklines), and each
    group's matching lag every :data:`LAG_EVERY` samples (the group page's chart)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.samples: collections.deque[dict[str, int]] = collections.deque(maxlen=HISTORY_SAMPLES)
        self.lags: dict[tuple[str, str], collections.deque[tuple[int, int]]] = {}
        self._lags_lock = threading.Lock()  # the sampler's thread and a route's first point

    def current(self) -> dict[str, int]:
        stats, store = self.broker.stats, self.broker.store
        now = {
            "t": int(time.time() * 1000),
            "commit_log_bytes": store.commit_log_bytes,
            "sent": sum(stats.snapshot(stats.sends).values()),
            "delivered": sum(stats.snapshot(stats.deliveries).values()),
            "clients": len(self.broker.clients.sessions()),
        }
        return now

    def sample_lags(self, group: str | None = None) -> None:
        """Every group's matching lag per topic (``group``'s only: its first point, asked for)."""
        now = int(time.time() * 1000)
        pairs = [(g.name, t) for g in self.broker.groups.all() for t in list(g.subscriptions)]
        if group is not None:
            pairs = [(g, t) for g, t in pairs if g == group]
        else:
            with self._lags_lock:
                for key in [k for k in self.lags if k not in pairs]:  # groups and subscriptions gone
                    del self.lags[key]
        for name, topic in pairs[:MAX_LAG_SERIES]:
            try:
                rows = self.broker.lag(name, topic, max_scan=LAG_MAX_SCAN)
            except NotFoundError:  # the topic was deleted meanwhile
                continue
            with self._lags_lock:
                series = self.lags.setdefault((name, topic), collections.deque(maxlen=LAG_SAMPLES))
                series.append((now, sum(int(str(r["matching_lag"])) for r in rows)))

    def lags_of(self, group: str) -> dict[str, list[tuple[int, int]]]:
        with self._lags_lock:
            return {topic: list(series) for (g, topic), series in self.lags.items() if g == group}

    async def run(self) -> None:
        """Sample every :data:`SAMPLE_EVERY_S` seconds until cancelled (the admin server's task)."""
        for n in itertools.count():
            try:
                self.samples.append(await asyncio.to_thread(self.current))
                if n % LAG_EVERY == 0:
                    await asyncio.to_thread(self.sample_lags)
            except Exception:  # a sample lost, not the sampler
                _log.exception("the admin server's sample of the broker's figures failed")
            await asyncio.sleep(SAMPLE_EVERY_S)


Authorize = Callable[[Request, str, Action], bool]


def may_get_topic(may: Authorize, request: Request, topic: str) -> bool:
    """Whether the request's user may read ``topic``'s data: a group's routes that report on every
    topic the group reads are checked on the group only, and leave out the topics this refuses."""
    return may(request, f"Topic:{topic}", Action.GET)


def inspect_router(broker: Broker, history: History, may: Authorize) -> APIRouter:
    """The routes; ``may(request, resource, action)`` is the login's authorization, for the checks
    a route makes on what it finds (the resent dead letter's origin topic, the topics a group's
    programs and lag history are on)."""
    router = APIRouter()
    started = time.time()

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(functools.partial(fn, **kwargs), *args)

    @router.get("/overview")
    async def overview() -> dict[str, Any]:
        now = await asyncio.to_thread(history.current)
        disk = broker.store.disk.state()
        return {
            "broker": broker.config.broker_name, "version": __version__,
            "started_ms": int(started * 1000), "uptime_s": round(time.time() - started, 1),
            "topics": len(broker.topics.all()), "groups": len(broker.groups.all()),
            "commit_log_bytes": now["commit_log_bytes"], "sent": now["sent"], "delivered": now["delivered"],
            "clients": now["clients"],
            "disk": {"used_ratio": round(disk.used_ratio, 4), "free_bytes": disk.free_bytes,
                     "full": disk.full},
            "sample_every_s": SAMPLE_EVERY_S, "history": list(history.samples),
        }  # fmt: skip

    @router.post("/filter/check")
    async def check(body: ExpressionCheck) -> dict[str, Any]:
        result: dict[str, Any] = await call(broker.check_expression, body.type, body.expression)
        return result

    @router.post("/topics/{name}/try")
    async def try_expression(name: str, body: ExpressionTry) -> dict[str, Any]:
        result: dict[str, Any] = await call(
            broker.try_expression, name, body.type, body.expression, body.last
        )
        return result

    @router.get("/topics/{name}/queues/{queue_id}/browse")
    async def browse(
        name: str,
        queue_id: int,
        *,
        offset: int = 0,
        count: int = 20,
        type: Literal["TAG", "SQL92"] | None = None,
        expression: str | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = await call(
            broker.browse, name, queue_id, offset, count, kind=type, expression=expression
        )
        return result

    @router.get("/groups/{group}/programs")
    async def programs(request: Request, group: str) -> list[dict[str, Any]]:
        broker.existing_group(group)
        mine = [p for p in broker.programs.all() if p.group == group]
        return [broker.programs.report(group, p.topic) for p in mine if may_get_topic(may, request, p.topic)]

    @router.get("/groups/{group}/lag-history")
    async def lag_history(request: Request, group: str) -> dict[str, list[tuple[int, int]]]:
        broker.existing_group(group)
        found = history.lags_of(group)
        if not found and len(history.lags) < MAX_LAG_SERIES:
            await asyncio.to_thread(history.sample_lags, group)  # a group the sampler has not seen yet
            found = history.lags_of(group)
        return {topic: series for topic, series in found.items() if may_get_topic(may, request, topic)}

    @router.get("/dead-letters")
    async def dead_letters(request: Request) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await call(broker.dead_letters)
        return [row for row in found if may_get_topic(may, request, row["topic"])]  # (counts are data)

    @router.post("/topics/{name}/queues/{queue_id}/messages/{offset}/resend")
    async def resend(request: Request, name: str, queue_id: int, offset: int) -> Any:
        _, origin = await call(broker.dead_letter, name, queue_id, offset)
        if not may(request, f"Topic:{origin}", Action.PUB):  # the copy is a send to the origin topic
            return JSONResponse(
                {"error": "FORBIDDEN", "message": f"may not Pub Topic:{origin}, this dead letter's origin"},
                status_code=403,
            )
        sent: dict[str, Any] = await call(broker.resend_dead_letter, name, queue_id, offset)
        return sent

    return router
