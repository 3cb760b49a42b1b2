"""Filter programs on a real broker process: registered through the admin API, applied on receive
and pull (with TAG filters too), failures dead-lettered, hostile programs suspended while a good
group keeps receiving, new versions, and a restart keeping them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from siftmq.client import FilterExpression, Producer, PullConsumer, SimpleConsumer

pytestmark = pytest.mark.integration

TOPIC = "Orders"
COUNT = 60
BIG_A = (
    "import json\n"
    "def match(message):\n"
    "    order = json.loads(message.body)\n"
    "    return order['total'] > 100 and any(i['sku'].startswith('A') for i in order['items'])\n"
)


def order(i: int) -> dict[str, Any]:
    return {"id": i, "total": i * 10, "items": [{"sku": ("A" if i % 3 == 0 else "B") + str(i)}]}


def expected(keep: Any) -> set[int]:
    return {i for i in range(COUNT) if keep(order(i))}


def big_a(o: dict[str, Any]) -> bool:
    return o["total"] > 100 and o["items"][0]["sku"].startswith("A")


@pytest.fixture
def broker(start_broker: Any) -> Any:
    config = {"filter_program_timeout_ms": 100.0, "filter_program_batch_timeout_ms": 400.0,
              "filter_program_max_failures": 4, "filter_server_nums": 2}  # fmt: skip
    b = start_broker("data", config=config)
    assert (
        httpx.post(f"{b.admin_url}/topics", json={"name": TOPIC, "queue_nums": 4}, timeout=10).status_code
        == 201
    )
    return b


def send_orders(endpoint: str, count: int = COUNT, first: int = 0) -> None:
    async def go() -> None:
        async with Producer(endpoint) as producer:
            msgs = [
                producer.message(TOPIC, json.dumps(order(i)).encode(), tag="even" if i % 2 == 0 else "odd",
                                 properties={"i": str(i)})
                for i in range(first, first + count)
            ]  # fmt: skip
            await producer.send_many(msgs)

    asyncio.run(go())


def put(broker: Any, group: str, source: str, sample: Any = None) -> httpx.Response:
    body = {"source": source} | ({"sample": sample} if sample is not None else {})
    return httpx.put(f"{broker.admin_url}/groups/{group}/programs/{TOPIC}", json=body, timeout=30)


def receive_all(endpoint: str, group: str, tag: str = "*", rounds: int = 8) -> set[int]:
    async def go() -> set[int]:
        got: set[int] = set()
        # a read that starts a slow program's worker waits for it: seconds on a loaded host
        async with SimpleConsumer(
            endpoint, group, {TOPIC: FilterExpression.tag(tag)}, await_duration=1, request_timeout=60
        ) as c:
            empty = 0
            while empty < 2 and rounds:
                batch = await c.receive(32, 30)
                for m in batch:
                    got.add(int(m.properties["i"]))
                    await c.ack(m)
                empty = 0 if batch else empty + 1
        return got

    return asyncio.run(go())


def receive_sql(endpoint: str, group: str, expression: str, rounds: int = 5) -> set[int]:
    async def go() -> set[int]:
        got: set[int] = set()
        sql = FilterExpression.sql92(expression)
        async with SimpleConsumer(endpoint, group, {TOPIC: sql}, await_duration=1) as c:
            for _ in range(rounds):
                for m in await c.receive(32, 30):
                    got.add(int(m.properties["i"]))
                    await c.ack(m)
        return got

    return asyncio.run(go())


def pull_all(endpoint: str, group: str) -> set[int]:
    async def go() -> set[int]:
        got: set[int] = set()
        async with PullConsumer(endpoint, group, TOPIC, FilterExpression.tag()) as consumer:
            for _ in range(10):
                got |= {int(m.properties["i"]) for m in await consumer.poll(64, timeout=0.3)}
        return got

    return asyncio.run(go())


def test_receive_and_pull_deliver_what_the_program_keeps(broker: Any) -> None:
    send_orders(broker.endpoint)
    answer = put(broker, "g-big-a", BIG_A)
    assert answer.status_code == 200, answer.text
    assert answer.json()["version"] == 1 and len(answer.json()["sha256"]) == 64
    assert receive_all(broker.endpoint, "g-big-a") == expected(big_a)
    assert put(broker, "g-pull", BIG_A).status_code == 200
    assert pull_all(broker.endpoint, "g-pull") == expected(big_a)
    assert put(broker, "g-tagged", BIG_A).status_code == 200  # TAG 'even' and the program, both
    assert receive_all(broker.endpoint, "g-tagged", "even") == {i for i in expected(big_a) if i % 2 == 0}
    assert receive_all(broker.endpoint, "g-plain") == set(range(COUNT))  # no program: everything
    assert put(broker, "g-sql", BIG_A).status_code == 200  # SQL92 and the program, both
    assert receive_sql(broker.endpoint, "g-sql", "TAGS = 'odd'") == {i for i in expected(big_a) if i % 2}

    report = httpx.get(f"{broker.admin_url}/groups/g-big-a/programs/{TOPIC}", timeout=10).json()
    assert report["status"] == "active" and report["version"] == 1
    assert report["counters"]["evaluated"] >= COUNT and report["counters"]["matched"] >= len(expected(big_a))

    # a new version takes effect for what is read next
    newer = "import json\ndef match(message):\n    return json.loads(message.body)['total'] < 50\n"
    assert put(broker, "g-big-a", newer).json()["version"] == 2
    send_orders(broker.endpoint, 20, first=COUNT)
    assert receive_all(broker.endpoint, "g-big-a") == set()  # totals of 600 and more
    assert put(broker, "g-pull", newer).json()["version"] == 2
    assert httpx.delete(f"{broker.admin_url}/groups/g-tagged/programs/{TOPIC}", timeout=10).status_code == 204
    assert httpx.get(f"{broker.admin_url}/groups/g-tagged/programs/{TOPIC}", timeout=10).status_code == 404


def test_small_reads_through_a_selective_program_deliver_each_message_once(broker: Any) -> None:
    """A read through a program asks the store for more than it delivers and stops at the batch:
    what it read past the last delivered message is read again next time, so with batches of 1
    and 3 every kept message arrives once and in queue order, and every failed one is
    dead-lettered once."""
    send_orders(broker.endpoint, 200)
    one_in_five = (
        "import json\ndef match(message):\n"
        "    i = json.loads(message.body)['id']\n"
        "    if i % 20 == 7:\n        raise ValueError('bad ' + str(i))\n"
        "    return i % 5 == 0\n"
    )
    for group, batch in (("g-small-1", 1), ("g-small-3", 3)):
        assert put(broker, group, one_in_five, {"body": json.dumps(order(0))}).status_code == 200

        async def pull_all_in(group: str, batch: int) -> list[tuple[int, int]]:
            got: list[tuple[int, int]] = []
            async with PullConsumer(broker.endpoint, group, TOPIC, FilterExpression.tag()) as consumer:
                for _ in range(300):
                    msgs = await consumer.poll(batch, timeout=0.2)
                    assert len(msgs) <= batch
                    got += [(m.queue_id, int(m.properties["i"])) for m in msgs]
                    if len(got) >= 40:
                        break
            return got

        got = asyncio.run(pull_all_in(group, batch))
        assert sorted(i for _, i in got) == list(range(0, 200, 5))
        for queue in range(4):  # queue order
            mine = [i for q, i in got if q == queue]
            assert mine == sorted(mine)
        dlq = f"{broker.admin_url}/topics/%25DLQ%25{group}"
        assert httpx.get(dlq, timeout=10).json()["messages"] == 10
        failed = [httpx.get(f"{dlq}/queues/0/messages/{n}", timeout=10).json() for n in range(10)]
        assert sorted(int(d["properties"]["i"]) for d in failed) == list(range(7, 200, 20))


def test_a_bad_program_is_refused_saying_what_is_wrong(broker: Any) -> None:
    send_orders(broker.endpoint, 3)
    cases = [
        ("def match(m)\n    return True\n", "syntax error at line 1"),
        ("import socket\ndef match(m):\n    return True\n", "module 'socket' is not allowed"),
        ("x = 1 / 0\ndef match(m):\n    return True\n", "failed to load: ZeroDivisionError"),
        (
            "def match(m):\n    return m.properties['missing'] == 'x'\n",
            "match failed on the sample message: KeyError",
        ),
    ]
    for source, message in cases:
        answer = put(broker, "g-bad", source)
        assert answer.status_code == 400 and message in answer.json()["message"], answer.text
    sample = {"body": "not json", "properties": {"i": "1"}}
    refused = put(broker, "g-bad", BIG_A, sample)
    assert refused.status_code == 400 and "JSONDecodeError" in refused.json()["message"]
    assert httpx.get(f"{broker.admin_url}/groups/g-bad/programs/{TOPIC}", timeout=10).status_code == 404
    missing = httpx.put(
        f"{broker.admin_url}/groups/g/programs/NoSuchTopic", json={"source": BIG_A}, timeout=10
    )
    assert missing.status_code == 404


def test_a_pull_that_seeks_back_does_not_dead_letter_the_failures_again(broker: Any) -> None:
    """Before, every read of a failed message copied it to the dead-letter topic again: a consumer
    seeking back over it in a loop grew the log without bound."""
    send_orders(broker.endpoint)
    fails_on_odd = (
        "import json\ndef match(message):\n"
        "    if json.loads(message.body)['id'] % 2:\n        raise ValueError('odd')\n"
        "    return True\n"
    )
    assert put(broker, "g-seek", fails_on_odd, {"body": json.dumps(order(0))}).status_code == 200

    async def read_three_times() -> list[set[int]]:
        rounds = []
        async with PullConsumer(broker.endpoint, "g-seek", TOPIC) as consumer:
            for _ in range(3):
                got: set[int] = set()
                while batch := await consumer.poll(16, timeout=1):
                    got |= {int(m.properties["i"]) for m in batch}
                rounds.append(got)
                for q in await consumer.assignment():
                    consumer.seek(q, 0)
        return rounds

    evens = {i for i in range(COUNT) if i % 2 == 0}
    assert asyncio.run(read_three_times()) == [evens] * 3
    dead = f"{broker.admin_url}/topics/%25DLQ%25g-seek/queues/0/messages"
    assert httpx.get(f"{dead}/{COUNT // 2 - 1}", timeout=10).status_code == 200
    assert httpx.get(f"{dead}/{COUNT // 2}", timeout=10).status_code == 404  # each odd one once


def test_failures_go_to_the_dead_letter_topic_and_hostile_programs_are_suspended(broker: Any) -> None:
    send_orders(broker.endpoint)
    fails_on_odd = (
        "import json\ndef match(message):\n"
        "    order = json.loads(message.body)\n"
        "    if order['id'] % 2:\n        raise ValueError('odd order ' + str(order['id']))\n"
        "    return True\n"
    )
    assert put(broker, "g-err", fails_on_odd, {"body": json.dumps(order(0))}).status_code == 200
    assert receive_all(broker.endpoint, "g-err") == {i for i in range(COUNT) if i % 2 == 0}
    dead = [
        httpx.get(f"{broker.admin_url}/topics/%25DLQ%25g-err/queues/0/messages/{n}", timeout=10).json()
        for n in range(COUNT // 2)
    ]
    assert sorted(int(d["properties"]["i"]) for d in dead) == [i for i in range(COUNT) if i % 2]
    assert all(d["properties"]["FILTER_ERROR"].startswith("ValueError: odd order") for d in dead)
    assert all(d["properties"]["DLQ_ORIGIN_TOPIC"] == TOPIC for d in dead)

    spins = "def match(message):\n    while True:\n        pass\n"
    assert put(broker, "g-spin", BIG_A).status_code == 200
    # registered with a sample that passes; then the real one spins: replaced by the admin's mistake
    spin_ok_on_sample = (
        "def match(message):\n    if message.properties.get('i') is None:\n        return True\n"
        "    while True:\n        pass\n"
    )
    assert put(broker, "g-spin", spin_ok_on_sample, {"body": "{}"}).status_code == 200
    assert receive_all(broker.endpoint, "g-spin", rounds=4) == set()
    report = httpx.get(f"{broker.admin_url}/groups/g-spin/programs/{TOPIC}", timeout=10).json()
    assert report["status"] == "suspended" and "worker kills" in report["last_error"], report
    metrics = httpx.get(f"{broker.admin_url}/metrics", timeout=10).text
    assert 'siftmq_filter_program_held{group="g-spin",status="suspended",topic="Orders"} 1.0' in metrics
    assert receive_all(broker.endpoint, "g-plain") == set(range(COUNT))  # other groups never noticed
    # suspended: the group's progress did not move, so a good version gets every message
    assert put(broker, "g-spin", "def match(message):\n    return True\n").status_code == 200
    assert receive_all(broker.endpoint, "g-spin") == set(range(COUNT))
    assert put(broker, "g-spin2", spins, {"body": "{}"}).status_code == 400  # caught at registration

    log = broker.log()
    assert "suspended after" in log


def test_a_broadcasting_group_filters_every_member(broker: Any) -> None:
    send_orders(broker.endpoint)
    answer = httpx.patch(f"{broker.admin_url}/groups/g-bcast", json={"mode": "broadcasting"}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert put(broker, "g-bcast", BIG_A).status_code == 200

    async def member(tmp: str) -> set[int]:
        got: set[int] = set()
        everything = FilterExpression.tag()
        async with PullConsumer(
            broker.endpoint, "g-bcast", TOPIC, everything, mode="BROADCASTING", offset_dir=Path(tmp)
        ) as consumer:
            for _ in range(10):
                got |= {int(m.properties["i"]) for m in await consumer.poll(64, timeout=0.3)}
        return got

    import tempfile

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        assert asyncio.run(member(a)) == expected(big_a)
        assert asyncio.run(member(b)) == expected(big_a)


def test_programs_survive_a_restart(start_broker: Any, broker: Any) -> None:
    send_orders(broker.endpoint)
    assert put(broker, "g-big-a", BIG_A).status_code == 200
    assert broker.stop() == 0
    again = start_broker("data", config={"filter_program_timeout_ms": 200.0})
    report = httpx.get(f"{again.admin_url}/groups/g-big-a/programs/{TOPIC}", timeout=10).json()
    assert report["version"] == 1 and report["status"] == "active"
    assert receive_all(again.endpoint, "g-big-a") == expected(big_a)


def test_the_official_client_is_filtered_unchanged(broker: Any) -> None:
    rocketmq = pytest.importorskip("rocketmq")
    send_orders(broker.endpoint)
    assert put(broker, "g-official", BIG_A).status_code == 200
    consumer = rocketmq.SimpleConsumer(
        rocketmq.ClientConfiguration(broker.endpoint, rocketmq.Credentials(), request_timeout=10),
        "g-official",
        {TOPIC: rocketmq.FilterExpression("*")},
        await_duration=2,
    )
    consumer.startup()
    got: set[int] = set()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < len(expected(big_a)):
            for m in consumer.receive(32, 30):
                got.add(int(m.properties["i"]))
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert got == expected(big_a)


HOSTILE_AT_REGISTRATION = {
    "an endless loop": ("def match(m):\n    while True:\n        pass\n", "deadline"),
    "a memory bomb": ("def match(m):\n    x = bytearray(10**11)\n    return True\n", "MemoryError"),
    "open a file": ("def match(m):\n    return open('/etc/passwd') is not None\n", "NameError"),
    "import os": ("def match(m):\n    import os\n    return True\n", "not allowed"),
    "sys.exit at import": ("import sys\nsys.exit(0)\ndef match(m):\n    return True\n", "not allowed"),
    "sys.exit in match": ("def match(m):\n    raise SystemExit(1)\n", "SystemExit"),
    "unbounded recursion": (
        "def f(n):\n    return f(n + 1)\ndef match(m):\n    return f(0)\n",
        "RecursionError",
    ),
    "a non-bool": ("def match(m):\n    return 'yes'\n", "not bool"),
    "a thread": ("def match(m):\n    import threading\n    return True\n", "not allowed"),
    "the os module by introspection": (
        "def match(m):\n"
        "    for c in ().__class__.__base__.__subclasses__():\n"
        "        if c.__name__ == '_wrap_close':\n"
        "            c.__init__.__globals__['kill'](c.__init__.__globals__['getppid'](), 9)\n"
        "    return True\n",
        "Operation not permitted",
    ),
}


def test_hostile_programs_are_refused_while_a_good_group_receives(broker: Any) -> None:
    """Each hostile program, run on the topic's newest message at registration, is refused with
    why; the broker keeps serving and a well-behaved group gets every message it wants."""
    send_orders(broker.endpoint, 20)
    assert put(broker, "g-good", BIG_A).status_code == 200
    for name, (source, reason) in HOSTILE_AT_REGISTRATION.items():
        answer = put(broker, "g-hostile", source)
        assert answer.status_code == 400 and reason in answer.json()["message"], (name, answer.text)
    assert httpx.get(f"{broker.admin_url}/groups/g-hostile/programs/{TOPIC}", timeout=10).status_code == 404
    assert receive_all(broker.endpoint, "g-good") == {i for i in range(20) if big_a(order(i))}
    assert httpx.get(f"{broker.admin_url}/healthz", timeout=10).status_code == 200


# Programs that pass their registration (the sample has no "i") and turn hostile on real messages:
# (source, what becomes of the group's messages, the reason seen)
_ESCAPE = (
    "def _os():\n"
    "    for c in ().__class__.__base__.__subclasses__():\n"
    "        if c.__name__ == '_wrap_close':\n"
    "            return c.__init__.__globals__\n"
)
HOSTILE_AT_RUN_TIME = {
    "a memory bomb": ("def match(m):\n    x = bytearray(10**11)\n    return True\n", "dead", "MemoryError"),
    "killing the broker": (
        _ESCAPE + "def match(m):\n    _os()['kill'](_os()['getppid'](), 9)\n    return True\n",
        "dead", "PermissionError",
    ),
    "unbounded recursion": (
        "def f(n):\n    return f(n + 1)\ndef match(m):\n    return f(0)\n", "dead", "RecursionError",
    ),
    "sys.exit in match": ("def match(m):\n    raise SystemExit(3)\n", "dead", "SystemExit"),
    "10 MB to stdout": ("def match(m):\n    print('x' * 10_000_000)\n    return True\n", "delivered", ""),
    "exiting its worker": (_ESCAPE + "def match(m):\n    _os()['_exit'](0)\n", "suspended", "worker kills"),
    "works once then crashes forever": (
        _ESCAPE + "SEEN = []\ndef match(m):\n    SEEN.append(1)\n"
        "    if len(SEEN) > 1:\n        _os()['_exit'](0)\n    return True\n",
        "suspended", "worker kills",
    ),
}  # fmt: skip


def test_programs_turning_hostile_on_real_messages_lose_nothing(broker: Any) -> None:
    """Each program passes its registration, then turns hostile on the real messages: a failure
    sends every message to the dead-letter topic with why; a program that kills its workers is
    suspended with the group's progress kept (a good version then gets every message it had not
    accepted). The
    broker keeps serving, and well-behaved groups get what they want."""
    send_orders(broker.endpoint, 20)
    wanted = {i for i in range(20) if big_a(order(i))}
    sample = {"body": json.dumps(order(0))}
    for n, (name, (source, outcome, reason)) in enumerate(HOSTILE_AT_RUN_TIME.items()):
        group = f"g-turns-{n}"
        guarded = source.replace("def match(m):\n", "def match(m):\n    if 'i' not in m.properties:\n"
                                 "        return True\n", 1)  # fmt: skip
        assert put(broker, group, guarded, sample).status_code == 200, name
        got = receive_all(broker.endpoint, group, rounds=3)
        report = httpx.get(f"{broker.admin_url}/groups/{group}/programs/{TOPIC}", timeout=10).json()
        dlq = httpx.get(f"{broker.admin_url}/topics/%25DLQ%25{group}", timeout=10)
        dead = dlq.json()["messages"] if dlq.status_code == 200 else 0
        if outcome == "delivered":
            assert got == set(range(20)) and dead == 0, name
        elif outcome == "dead":
            assert got == set() and dead == 20, (name, got, dead)
            first = httpx.get(f"{broker.admin_url}/topics/%25DLQ%25{group}/queues/0/messages/0", timeout=10)
            assert first.json()["properties"]["FILTER_ERROR"].startswith(reason), name
        else:  # before its suspension: what it accepted alone in a fresh worker is delivered, and
            # a message its worker died on alone is a dead letter, as any read's
            assert report["status"] == "suspended" and reason in report["last_error"], name
            assert put(broker, group, "def match(m):\n    return True\n").status_code == 200
            rest = receive_all(broker.endpoint, group)
            letters = {
                int(httpx.get(f"{broker.admin_url}/topics/%25DLQ%25{group}/queues/0/messages/{n}", timeout=10)
                    .json()["properties"]["i"])
                for n in range(dead)
            }  # fmt: skip
            assert got | rest | letters == set(range(20)), name  # the progress was kept: none lost
            assert len(got) + len(rest) + len(letters) == 20, name  # and none twice
        assert httpx.get(f"{broker.admin_url}/healthz", timeout=10).status_code == 200, name
    assert receive_all(broker.endpoint, "g-good") == set(range(20))  # no program
    assert put(broker, "g-good-prog", BIG_A).status_code == 200
    assert receive_all(broker.endpoint, "g-good-prog") == wanted


def test_a_program_sees_only_what_the_groups_expression_accepts(broker: Any) -> None:
    """The SQL92 expression's exact stage runs before the program, also for messages stored before
    the group subscribed (no bloom bitmap: the index passes them all): a program that fails on what
    the expression excludes never fails."""
    send_orders(broker.endpoint, 20)
    odd_fails = (
        "def match(m):\n    if m.tag != 'even':\n        raise ValueError('odd reached the program')\n"
        "    return True\n"
    )
    assert put(broker, "g-sql-first", odd_fails, {"body": "{}", "tag": "even"}).status_code == 200
    assert receive_sql(broker.endpoint, "g-sql-first", "TAGS = 'even'") == set(range(0, 20, 2))
    counters = httpx.get(f"{broker.admin_url}/groups/g-sql-first/programs/{TOPIC}", timeout=10).json()[
        "counters"
    ]
    assert counters["errors"] == 0 and counters["evaluated"] == 10
    assert httpx.get(f"{broker.admin_url}/topics/%25DLQ%25g-sql-first", timeout=10).status_code == 404


def test_messages_that_kill_their_worker_cost_one_failure_each(broker: Any) -> None:
    """Reads ask for more than they deliver: what a read evaluated past its batch is not evaluated
    again (a poisoned message would kill a worker on every read reaching it), and the bisection's
    kills count once per poisoned message. Two poisoned messages among 120, read 32 at a time,
    leave the program active (the broker allows 4 failures a minute here): both go to the DLQ,
    the rest are delivered."""
    send_orders(broker.endpoint, 120)
    poisoned = (
        "import json\ndef match(m):\n    while json.loads(m.body)['id'] in (35, 110):\n        pass\n"
        "    return True\n"
    )
    assert put(broker, "g-poisoned", poisoned, {"body": json.dumps(order(0))}).status_code == 200
    assert receive_all(broker.endpoint, "g-poisoned") == set(range(120)) - {35, 110}
    report = httpx.get(f"{broker.admin_url}/groups/g-poisoned/programs/{TOPIC}", timeout=10).json()
    assert report["status"] == "active", report
    dead = httpx.get(f"{broker.admin_url}/topics/%25DLQ%25g-poisoned", timeout=10).json()
    assert dead["messages"] == 2


def test_a_slow_program_does_not_hold_up_other_groups_reads(broker: Any) -> None:
    """A group's reads through its program run on the program threads: a program whose worker takes
    seconds to start (its module code; each read that starts a worker waits for it) leaves the read
    thread to the groups without one (a pull here)."""
    import threading

    send_orders(broker.endpoint)
    slow = "import math\nfor n in range(25_000_000):\n    math.sqrt(n)\n"  # ~2 s, each worker start
    slow += "def match(message):\n    return True\n"
    assert put(broker, "g-slow", slow).status_code == 200
    busy = threading.Thread(target=receive_all, args=(broker.endpoint, "g-slow"), kwargs={"rounds": 2})
    busy.start()
    time.sleep(0.5)  # its read is under way on the program threads

    async def pull() -> tuple[int, float]:
        async with PullConsumer(broker.endpoint, "g-plain", TOPIC) as consumer:
            started = time.monotonic()
            got = await consumer.poll(32, timeout=5)
            return len(got), time.monotonic() - started

    got, took = asyncio.run(pull())
    busy.join(120)
    assert got > 0 and took < 1.0, (got, took)


def test_a_read_through_a_program_fills_its_answer_from_every_queue(start_broker: Any) -> None:
    """With ``max_body_size`` at ``max_pull_bytes`` a message may be as large as an answer: a read
    past the first still takes only what fits, and no longer stops after the first queue's read."""
    config = {"max_body_size": 65_536, "max_pull_bytes": 65_536, "commit_log_segment_size": 262_144}
    b = start_broker("data", config=config)
    made = httpx.post(f"{b.admin_url}/topics", json={"name": TOPIC, "queue_nums": 4}, timeout=10)
    assert made.status_code == 201, made.text
    assert put(b, "g-all", "def match(message):\n    return True\n").status_code in (200, 201)

    async def first_receive() -> set[int]:
        async with Producer(b.endpoint) as producer:
            for i in range(16):  # one at a time: 4 on each queue
                await producer.send(TOPIC, json.dumps(order(i)).encode(), tag="t", properties={"i": str(i)})
        async with SimpleConsumer(
            b.endpoint, "g-all", {TOPIC: FilterExpression.tag()}, request_timeout=60
        ) as consumer:
            return {int(m.properties["i"]) for m in await consumer.receive(32, 30)}

    assert asyncio.run(first_receive()) == set(range(16))
