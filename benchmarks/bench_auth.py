"""Cost of authentication and authorization per call, at the gRPC edge's gate (no network).

Run: ``.venv/bin/python benchmarks/bench_auth.py``. Prints microseconds per call for a signed
SendMessage with authentication alone (the first call of a second, which verifies the signature,
and the others, which find it remembered), with authorization too, and for a denied call, measured
on :meth:`siftmq.server.auth.Gate.refusal` with the metadata the official client sends.
"""

from __future__ import annotations

import json
import time
import timeit

from siftmq.auth.acl import parse_auth_file
from siftmq.auth.signature import sign
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.server.auth import Gate

AUTH = {
    "users": [{"username": "alice", "password": "Al1ce-s3cret", "userType": "Normal"}],
    "acls": [
        {
            "subject": "User:alice",
            "policies": [
                {
                    "entries": [
                        {
                            "resource": [f"Topic:T{i}" for i in range(20)] + ["Topic:Orders"],
                            "actions": ["Pub"],
                        },
                        {"resource": ["Group:alice-*"], "actions": ["Sub"], "sourceIps": ["127.0.0.0/8"]},
                    ]
                }
            ],
        }
    ],
}


class Context:
    def __init__(self, user: str, secret: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        header = (
            f"MQv2-HMAC-SHA1 Credential={user}, SignedHeaders=x-mq-date-time, Signature={sign(secret, stamp)}"
        )
        self.metadata = (("x-mq-date-time", stamp), ("authorization", header), ("x-mq-client-id", "c"))

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"


def per_call_us(
    gate: Gate, request: object, context: Context, rpc: str = "SendMessage", *, cached: bool = True
) -> float:
    n = 20_000

    def call() -> None:
        if not cached:  # the first call of a second: the signature is verified
            gate.verifier._signed.clear()
        gate.refusal(rpc, request, context)

    return min(timeit.repeat(call, number=n, repeat=5)) / n * 1e6


def main() -> None:
    table = parse_auth_file(json.dumps(AUTH))
    ok = Context("alice", "Al1ce-s3cret")
    send = pb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="Orders"))])
    denied = pb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="Secret"))])
    authn = Gate(table, authenticate=True, authorize=False, skew_s=900)
    authz = Gate(table, authenticate=True, authorize=True, skew_s=900)
    first = per_call_us(authn, send, ok, cached=False)
    print(f"authentication, first call of a second:  {first:6.1f} us per call (HMAC-SHA1, date checks)")
    print(f"authentication only, signed SendMessage: {per_call_us(authn, send, ok):6.1f} us per call")
    print(f"authentication + authorization, allowed:  {per_call_us(authz, send, ok):6.1f} us per call")
    print(f"authentication + authorization, denied:   {per_call_us(authz, denied, ok):6.1f} us per call")


if __name__ == "__main__":
    main()
