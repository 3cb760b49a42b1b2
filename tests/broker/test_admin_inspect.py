"""The admin API's inspection routes (what the console reads) against a real broker process: the
overview and its history, expressions checked and tried, queues browsed through a filter, dead
letters resent once; bad input answered with what is wrong and nothing changed; and the
authorization each route needs."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from siftmq.client import FilterExpression, Producer, PullConsumer
from siftmq.client.connection import Connection
from siftmq.server.admin_auth import admin_action

pytestmark = pytest.mark.integration
#: what siftmq's own callers send: a POST without a JSON body needs it (see the admin API)
OWN = {"X-Siftmq-Client": "test"}

TOPIC = "Inspect"


def send(endpoint: str, n: int) -> None:
    async def go() -> None:
        async with Producer(endpoint) as p:
            await p.send_many([
                p.message(TOPIC, json.dumps({"i": i}).encode(), tag="A" if i % 2 else "B",
                          properties={"region": "eu" if i % 3 == 0 else "us"})
                for i in range(n)
            ])  # fmt: skip

    asyncio.run(go())


@pytest.fixture
def broker(start_broker: Any) -> Any:
    b = start_broker()
    httpx.post(f"{b.admin_url}/topics", json={"name": TOPIC, "queue_nums": 1}, timeout=10).raise_for_status()
    send(b.endpoint, 30)
    return b


def test_check_try_and_browse_answer_with_the_broker_engine(broker: Any) -> None:
    with httpx.Client(base_url=broker.admin_url, timeout=30, headers=OWN) as api:
        ok = api.post("/filter/check", json={"type": "SQL92", "expression": "region  =  'eu'"}).json()
        assert ok == {"valid": True, "type": "SQL92", "normalized": "region = 'eu'"}
        bad = api.post("/filter/check", json={"type": "SQL92", "expression": "a = 1 AND\n  b >> 2"}).json()
        assert bad["valid"] is False and (bad["error"]["line"], bad["error"]["column"]) == (2, 6)
        assert "^" in bad["error"]["message"]
        assert api.post("/filter/check", json={"type": "TAG", "expression": "A || B"}).json()["valid"]
        tried = api.post(
            f"/topics/{TOPIC}/try", json={"type": "SQL92", "expression": "region = 'eu'", "last": 12}
        ).json()
        assert (tried["tried"], tried["matched"]) == (12, 4) and tried["selectivity"] == pytest.approx(1 / 3)
        shown = api.get(f"/topics/{TOPIC}/queues/0/browse", params={"offset": 18, "count": 12}).json()
        newest = [json.loads(base64.b64decode(m["body_base64"])) for m in shown["messages"]]
        assert [m["i"] for m in newest] == list(range(18, 30))
        assert tried["body_bytes"] - tried["body_bytes_saved"] == sum(
            len(json.dumps(m)) for m in newest if m["i"] % 3 == 0
        )
        tag_a = {"type": "TAG", "expression": "A"}
        page = api.get(f"/topics/{TOPIC}/queues/0/browse", params={"count": 4, **tag_a}).json()
        # the next browse starts at the first message not looked at
        assert [m["queue_offset"] for m in page["messages"]] == [1, 3, 5, 7] and page["next_offset"] == 8
        more = {"offset": page["next_offset"], "count": 200, **tag_a}
        rest = api.get(f"/topics/{TOPIC}/queues/0/browse", params=more).json()
        assert [m["queue_offset"] for m in rest["messages"]] == list(range(9, 30, 2)) and rest[
            "next_offset"
        ] == 30
        history = api.get("/overview").json()
        assert history["sent"] == 30 and history["topics"] >= 1 and history["history"]
        sql = {"type": "SQL92", "expression": "region = 'eu'"}
        api.put(f"/groups/g-lag/subscriptions/{TOPIC}", json=sql).raise_for_status()
        lags = api.get("/groups/g-lag/lag-history").json()
        ((_, lag),) = lags[TOPIC]  # the first point, taken when asked for
        assert lag == sum(int(q["matching_lag"]) for q in api.get(f"/groups/g-lag/lag/{TOPIC}").json())
        assert api.get("/groups/nobody/lag-history").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("POST", "/filter/check", {"type": "XML", "expression": "a"}, 422, "type"),
        ("POST", "/filter/check", {"type": "SQL92", "expression": "x" * 70_000}, 422, "expression"),
        ("POST", f"/topics/{TOPIC}/try", {"type": "SQL92", "expression": "a = ", "last": 5}, 400, "column 5"),
        ("POST", f"/topics/{TOPIC}/try", {"type": "SQL92", "expression": "a = 1", "last": 5000}, 422, "last"),
        ("POST", "/topics/Nope/try", {"type": "SQL92", "expression": "a = 1"}, 404, "Nope"),
        ("GET", f"/topics/{TOPIC}/queues/0/browse?count=0", None, 400, "count"),
        ("GET", f"/topics/{TOPIC}/queues/0/browse?count=201", None, 400, "count"),
        ("GET", f"/topics/{TOPIC}/queues/0/browse?offset=-1", None, 400, "offset"),
        ("GET", f"/topics/{TOPIC}/queues/7/browse", None, 400, "queue 7"),
        ("GET", f"/topics/{TOPIC}/queues/0/browse?type=SQL92&expression=a%20%3D", None, 400, "column 4"),
        ("POST", f"/topics/{TOPIC}/queues/0/messages/0/resend", None, 400, "not a dead-letter topic"),
        ("POST", "/topics/%25DLQ%25nobody/queues/0/messages/0/resend", None, 404, "DLQ%nobody"),
        # a filter the browse cannot apply is refused, not left out (every message would be shown)
        (
            "GET",
            f"/topics/{TOPIC}/queues/0/browse?expression=region%20%3D%20%27eu%27",
            None,
            400,
            "expression needs a type",
        ),
        ("GET", f"/topics/{TOPIC}/queues/0/browse?type=SQL92&expression=", None, 400, "type SQL92 needs"),
        ("GET", f"/topics/{TOPIC}/queues/0/browse?type=SQL92", None, 400, "type SQL92 needs"),
        # a group unknown to the broker is unknown to each of its routes
        ("GET", f"/groups/nobody/lag/{TOPIC}", None, 404, "'nobody' is unknown"),
        ("GET", "/groups/nobody/lag-history", None, 404, "'nobody' is unknown"),
        ("GET", "/groups/nobody/programs", None, 404, "'nobody' is unknown"),
        ("POST", "/topics", {"name": "Flag", "queue_nums": True}, 422, "queue_nums"),
        ("PATCH", f"/topics/{TOPIC}", {"queue_nums": True}, 422, "queue_nums"),
        ("POST", f"/topics/{TOPIC}/try", {"type": "SQL92", "expression": "a = 1", "last": True}, 422, "last"),
        ("GET", f"/topics/{TOPIC}/queues/99/messages/0", None, 400, "queue 99 does not exist"),
    ],
)
def test_bad_input_is_answered_with_what_is_wrong(  # noqa: PLR0917 - the parameters
    broker: Any, method: str, path: str, body: Any, status: int, says: str
) -> None:
    with httpx.Client(base_url=broker.admin_url, timeout=30, headers=OWN) as api:
        r = api.request(method, path, json=body)
        assert r.status_code == status and says in r.json()["message"], r.text
        assert api.get(f"/topics/{TOPIC}").json()["messages"] == 30  # nothing changed
        assert api.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        (b'{"name": "\xff"}', "not UTF-8: byte 10"),
    ],
)
def test_a_body_that_cannot_be_read_is_answered_with_why(broker: Any, body: bytes, says: str) -> None:
    with httpx.Client(base_url=broker.admin_url, timeout=30, headers=OWN) as api:
        r = api.post("/topics", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json() == {"error": "BAD_REQUEST", "message": r.json()["message"]}
        assert says in r.json()["message"]
        unknown = api.get("/no-such-route")  # the framework's answers in the API's shape too
        assert unknown.status_code == 404 and unknown.json()["error"] == "NOT_FOUND"


def test_a_dead_letter_is_resent_to_its_origin_once(start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker(config={"filter_server_nums": 1})
    api = httpx.Client(base_url=broker.admin_url, timeout=30, headers=OWN)
    api.post("/topics", json={"name": TOPIC, "queue_nums": 1}).raise_for_status()
    send(broker.endpoint, 6)
    failing = (
        "import json\ndef match(m):\n"
        "    if json.loads(m.body)['i'] == 4:\n        raise KeyError('four')\n    return True\n"
    )
    api.put(
        f"/groups/g/programs/{TOPIC}", json={"source": failing, "sample": {"body": '{"i": 0}'}}
    ).raise_for_status()

    async def drain() -> int:
        async with PullConsumer(broker.endpoint, "g", TOPIC, FilterExpression.tag()) as c:
            return sum([len(await c.poll(32, timeout=0.3)) for _ in range(3)])

    assert asyncio.run(drain()) == 5
    assert api.get("/dead-letters").json() == [
        {"topic": "%DLQ%g", "group": "g", "queue_nums": 1, "messages": 1}
    ]
    first = api.post("/topics/%25DLQ%25g/queues/0/messages/0/resend").json()
    again = api.post("/topics/%25DLQ%25g/queues/0/messages/0/resend").json()
    assert first["topic"] == TOPIC and first["duplicate"] is False and again["duplicate"] is True
    assert again["message_id"] == first["message_id"]
    resent = api.get(f"/topics/{TOPIC}/queues/0/messages/6", params={"body": "true"}).json()
    assert json.loads(base64.b64decode(resent["body_base64"])) == {"i": 4}
    assert "FILTER_ERROR" not in resent["properties"] and "DLQ_ORIGIN_TOPIC" not in resent["properties"]
    assert resent["properties"]["region"] == "us" and resent["tag"] == "B"
    # every group on the topic gets the copy again: it names the first message for them
    original = api.get(f"/topics/{TOPIC}/queues/0/messages/4").json()
    assert resent["properties"]["RESENT_FROM_MESSAGE_ID"] == original["message_id"]
    api.close()


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/overview", ("Cluster", "Get")),
        ("POST", "/filter/check", ("Cluster", "Get")),  # changes nothing
        ("POST", "/topics/Orders/try", ("Topic:Orders", "Get")),
        ("GET", "/topics/Orders/queues/0/browse", ("Topic:Orders", "Get")),
        ("GET", "/dead-letters", ("Cluster", "List")),
        ("GET", "/groups/g/programs", ("Group:g", "Get")),
        ("POST", "/topics/%DLQ%g/queues/0/messages/3/resend", ("Topic:%DLQ%g", "Update")),
        # a topic named "resend" is no resend: its requests need what any topic's do
        ("DELETE", "/topics/resend", ("Topic:resend", "Delete")),
        ("GET", "/topics/resend", ("Topic:resend", "Get")),
        ("GET", "/topics/resend/queues/0/messages/0", ("Topic:resend", "Get")),
    ],
)
def test_each_inspection_route_needs_its_action(method: str, path: str, expected: tuple[str, str]) -> None:
    resource, action = admin_action(method, path, None)
    assert (resource, action.value) == expected


def test_inspection_routes_check_the_topics_they_reach(start_broker: Any, tmp_path: Path) -> None:
    """With authorization on: a message looked up by id needs Get on its own topic (whatever the
    route's ?topic says), and a dead letter resent needs Pub on its origin topic; an origin topic
    deleted since is not created again by a resend."""
    root, alice = ("root", "R00t-s3cret-pw"), ("alice", "Al1ce-s3cret-pw")
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({
        "users": [{"username": root[0], "password": root[1], "userType": "Super"},
                  {"username": alice[0], "password": alice[1], "userType": "Normal"}],
        "acls": [{"subject": "User:alice", "policies": [{"entries": [
            {"resource": ["Topic:Public"], "actions": ["Get"]},
            {"resource": ["Topic:%DLQ%g"], "actions": ["Get", "Update"]},
            {"resource": ["Cluster"], "actions": ["Get", "List"]},
        ]}]}],
    }))  # fmt: skip
    auth.chmod(0o600)
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth),
              "filter_server_nums": 1}  # fmt: skip
    broker = start_broker(config=config)
    with (
        httpx.Client(base_url=broker.admin_url, auth=root, timeout=30, headers=OWN) as as_root,
        httpx.Client(base_url=broker.admin_url, auth=alice, timeout=30, headers=OWN) as as_alice,
    ):
        for name in (TOPIC, "Public", "%DLQ%secret"):
            as_root.post("/topics", json={"name": name, "queue_nums": 1}).raise_for_status()
        failing = (
            "import json\ndef match(m):\n"
            "    if json.loads(m.body).get('i'):\n        raise ValueError('no')\n    return True\n"
        )
        program = {"source": failing, "sample": {"body": "{}"}}
        as_root.put(f"/groups/g/programs/{TOPIC}", json=program).raise_for_status()

        async def go() -> str:
            async with Producer(broker.endpoint, access_key=root[0], secret_key=root[1]) as p:
                await p.send(TOPIC, b'{"i": 1}', tag="A")
                await p.send(TOPIC, b'{"i": 2}', tag="A")
                secret = await p.send(TOPIC, b"{}", tag="A")  # kept by the program: no copy in the DLQ
            async with PullConsumer(broker.endpoint, "g", TOPIC, FilterExpression.tag(),
                                    access_key=root[0], secret_key=root[1]) as c:  # fmt: skip
                for _ in range(3):
                    await c.poll(32, timeout=0.3)
            return secret.message_id

        secret_id = asyncio.run(go())
        assert as_root.get(f"/messages/{secret_id}", params={"body": "true"}).status_code == 200
        for params in ({"body": "true"}, {"body": "true", "topic": "Public"}):
            assert as_alice.get(f"/messages/{secret_id}", params=params).status_code in (403, 404)
        # the dead-letter topics she may read; another group's held counts of its failures
        assert [row["topic"] for row in as_alice.get("/dead-letters").json()] == ["%DLQ%g"]
        assert {row["topic"] for row in as_root.get("/dead-letters").json()} == {"%DLQ%g", "%DLQ%secret"}
        refused = as_alice.post("/topics/%25DLQ%25g/queues/0/messages/0/resend")
        assert refused.status_code == 403 and f"Pub Topic:{TOPIC}" in refused.json()["message"]
        before = as_root.get(f"/topics/{TOPIC}").json()["messages"]
        assert as_root.post("/topics/%25DLQ%25g/queues/0/messages/0/resend").status_code == 200
        assert as_root.get(f"/topics/{TOPIC}").json()["messages"] == before + 1
        as_root.delete(f"/topics/{TOPIC}").raise_for_status()
        gone = as_root.post("/topics/%25DLQ%25g/queues/0/messages/1/resend")
        assert gone.status_code == 404 and "no longer exists" in gone.json()["message"]
        assert as_root.get(f"/topics/{TOPIC}").status_code == 404  # not created again


def test_trying_an_expression_takes_the_newest_messages_across_queues(start_broker: Any) -> None:
    broker = start_broker()
    httpx.post(
        f"{broker.admin_url}/topics", json={"name": "Many", "queue_nums": 4}, timeout=10
    ).raise_for_status()

    async def go() -> None:
        async with Producer(broker.endpoint) as p:
            for i in range(40):  # one send a message: they spread over the queues, in time order
                await p.send("Many", str(i).encode(), properties={"i": str(i)})

    asyncio.run(go())
    body = {"type": "SQL92", "expression": "i IN ('39', '37', '20')", "last": 10}
    tried = httpx.post(f"{broker.admin_url}/topics/Many/try", json=body, timeout=10).json()
    assert [m["properties"]["i"] for m in tried["messages"]] == [str(i) for i in range(39, 29, -1)]
    assert {q["queue_id"] for q in tried["messages"]} == {0, 1, 2, 3}
    assert (tried["matched"], tried["body_bytes"], tried["body_bytes_saved"]) == (2, 20, 16)


def test_a_message_id_with_a_slash_is_found(broker: Any) -> None:
    """A producer's message id may hold '/' (the broker allows any printable ASCII): the lookup by id
    takes it whether the caller encodes it (%2F, which the server decodes before routing) or not."""

    async def go() -> None:
        async with Producer(broker.endpoint) as p:
            await p.send_many([p.message(TOPIC, b"slashed", keys=["slashed"], message_id="order/42/a")])

    asyncio.run(go())
    with httpx.Client(base_url=broker.admin_url, timeout=10) as api:
        for path in ("/messages/order%2F42%2Fa", "/messages/order/42/a"):
            found = api.get(path, params={"body": "true"})
            assert found.status_code == 200, (path, found.text)
            assert found.json()["message_id"] == "order/42/a"
            assert base64.b64decode(found.json()["body_base64"]) == b"slashed"
        assert api.get("/messages/order%2F42").status_code == 404  # a prefix is another id
        by_key = api.get("/messages", params={"topic": TOPIC, "key": "slashed"}).json()
        assert [m["message_id"] for m in by_key] == ["order/42/a"]  # the lookup by key is still its own


def test_a_group_known_only_by_its_program_or_its_offsets_is_reported(
    start_broker: Any, tmp_path: Path
) -> None:
    """A program registered before the group's consumers start, or offsets a tool committed: the
    broker knows the group, so its reports answer (they answered 404 "unknown" for it), after a
    restart too; a group with nothing at all is still 404."""
    broker = start_broker("data", config={"filter_server_nums": 1})
    program = {"source": "def match(message):\n    return True\n", "sample": {"body": "x"}}
    with httpx.Client(base_url=broker.admin_url, timeout=30) as http:
        assert http.post("/topics", json={"name": TOPIC, "queue_nums": 2}).status_code == 201
        assert http.put(f"/groups/planned/programs/{TOPIC}", json=program).status_code == 200
        listed = http.get("/groups/planned/programs")
        assert listed.status_code == 200 and [p["topic"] for p in listed.json()] == [TOPIC]

    async def commit() -> None:  # a tool's commit: no settings, no subscription
        connection = Connection(broker.endpoint)
        try:
            await connection.update_offsets("tool-g", TOPIC, {0: 0, 1: 0})
        finally:
            await connection.close()

    asyncio.run(commit())
    broker.stop()
    broker.start()
    with httpx.Client(base_url=broker.admin_url, timeout=30) as http:
        for route in (
            "/groups/tool-g/lag/" + TOPIC,
            "/groups/planned/programs",
            "/groups/planned/lag-history",
        ):
            assert http.get(route).status_code == 200, route
        assert http.get("/groups/nobody-at-all/programs").status_code == 404
