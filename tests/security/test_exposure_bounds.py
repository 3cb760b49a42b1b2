"""Bounds found by a security review, against a real broker process: a group's admin rights do not
reach the topics its routes name, a request body is bounded, a loopback admin API answers to
loopback host names only (a page using DNS rebinding names itself), failed logins are throttled,
and a client id belongs to the user who first used it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from security_users import ALICE, ROOT, auth_file
from siftmq.server.http_limits import MAX_REQUEST_BYTES

pytestmark = pytest.mark.integration


def test_a_groups_routes_need_get_on_the_topic_they_name(start_broker: Any, tmp_path: Path) -> None:
    """Alice may only Get and Update her group: trying a program on Payroll's newest message, or
    reading the group's lag there, would tell her what she may not read."""
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(auth_file([{"resource": ["Group:alice-g"], "actions": ["Get", "Update"]}])))
    broker = start_broker(
        "data",
        config={"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(path)},
    )
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT) as root:
        assert root.post("/topics", json={"name": "Payroll"}).status_code == 201
    program = {"source": "def match(message):\n    raise ValueError(message.body)\n"}
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ALICE) as alice:
        for method, route, body in (
            ("PUT", "/groups/alice-g/programs/Payroll", program),
            ("GET", "/groups/alice-g/lag/Payroll", None),
            ("PUT", "/groups/alice-g/subscriptions/Payroll", {"type": "TAG", "expression": "*"}),
        ):
            answer = alice.request(method, route, json=body)
            assert answer.status_code == 403, (route, answer.text)
            assert "may not Get Topic:Payroll" in answer.json()["message"]
        assert alice.get("/groups/alice-g").status_code != 403  # her group itself she may


def test_a_groups_reports_leave_out_topics_the_user_may_not_get(start_broker: Any, tmp_path: Path) -> None:
    """The routes reporting on every topic a group reads (its report, programs and lag history) are
    checked on the group only: alice, with rights on her group and on Public but not on Payroll,
    sees Public's lag, program and history and nothing of Payroll's; root sees both."""
    path = tmp_path / "auth.json"
    alice_may = [
        {"resource": ["Group:alice-g"], "actions": ["Get", "Update"]},
        {"resource": ["Topic:Public"], "actions": ["Get"]},
    ]
    path.write_text(json.dumps(auth_file(alice_may)))
    config = {
        "authentication_enabled": True, "authorization_enabled": True, "auth_file": str(path),
        "filter_server_nums": 1,
    }  # fmt: skip
    broker = start_broker("data", config=config)
    program = {"source": "def match(message):\n    return True\n", "sample": {"body": "x"}}
    with httpx.Client(base_url=broker.admin_url, timeout=30, auth=ROOT) as root:
        for topic in ("Payroll", "Public"):
            assert root.post("/topics", json={"name": topic}).status_code == 201
            sub = {"type": "TAG", "expression": "*"}
            assert root.put(f"/groups/alice-g/subscriptions/{topic}", json=sub).status_code == 200
            assert root.put(f"/groups/alice-g/programs/{topic}", json=program).status_code == 200

        def topics_seen(http: httpx.Client) -> dict[str, list[str]]:
            report = http.get("/groups/alice-g").json()
            changed = http.patch("/groups/alice-g", json={"consistency": "compat"}).json()
            return {
                "report": [s["topic"] for s in report["subscriptions"]],
                "changed": [s["topic"] for s in changed["subscriptions"]],
                "programs": sorted(p["topic"] for p in http.get("/groups/alice-g/programs").json()),
                "lag-history": sorted(http.get("/groups/alice-g/lag-history").json()),
            }

        routes = ("report", "changed", "programs", "lag-history")
        assert topics_seen(root) == {route: ["Payroll", "Public"] for route in routes}
        with httpx.Client(base_url=broker.admin_url, timeout=30, auth=ALICE) as alice:
            assert topics_seen(alice) == {route: ["Public"] for route in routes}


def test_a_groups_last_conflict_on_a_topic_the_user_may_not_get_is_left_out(
    start_broker: Any, tmp_path: Path
) -> None:
    """The last subscription conflict of a compat group names its topic and both expressions: alice,
    who may Get the group and Public but not Payroll, is not shown one on Payroll; on Public she is."""
    import asyncio

    from siftmq.client import FilterExpression, SimpleConsumer

    path = tmp_path / "auth.json"
    alice_may = [
        {"resource": ["Group:alice-g"], "actions": ["Get", "Update"]},
        {"resource": ["Topic:Public"], "actions": ["Get"]},
    ]
    path.write_text(json.dumps(auth_file(alice_may)))
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(path)}
    broker = start_broker("data", config=config)

    def conflict(topic: str, tag: str) -> None:  # a member asking for another expression than the group's
        async def go() -> None:
            creds = {"access_key": ROOT[0], "secret_key": ROOT[1], "await_duration": 1}
            subscription = {topic: FilterExpression.tag(tag)}
            async with SimpleConsumer(broker.endpoint, "alice-g", subscription, **creds) as c:
                await c.receive(1, 30)

        asyncio.run(go())

    def seen(http: httpx.Client) -> list[Any]:
        report = http.get("/groups/alice-g").json()
        changed = http.patch("/groups/alice-g", json={"consistency": "compat"}).json()
        return [(r["last_inconsistency"], r.get("last_inconsistency_topic")) for r in (report, changed)]

    with (
        httpx.Client(base_url=broker.admin_url, timeout=30, auth=ROOT) as root,
        httpx.Client(base_url=broker.admin_url, timeout=30, auth=ALICE) as alice,
    ):
        for topic in ("Payroll", "Public"):
            assert root.post("/topics", json={"name": topic, "queue_nums": 1}).status_code == 201
            sub = {"type": "SQL92", "expression": "customer = 'merger-2027'"}
            assert root.put(f"/groups/alice-g/subscriptions/{topic}", json=sub).status_code == 200
        assert root.patch("/groups/alice-g", json={"consistency": "compat"}).status_code == 200

        conflict("Payroll", "layoffs")
        ((text, topic), _) = seen(root)
        assert "layoffs" in text and "merger-2027" in text
        assert seen(alice) == [(None, None)] * 2
        assert topic == "Payroll"
        assert alice.get("/groups/alice-g").json()["inconsistencies"] == 1  # a count names nothing

        conflict("Public", "everyone")
        ((text, topic), _) = seen(alice)
        assert topic == "Public" and "everyone" in text


def test_a_request_body_past_the_bound_is_refused_and_the_broker_serves_on(start_broker: Any) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.admin_url, timeout=30) as http:
        big = b'{"expression": "' + b"a" * (MAX_REQUEST_BYTES + 1) + b'"}'
        try:
            answer = http.post("/filter/check", content=big, headers={"content-type": "application/json"})
            assert answer.status_code == 413 and answer.json()["error"] == "REQUEST_TOO_LARGE"
        except httpx.TransportError:
            pass  # closed while the client was still sending: refused all the same
        assert http.get("/healthz").status_code == 200


def test_a_loopback_admin_api_answers_to_loopback_names_only(start_broker: Any) -> None:
    broker = start_broker()
    port = broker.admin_url.rsplit(":", 1)[1]
    with httpx.Client(base_url=broker.admin_url, timeout=10) as http:
        rebound = f"127.0.0.1.attacker.example:{port}"  # a name that merely starts like a loopback address
        for host in ("attacker.example", f"attacker.example:{port}", "10.0.0.1", rebound):
            answer = http.post("/topics", json={"name": "Rebound"}, headers={"host": host})
            assert answer.status_code == 403, host
        assert http.get("/topics/Rebound").status_code == 404  # nothing was created
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
            assert http.get("/healthz", headers={"host": host}).status_code == 200, host


def test_failed_logins_from_one_address_are_throttled(start_broker: Any, tmp_path: Path) -> None:
    """Password guesses are throttled per address; a request carrying no credentials, or a valid
    token, neither counts nor is held back."""
    from siftmq.auth.throttle import FAILURES as LOGIN_FAILURES

    path = tmp_path / "auth.json"
    path.write_text(json.dumps(auth_file([])))
    broker = start_broker("data", config={"authentication_enabled": True, "auth_file": str(path)})
    with httpx.Client(base_url=broker.admin_url, timeout=10) as http:
        # requests without credentials guess no password (a page on another site can send them):
        # they do not lock the operator out
        anonymous = [http.get("/overview").status_code for _ in range(3 * LOGIN_FAILURES)]
        assert anonymous == [401] * (3 * LOGIN_FAILURES)
        token = http.post("/tokens", auth=ROOT, headers={"x-siftmq-client": "1"}).json()["token"]
        wrong = [http.get("/topics", auth=(ROOT[0], f"guess-{i}")).status_code for i in range(LOGIN_FAILURES)]
        assert wrong == [401] * LOGIN_FAILURES
        throttled = http.get("/topics", auth=ROOT)  # the right password too, from this address, for now
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        bad_token = http.get("/topics", headers={"authorization": "Bearer not-a-token"})
        assert bad_token.status_code == 429
        # a token issued before is not guessable: the console logged in already keeps working
        assert http.get("/topics", headers={"authorization": f"Bearer {token}"}).status_code == 200
        assert http.get("/healthz").status_code == 200  # what needs no login is served on


def test_a_client_id_belongs_to_the_user_who_first_used_it(start_broker: Any, tmp_path: Path) -> None:
    """Ending or taking over a client's session needs no right on any resource, so the id itself is
    guarded: alice may not act as root's client (end its session, open a stream as it)."""
    import asyncio

    from siftmq.client import FilterExpression, SimpleConsumer
    from siftmq.client.connection import Connection
    from siftmq.errors import RemoteForbidden
    from siftmq.protocol import rocketmq_v2_pb2 as pb

    path = tmp_path / "auth.json"
    path.write_text(json.dumps(auth_file([])))
    broker = start_broker(
        "data", config={"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(path)}
    )

    victim = "victim-" + "1" * 249  # as long as the broker keeps a client id (256)

    async def scenario() -> None:
        creds = {"access_key": ROOT[0], "secret_key": ROOT[1], "client_id": victim}
        async with SimpleConsumer(broker.endpoint, "svc", {"Svc": FilterExpression.tag()}, **creds):
            # the id itself, and a longer one the broker cuts to it
            for claimed in (victim, victim + "-more"):
                alice = Connection(
                    broker.endpoint, access_key=ALICE[0], secret_key=ALICE[1], client_id=claimed
                )
                try:
                    with pytest.raises(RemoteForbidden, match="belongs to another user"):
                        await alice.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest())
                finally:
                    await alice.close()
            with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT) as root:
                clients = root.get("/groups/svc").json()
            assert victim in json.dumps(clients)  # its session is still there

    asyncio.run(scenario())


def test_a_post_a_web_page_could_make_is_refused(start_broker: Any) -> None:
    """A page of another site can make the browser POST a form here (no preflight), with its
    cached login or — with authentication off on loopback — none at all: such a POST is refused."""
    broker = start_broker()
    resend = "/topics/%25DLQ%25g/queues/0/messages/0/resend"
    with httpx.Client(base_url=broker.admin_url, timeout=10) as http:
        forms = ({"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}, {})
        for headers in forms:
            answer = http.post(resend, content=b"a=1" if headers else b"", headers=headers)
            assert answer.status_code == 403 and "X-Siftmq-Client" in answer.json()["message"], headers
        own = http.post(resend, headers={"X-Siftmq-Client": "test"})  # reaches the route: no such topic
        assert own.status_code == 404


def test_a_topic_named_like_a_route_needs_its_requests_action(start_broker: Any, tmp_path: Path) -> None:
    """A topic named ``resend`` is a topic: deleting it needs Delete, reading it Get, whatever a
    dead-letter resend (POST /topics/{t}/queues/{q}/messages/{o}/resend, Update) needs."""
    path = tmp_path / "auth.json"
    alice_may = [
        {"resource": ["Topic:resend"], "actions": ["Update"]},
        {"resource": ["Topic:try"], "actions": ["Get"]},
    ]
    path.write_text(json.dumps(auth_file(alice_may)))
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(path)}
    broker = start_broker("data", config=config)
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT) as root:
        for name in ("resend", "try"):
            assert root.post("/topics", json={"name": name, "queue_nums": 1}).status_code == 201
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ALICE) as alice:
        deleted = alice.delete("/topics/resend")
        assert deleted.status_code == 403 and "may not Delete Topic:resend" in deleted.json()["message"]
        read = alice.get("/topics/resend")
        assert read.status_code == 403 and "may not Get Topic:resend" in read.json()["message"]
        assert alice.patch("/topics/resend", json={"perm": 6}).status_code == 200  # Update: hers
        assert alice.get("/topics/try").status_code == 200
        assert alice.delete("/topics/try").status_code == 403
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT) as root:
        assert {t["name"] for t in root.get("/topics").json()} >= {"resend", "try"}
