"""The admin HTTP API (FastAPI) and the Prometheus metrics endpoint, served beside the gRPC port.

Topics, consumer groups (mode, consistency policy, clients, subscriptions, filter statistics,
lag counting only matching messages), message lookup, and ``/metrics``. Like the gRPC edge it only
translates: JSON <-> broker calls, errors -> HTTP statuses.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from siftmq.auth.acl import Action
from siftmq.auth.throttle import FailureThrottle
from siftmq.broker import deletion
from siftmq.broker.broker import Broker
from siftmq.broker.config import parse_listen
from siftmq.broker.inspect import message_view
from siftmq.broker.model import Subscription
from siftmq.broker.parts import check_queue
from siftmq.broker.topics import PERM_READ_WRITE, TopicConfig
from siftmq.console import CONSOLE_PATHS, console_router
from siftmq.errors import (
    BadRequestError,
    BrokerError,
    FilterError,
    NotFoundError,
    SiftError,
    StatusCode,
    caused_by_full_disk,
)
from siftmq.server.admin_auth import (
    OPEN_PATHS,
    Tokens,
    admin_actions,
    basic_user,
    bearer_token,
    needs_super,
)
from siftmq.server.admin_inspect import History, inspect_router, may_get_topic
from siftmq.server.admin_users import users_router
from siftmq.server.auth import Gate

_log = logging.getLogger(__name__)

#: a scrape's time for counting consumer lags (see BrokerCollector._lags_of)
LAG_BUDGET_S = 0.5
_HTTP_STATUS = {"PRECONDITION_FAILED": 409, "UNSUPPORTED": 501, "TOO_MANY_REQUESTS": 429}


class TopicCreate(BaseModel):
    model_config = ConfigDict(strict=True)  # true is no queue count, nor "8" a number
    name: str = Field(min_length=1, max_length=127)
    queue_nums: int = Field(default=8, ge=1)  # at most max_queue_nums: the broker says so
    perm: int = Field(default=PERM_READ_WRITE, ge=0, le=7)


class TopicUpdate(BaseModel):
    model_config = ConfigDict(strict=True)
    queue_nums: int | None = Field(default=None, ge=1)
    perm: int | None = Field(default=None, ge=0, le=7)


class GroupUpdate(BaseModel):
    mode: Literal["clustering", "broadcasting"] | None = None
    consistency: Literal["strict", "compat"] | None = None


class ProgramSet(BaseModel):
    source: str = Field(min_length=1, max_length=64 * 1024)
    #: a message the program must handle without failing (default: the topic's newest)
    sample: dict[str, Any] | None = None


class SubscriptionSet(BaseModel):
    type: Literal["TAG", "SQL92"] = "TAG"
    expression: str = Field(default="*", max_length=65_536)


_Next = Callable[[Request], Awaitable[Any]]


def create_app(
    broker: Broker,
    gate: Gate | None = None,
    warnings: list[str] | None = None,
    front_ends: Callable[[], dict[str, int]] | None = None,
) -> FastAPI:
    """The admin application for ``broker``; ``warnings`` (an exposed broker without authentication)
    are shown by ``/healthz``; ``front_ends`` counts the gRPC front-ends (``--workers``) for the
    metrics."""
    app = FastAPI(title="siftmq admin", version="1", docs_url="/docs", redoc_url=None)
    history = app.state.history = History(broker)  # sampled by the admin server's task
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker, gate, front_ends))

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(functools.partial(fn, **kwargs), *args)

    tokens = Tokens(broker.config.admin_token_ttl_s) if gate is not None else None
    if gate is not None and tokens is not None:
        gate.on_change.append(lambda: tokens.user_table_changed(gate.table.users))

    def may(request: Request, resource: str, action: Action) -> bool:
        """Whether the request's (logged-in) user may (always, with authorization off): the
        login's check, and the routes' own on what they find."""
        if gate is None or not gate.authorize:
            return True
        user = getattr(request.state, "user", None)
        peer = request.client.host if request.client else None
        return user is not None and gate.allowed(user, resource, action, peer)

    async def readable_topics(request: Request, names: list[str]) -> set[str]:
        """The topics of ``names`` the request's user may Get. Decided in a thread against the table
        in force (immutable) and not remembered: 10,000 decisions on the event loop held every gRPC
        call up for seconds with a large policy, and would have emptied the decision cache the gRPC
        calls use twice over."""
        if gate is None or not gate.authorize:
            return set(names)
        user = getattr(request.state, "user", None)
        if user is None:
            return set()
        table, peer = gate.table, request.client.host if request.client else None
        decided: set[str] = await call(
            lambda: {n for n in names if table.decide(user, f"Topic:{n}", Action.GET, peer)}
        )
        return decided

    @app.middleware("http")
    async def not_from_other_sites(request: Request, call_next: _Next) -> Any:
        # a page on another site can make a browser POST here (a form: no preflight), with its
        # cached login or none at all: a POST must say it is JSON or carry siftmq's own header,
        # which a page can send only after a preflight this API never grants
        if request.method == "POST" and not _own_request(request):
            return JSONResponse(
                {
                    "error": "FORBIDDEN",
                    "message": "a POST needs Content-Type: application/json or an X-Siftmq-Client header",
                },
                status_code=403,
            )
        return await call_next(request)

    if _serves_loopback(broker.config.admin_listen):

        @app.middleware("http")
        async def loopback_names_only(request: Request, call_next: _Next) -> Any:
            # a page on another site that makes its name resolve to 127.0.0.1 (DNS rebinding) would
            # otherwise drive a loopback admin API from the user's browser: it names itself in Host
            if not _loopback_name(request.headers.get("host", "")):
                return JSONResponse(
                    {"error": "FORBIDDEN", "message": "the admin API answers to loopback host names only"},
                    status_code=403,
                )
            return await call_next(request)

    if gate is not None and tokens is not None:
        open_paths = OPEN_PATHS | ({"/metrics"} if broker.config.admin_metrics_open else set())
        throttle = FailureThrottle()  # failed logins per client address
        open_paths |= CONSOLE_PATHS  # the console's page and files: no data, which its calls fetch

        @app.middleware("http")
        async def check_login(request: Request, call_next: Callable[[Request], Awaitable[Any]]) -> Any:
            path = request.url.path
            if path in open_paths:
                return await call_next(request)
            peer = request.client.host if request.client else None
            authorization = request.headers.get("authorization")
            token = bearer_token(authorization)
            user = tokens.user(gate, token) if token is not None else None
            if user is None and authorization and _from_another_site(request):
                # A page on another site can make the browser send a Basic header (a navigation to
                # http://user:password@host/...): refused unread and not counted by the throttle,
                # or such a page would lock the operator's own address out of password logins
                gate.failures["admin"] += 1
                gate.audit("failure", "admin API login from another site's page refused: %s %s from %s",
                           request.method, path, peer)  # fmt: skip
                return JSONResponse(
                    {"error": "FORBIDDEN", "message": "a login sent by another site's page is refused"},
                    status_code=403,
                )
            # The throttle guards passwords: a valid token (not guessable) is honoured while the
            # address waits, and a request with no credentials guesses nothing (a page on another
            # site can send those): neither locks the operator out
            if user is None and authorization:
                wait_s = throttle.wait_s(peer)
                if wait_s > 0:
                    return JSONResponse(
                        {"error": "TOO_MANY_REQUESTS", "message": "too many failed logins from this address"},
                        status_code=429,
                        headers={"Retry-After": str(max(1, round(wait_s)))},
                    )
                user = basic_user(gate, authorization) if token is None else None
                if user is None:
                    throttle.failed(peer)
            if user is None:
                gate.failures["admin"] += 1
                gate.audit("failure", "admin API login failed: %s %s from %s", request.method, path, peer)
                # the console logs in itself: a browser's own Basic prompt would pop up over it
                console = request.headers.get("x-siftmq-console") == "1"
                return JSONResponse(
                    {"error": "UNAUTHORIZED", "message": "a user and password of the broker are needed"},
                    status_code=401,
                    headers={} if console else {"WWW-Authenticate": 'Basic realm="siftmq"'},
                )
            request.state.user = user
            if needs_super(path):
                resource, action, allowed = "users and ACLs", Action.UPDATE, user.super_user
            elif path == "/tokens":
                resource, action, allowed = "", Action.GET, True  # a login's own token
            else:
                allowed = True
                needs = admin_actions(request.method, path, request.query_params.get("topic"))
                for resource, action in needs:
                    allowed = may(request, resource, action)
                    if not allowed:
                        break
            if not allowed:
                gate.denials[action.value] += 1
                line = "admin API denied %s %s: user %s may not %s %s (from %s)"
                gate.audit("denial", line, request.method, path, user.name, action, resource, peer)
                return JSONResponse(
                    {"error": "FORBIDDEN", "message": f"user {user.name} may not {action} {resource}"},
                    status_code=403,
                )
            return await call_next(request)

    app.include_router(users_router(gate, tokens))

    app.include_router(inspect_router(broker, history, may))
    app.include_router(console_router())

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default answer repeats each bad field's input: a password among them
        problems = [
            f"{'.'.join(str(p) for p in error.get('loc', ()))}: {error.get('msg', 'invalid')}"
            for error in exc.errors()
        ]
        return JSONResponse({"error": "BAD_REQUEST", "message": "; ".join(problems)[:2000]}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the API's own shape for the framework's answers too: an unknown route, a body that is
        # not JSON it can read (FastAPI says only "There was an error parsing the body")
        code = {400: "BAD_REQUEST", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "ERROR")
        message = _unreadable_body(exc.__cause__) if exc.status_code == 400 else None
        return JSONResponse(
            {"error": code, "message": message or str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(SiftError)
    async def sift_error(request: Request, exc: SiftError) -> JSONResponse:
        code: str  # a wire status, or for other errors their own code
        if isinstance(exc, BrokerError):
            code = exc.status
            http = _HTTP_STATUS.get(code, 404 if isinstance(exc, NotFoundError) else 400)
        elif isinstance(exc, FilterError):
            code, http = StatusCode.ILLEGAL_FILTER_EXPRESSION, 400
        else:
            code, http = exc.code, 500
        return JSONResponse({"error": code, "message": exc.message}, status_code=http)

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError) -> JSONResponse:
        if caused_by_full_disk(exc):  # a state file the change writes; nothing of it is in force
            _log.warning("%s %s failed: the disk is full (%s)", request.method, request.url.path, exc)
            message = "the broker's disk is full: the change could not be written; retry once there is room"
            return JSONResponse({"error": "DISK_FULL", "message": message}, status_code=507)
        _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "INTERNAL_ERROR", "message": "internal error; see the broker log"}, 500)

    # ----------------------------------------------------------------------------------- topics

    def describe_topic(name: str) -> dict[str, Any]:
        cfg = broker.topics.existing(name)
        queues = [
            {"queue_id": q, "min_offset": broker.store.get_min_offset_in_queue(name, q),
             "max_offset": broker.store.get_max_offset_in_queue(name, q)}
            for q in range(cfg.queue_nums)
        ]  # fmt: skip
        return {"name": cfg.name, "queue_nums": cfg.queue_nums, "perm": cfg.perm, "queues": queues,
                "messages": sum(int(q["max_offset"]) - int(q["min_offset"]) for q in queues),
                "sent": broker.stats.snapshot(broker.stats.sends).get(cfg.name, 0)}  # fmt: skip

    def topic_figures(topics: list[TopicConfig], readable: set[str]) -> list[dict[str, Any]]:
        """``topics`` as listed, with its messages and sends when in ``readable`` (the user may Get
        it; ``"readable": false`` otherwise): what the console's Topics page shows, in one call
        rather than one a topic."""
        store, sent = broker.store, broker.stats.snapshot(broker.stats.sends)
        out: list[dict[str, Any]] = []
        for t in topics:
            row: dict[str, Any] = {"name": t.name, "queue_nums": t.queue_nums, "perm": t.perm}
            if t.name in readable:
                messages = sum(
                    store.get_max_offset_in_queue(t.name, q) - store.get_min_offset_in_queue(t.name, q)
                    for q in range(t.queue_nums)
                )
                row.update(readable=True, messages=messages, sent=sent.get(t.name, 0))
            else:
                row["readable"] = False
            out.append(row)
        return out

    @app.get("/topics")
    async def list_topics(request: Request, figures: bool = False) -> list[dict[str, Any]]:
        if figures:
            topics = broker.topics.all()
            readable = await readable_topics(request, [t.name for t in topics])
            rows: list[dict[str, Any]] = await call(topic_figures, topics, readable)
            return rows
        return [{"name": t.name, "queue_nums": t.queue_nums, "perm": t.perm} for t in broker.topics.all()]

    @app.post("/topics", status_code=201)
    async def create_topic(body: TopicCreate) -> dict[str, Any]:
        await call(broker.topics.create, body.name, body.queue_nums, perm=body.perm)
        topic: dict[str, Any] = await call(describe_topic, body.name)
        return topic

    @app.get("/topics/{name}")
    async def get_topic(name: str) -> dict[str, Any]:
        topic: dict[str, Any] = await call(describe_topic, name)
        return topic

    @app.patch("/topics/{name}")
    async def update_topic(name: str, body: TopicUpdate) -> dict[str, Any]:
        await call(broker.topics.update, name, queue_nums=body.queue_nums, perm=body.perm)
        topic: dict[str, Any] = await call(describe_topic, name)
        return topic

    @app.delete("/topics/{name}", status_code=204)
    async def delete_topic(name: str) -> Response:
        await call(deletion.delete_topic, broker, name)
        return Response(status_code=204)

    # ----------------------------------------------------------------------------------- groups

    @app.get("/groups")
    async def list_groups() -> list[dict[str, Any]]:
        live = {s.group for s in broker.clients.sessions() if s.group}
        names = sorted({g.name for g in broker.groups.all()} | live)
        out = []
        for name in names:
            info = broker.groups.get(name)
            out.append({
                "group": name, "mode": info.mode if info else "clustering",
                "consistency": info.consistency if info else "strict",
                "clients": len(broker.clients.live_ids(name)),
                "topics": sorted(info.subscriptions) if info else [],
                "inconsistencies": info.inconsistencies if info else 0,
            })  # fmt: skip
        return out

    def readable_report(request: Request, report: dict[str, Any]) -> dict[str, Any]:
        """``report`` without the topics the user may not Get: a subscription's lag and filter
        counts are that topic's data, and the login checked only the group. The last conflict
        names its topic and both expressions: it goes too when it concerns such a topic."""
        readable = functools.partial(may_get_topic, may, request)
        report["subscriptions"] = [s for s in report["subscriptions"] if readable(s["topic"])]
        conflict_topic = report["last_inconsistency_topic"]
        if conflict_topic is not None and not readable(conflict_topic):
            report["last_inconsistency"] = report["last_inconsistency_topic"] = None
        for member in report["clients"]:
            member["subscriptions"] = {t: e for t, e in member["subscriptions"].items() if readable(t)}
        return report

    @app.get("/groups/{group}")
    async def get_group(request: Request, group: str) -> dict[str, Any]:
        report: dict[str, Any] = await call(broker.group_report, group)
        return readable_report(request, report)

    @app.patch("/groups/{group}")
    async def update_group(request: Request, group: str, body: GroupUpdate) -> dict[str, Any]:
        await call(broker.configure_group, group, mode=body.mode, consistency=body.consistency)
        report: dict[str, Any] = await call(broker.group_report, group)
        return readable_report(request, report)

    @app.delete("/groups/{group}", status_code=204)
    async def remove_group(group: str) -> Response:
        await call(deletion.delete_group, broker, group)
        return Response(status_code=204)

    @app.put("/groups/{group}/subscriptions/{topic}")
    async def set_subscription(group: str, topic: str, body: SubscriptionSet) -> dict[str, Any]:
        entry = await call(
            broker.set_group_subscription, group, Subscription(topic, body.type, body.expression)
        )
        return {"group": group, "topic": topic, "type": entry.kind, "expression": entry.expression,
                "version": entry.version}  # fmt: skip

    @app.put("/groups/{group}/programs/{topic}")
    async def set_program(group: str, topic: str, body: ProgramSet) -> dict[str, Any]:
        program = await call(broker.set_program, group, topic, body.source, body.sample)
        return {"group": group, "topic": topic, "version": program.version, "sha256": program.sha256}

    @app.get("/groups/{group}/programs/{topic}")
    async def get_program(group: str, topic: str) -> dict[str, Any]:
        return broker.programs.report(group, topic)

    @app.delete("/groups/{group}/programs/{topic}", status_code=204)
    async def delete_program(group: str, topic: str) -> Response:
        await call(broker.programs.remove, group, topic)
        return Response(status_code=204)

    @app.get("/groups/{group}/lag/{topic}")
    async def get_lag(group: str, topic: str) -> list[dict[str, object]]:
        broker.existing_group(group)
        rows: list[dict[str, object]] = await call(broker.lag, group, topic)
        return rows

    # --------------------------------------------------------------------------------- messages

    # a message id may hold "/" (any printable ASCII), and the server decodes %2F before routing
    @app.get("/messages/{message_id:path}")
    async def message_by_id(request: Request, message_id: str, body: bool = False) -> dict[str, Any]:
        msg = await call(broker.store.query_message_by_uniq_key, message_id)
        # the route's own check is Get on the Cluster (or on ?topic=): the message's topic decides
        if msg is None or not may(request, f"Topic:{msg.topic}", Action.GET):
            raise NotFoundError(f"no message with id {message_id!r}", status=StatusCode.MESSAGE_NOT_FOUND)
        return message_view(msg, body=body)

    @app.get("/messages")
    async def messages_by_key(
        topic: str, key: str, limit: int = 32, body: bool = False
    ) -> list[dict[str, Any]]:
        if not 1 <= limit <= 1000:
            raise BadRequestError("limit must be in 1..1000")
        found = await call(broker.store.query_messages_by_key, topic, key, limit)
        return [message_view(m, body=body) for m in found]

    @app.get("/topics/{name}/queues/{queue_id}/messages/{offset}")
    async def message_at(name: str, queue_id: int, offset: int, body: bool = False) -> dict[str, Any]:
        check_queue(broker.topics.existing(name), queue_id)
        result = await call(broker.store.get_messages, "", name, queue_id, offset, 1, None)
        if not result.messages or result.messages[0].queue_offset != offset:
            raise NotFoundError(
                f"no message at {name}:{queue_id}@{offset}", status=StatusCode.MESSAGE_NOT_FOUND
            )
        return message_view(result.messages[0], body=body)

    # ---------------------------------------------------------------------------------- metrics

    @app.get("/metrics")
    async def metrics() -> Response:
        data = await asyncio.to_thread(generate_latest, registry)
        return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "warnings": list(warnings or [])}

    return app


class BrokerCollector(Collector):
    """Reads the broker's counters at scrape time."""

    def __init__(
        self, broker: Broker, gate: Gate | None = None, front_ends: Callable[[], dict[str, int]] | None = None
    ) -> None:
        self.broker = broker
        self.gate = gate
        self.front_ends = front_ends
        # (group, topic) -> (matching lag, when it was counted); see _lags
        self._lags: dict[tuple[str, str], tuple[int, float]] = {}

    def _lags_of(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The matching lag of each (group, topic). Counting one reads up to 200,000 index entries,
        so a scrape counts, the longest-uncounted first, until :data:`LAG_BUDGET_S` has passed (at
        least one), and reports the others as last counted: with thousands of groups a scrape
        stays short (it took 10 s at 6,300 groups, past Prometheus's default timeout) and every
        lag is fresh within a few scrapes. A pair not counted yet is left out until it is."""
        known = {pair: self._lags[pair] for pair in pairs if pair in self._lags}
        started = time.monotonic()
        for n, pair in enumerate(sorted(pairs, key=lambda p: known.get(p, (0, -1.0))[1])):
            if n and time.monotonic() - started >= LAG_BUDGET_S:
                break
            rows = self.broker.lag(*pair, max_scan=200_000)
            known[pair] = (sum(int(str(r["matching_lag"])) for r in rows), time.monotonic())
        self._lags = known  # pairs gone (groups or topics deleted) go with it
        return {pair: value for pair, (value, _) in known.items()}

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.broker.stats
        sends = CounterMetricFamily("siftmq_messages_sent", "Messages stored, by topic", labels=["topic"])
        sent_bytes = CounterMetricFamily("siftmq_message_bytes_sent", "Body bytes stored, by topic",
                                         labels=["topic"])  # fmt: skip
        dups = CounterMetricFamily("siftmq_duplicate_sends", "Sends recognised as retries", labels=["topic"])
        sent_bytes_by_topic = stats.snapshot(stats.send_bytes)
        for topic, n in stats.snapshot(stats.sends).items():
            sends.add_metric([topic], n)
            sent_bytes.add_metric([topic], sent_bytes_by_topic.get(topic, 0))
        for topic, n in stats.snapshot(stats.duplicates).items():
            dups.add_metric([topic], n)
        deliveries = CounterMetricFamily("siftmq_messages_delivered", "Deliveries", labels=["group", "topic"])
        for (group, topic), n in stats.snapshot(stats.deliveries).items():
            deliveries.add_metric([group, topic], n)
        delivered_bytes = CounterMetricFamily(
            "siftmq_message_bytes_delivered",
            "Body bytes delivered (receive and pull)",
            labels=["group", "topic"],
        )
        for (group, topic), n in stats.snapshot(stats.delivered_bytes).items():
            delivered_bytes.add_metric([group, topic], n)
        acks = CounterMetricFamily("siftmq_messages_acked", "Acknowledgements", labels=["group", "topic"])
        for (group, topic), n in stats.snapshot(stats.acks).items():
            acks.add_metric([group, topic], n)
        dlq = CounterMetricFamily("siftmq_dead_letters", "Messages moved to %DLQ%<group>", labels=["group"])
        for group, n in stats.snapshot(stats.dead_letters).items():
            dlq.add_metric([group], n)
        deleted = CounterMetricFamily(
            "siftmq_messages_deleted_unconsumed",
            "Messages a group had not consumed when retention deleted them for space (delete_oldest)",
            labels=["group"],
        )
        for group, n in stats.snapshot(stats.deleted_unconsumed).items():
            deleted.add_metric([group], n)
        disk = self.broker.store.disk.state()
        disk_used = GaugeMetricFamily("siftmq_disk_used_ratio", "Used share of the disk holding the store")
        disk_used.add_metric([], disk.used_ratio)
        disk_refusing = GaugeMetricFamily(
            "siftmq_disk_refusing_sends", "1 while the disk is past its high-water mark or reserve"
        )
        disk_refusing.add_metric([], 1 if disk.full else 0)
        work = CounterMetricFamily(
            "siftmq_filter_work", "Filter work by stage", labels=["group", "topic", "stage"]
        )
        for (group, topic), fs in stats.filters().items():
            for stage, n in fs.as_dict().items():
                work.add_metric([group, topic, stage], n)
        inconsistent = CounterMetricFamily(
            "siftmq_subscription_inconsistencies",
            "Inconsistent subscriptions seen (compat groups)",
            labels=["group"],
        )
        lag = GaugeMetricFamily(
            "siftmq_consumer_lag_matching",
            "Matching messages behind, per group and topic",
            labels=["group", "topic"],
        )
        pairs = []
        for info in self.broker.groups.all():
            inconsistent.add_metric([info.name], info.inconsistencies)
            pairs += [
                (info.name, t) for t in list(info.subscriptions) if self.broker.topics.get(t) is not None
            ]
        for (group, topic), behind in self._lags_of(pairs).items():
            lag.add_metric([group, topic], behind)
        store = GaugeMetricFamily("siftmq_commit_log_bytes", "Bytes in the CommitLog")
        store.add_metric([], self.broker.store.commit_log_bytes)
        damaged = CounterMetricFamily(
            "siftmq_damaged_records_skipped",
            "Records reads passed over because their bytes are damaged (siftmq store check lists them)",
        )
        damaged.add_metric([], self.broker.store.damaged_reads)
        repairs = CounterMetricFamily(
            "siftmq_index_repairs",
            "Index entries (ConsumeQueue entries, extension units) the store's start found disagreeing "
            "with their CommitLog records and rewrote from them, and queues it rebuilt",
            labels=["what"],
        )
        repaired = self.broker.store.index_repairs
        repairs.add_metric(["entry"], repaired.entries)
        repairs.add_metric(["ext_unit"], repaired.ext_units)
        repairs.add_metric(["queue"], repaired.queues_rebuilt)
        clients = GaugeMetricFamily("siftmq_clients", "Live client sessions")
        clients.add_metric([], len(self.broker.clients.sessions()))
        yield from (sends, sent_bytes, dups, deliveries, delivered_bytes, acks, dlq, work)
        yield from (inconsistent, lag, store, clients, deleted, disk_used, disk_refusing, damaged, repairs)
        yield from self._programs()
        if self.front_ends is not None:
            counts = self.front_ends()
            processes = GaugeMetricFamily(
                "siftmq_front_ends",
                "gRPC front-end processes (--workers): configured, and connected to the core now",
                labels=["state"],
            )
            processes.add_metric(["configured"], counts["configured"])
            processes.add_metric(["connected"], counts["connected"])
            restarts = CounterMetricFamily(
                "siftmq_front_end_restarts", "Front-end processes started again after they died"
            )
            restarts.add_metric([], counts["restarts"])
            yield from (processes, restarts)
        if self.gate is not None:
            failures = CounterMetricFamily(
                "siftmq_auth_failures", "Calls refused as not authenticated", labels=["reason"]
            )
            for reason, n in sorted(self.gate.failures.items()):
                failures.add_metric([reason], n)
            denials = CounterMetricFamily(
                "siftmq_authz_denials", "Calls refused by the ACL policies", labels=["action"]
            )
            for action, n in sorted(self.gate.denials.items()):
                denials.add_metric([action], n)
            yield from (failures, denials)

    def _programs(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        work = CounterMetricFamily(
            "siftmq_filter_program_work",
            "Filter program work by kind (evaluated, matched, errors, timeouts, worker_restarts)",
            labels=["group", "topic", "kind"],
        )
        held = GaugeMetricFamily(
            "siftmq_filter_program_held",
            "1 while a group's filter program is suspended or failed (the group receives nothing)",
            labels=["group", "topic", "status"],
        )
        for program in self.broker.programs.all():
            for kind, n in self.broker.programs.counters(program).items():
                work.add_metric([program.group, program.topic, kind], n)
            held.add_metric([program.group, program.topic, program.status], int(program.status != "active"))
        yield from (work, held)


def _serves_loopback(listen: str) -> bool:
    """Whether the admin API listens on a loopback address only."""
    if not listen:
        return False
    host = parse_listen(listen)[0]
    return _loopback_name(host)


def _loopback_name(host: str) -> bool:
    """Whether a Host header (or address) names this machine's loopback: localhost, 127.x, ::1."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost":
        return True
    try:  # an address, not a name that merely starts like one (127.0.0.1.attacker.example)
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _from_another_site(request: Request) -> bool:
    """A request a page of another site may have caused, as the browser says (``Sec-Fetch-*``; the
    CLI and other tools send none): one made for another site's page (or another port of this
    host), or a same-origin request no script of the console makes — the icon the browser fetches
    for a page another site navigated to here, sent with that navigation's credentials. Left: a
    tool's request, an address typed by the user (``none``), the console's own calls and a
    same-origin navigation."""
    site = request.headers.get("sec-fetch-site", "").lower()
    if site in ("", "none"):
        return False
    mode = request.headers.get("sec-fetch-mode", "").lower()
    return site != "same-origin" or mode not in ("cors", "same-origin", "navigate")


def _unreadable_body(cause: BaseException | None) -> str | None:
    """What made a request body unreadable as JSON, said without repeating it."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8: byte {cause.start} cannot be decoded"
    if isinstance(cause, RecursionError):
        return "the body's JSON nests too deeply"
    if cause is not None:
        return "the body could not be read as JSON"
    return None


def _own_request(request: Request) -> bool:
    """A request a web page of another site cannot have made without a CORS preflight."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    headers = request.headers
    return content_type == "application/json" or "x-siftmq-client" in headers or "x-siftmq-console" in headers
