"""Seed 004: one group, two consumers subscribing ``tagA`` and ``tagB``, 4 queues, 8 messages.

RocketMQ keeps one subscription per group; the newest member's (``tagB``) filters for everybody,
and each member then drops what its own expression rejects — so the tagA messages are lost. The
demo runs the experiment twice against a fresh broker: ``strict`` (siftmq's default: the second
consumer is refused, nothing is lost) and ``compat`` (RocketMQ's outcome, reproduced and reported).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from siftmq.client import FilterExpression, Producer, PullConsumer
from siftmq.demos.embedded import embedded_broker
from siftmq.errors import RemoteError

TOPIC = "SUBSCRIBE_TEST"
GROUP = "SUBSCRIBE_TEST_CONSUMER_GROUP"
SUBSCRIPTIONS = {"ConsumerForTagA": "tagA", "ConsumerForTagB": "tagB"}


@dataclass
class Outcome:
    policy: str
    consumed: dict[str, list[str]] = field(default_factory=dict)  # consumer -> message bodies
    refused: dict[str, str] = field(default_factory=dict)  # consumer -> the broker's message
    queues: dict[str, list[int]] = field(default_factory=dict)  # consumer -> its assigned queues
    placed: dict[str, int] = field(default_factory=dict)  # message body -> the queue it went to

    @property
    def sent(self) -> list[str]:
        return [f"MsgStr{i}" for i in range(8)]

    @property
    def wanted(self) -> list[str]:
        """Messages some accepted consumer subscribed to (tagA for A, tagB for B)."""
        accepted = {SUBSCRIPTIONS[name] for name in self.consumed}
        return [m for i, m in enumerate(self.sent) if ("tagA" if i < 4 else "tagB") in accepted]

    @property
    def lost(self) -> list[str]:
        """Wanted by an accepted consumer, consumed by nobody."""
        got = {b for bodies in self.consumed.values() for b in bodies}
        return [m for m in self.wanted if m not in got]


async def run_policy(endpoint: str, policy: str) -> Outcome:
    outcome = Outcome(policy)
    consumers = {
        name: PullConsumer(endpoint, GROUP, TOPIC, FilterExpression.tag(tag))
        for name, tag in SUBSCRIPTIONS.items()
    }
    started = []
    for name, consumer in consumers.items():  # ConsumerForTagA starts first, as in the seed
        try:
            await consumer.start()
            started.append(name)
        except RemoteError as exc:
            outcome.refused[name] = str(exc)
            await consumer.connection.close()
    async with Producer(endpoint) as producer:  # the seed's producer: 4 x tagA, then 4 x tagB
        for i in range(8):
            receipt = await producer.send(TOPIC, f"MsgStr{i}".encode(), tag="tagA" if i < 4 else "tagB")
            outcome.placed[f"MsgStr{i}"] = receipt.queue_id
    for name in started:
        consumer = consumers[name]
        outcome.queues[name] = await consumer.assignment()
        bodies = []
        for _ in range(3):
            bodies += [m.body.decode() for m in await consumer.poll(32)]
        outcome.consumed[name] = bodies
        await consumer.commit()
    for name in started:
        await consumers[name].stop()
    return outcome


async def run() -> list[Outcome]:
    outcomes = []
    for policy in ("strict", "compat"):
        settings: dict[str, object] = {"default_queue_nums": 4}
        if policy == "compat":
            settings["compat_groups"] = [GROUP]
        with embedded_broker(settings) as endpoint:
            outcomes.append(await run_policy(endpoint, policy))
    return outcomes
