"""kill -9 of a ``--flush sync`` broker in the middle of sending: every acknowledged send survives."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

pytest.importorskip("rocketmq")
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOPIC = "CrashTopic"
ROUNDS = 3


def _send_until_killed(endpoint: str, acked: list[str], stop: threading.Event) -> None:
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=2), (TOPIC,))
    producer.startup()
    try:
        i = 0
        while not stop.is_set():
            msg = Message()
            msg.topic = TOPIC
            msg.body = f"payload-{i}".encode() * 10
            msg.tag = "Pay" if i % 2 else "Order"
            msg.add_property("n", str(i))
            try:
                receipt = producer.send(msg)
            except Exception:
                return  # the broker is gone
            acked.append(receipt.message_id)
            i += 1
    finally:
        producer.shutdown()


def test_every_acknowledged_send_is_delivered_after_kill_9(start_broker: Any) -> None:
    rng = random.Random(7)
    acked: list[str] = []
    for round_no in range(ROUNDS):
        broker = start_broker(flush="sync")
        stop = threading.Event()
        sender = threading.Thread(target=_send_until_killed, args=(broker.endpoint, acked, stop))
        before = len(acked)
        sender.start()
        deadline = time.monotonic() + 30
        while len(acked) < before + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.3))
        broker.kill()  # SIGKILL in the middle of sends
        stop.set()
        sender.join(60)
        assert len(acked) > before, f"round {round_no}: nothing was acknowledged"

    broker = start_broker(flush="sync")
    consumer = SimpleConsumer(
        ClientConfiguration(broker.endpoint, Credentials(), request_timeout=5),
        "crash-g",
        {TOPIC: FilterExpression("*")},
        1,
    )
    consumer.startup()
    delivered: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while not set(acked) <= delivered and time.monotonic() < deadline:
            for m in consumer.receive(32, 30):
                delivered.add(m.message_id)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    missing = set(acked) - delivered
    assert not missing, f"{len(missing)} acknowledged sends lost of {len(acked)}"
