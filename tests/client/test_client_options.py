"""Options a client refuses when it is made, naming the option: what would abort the process inside
gRPC, connect elsewhere than asked, or silently leave calls unsigned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from siftmq.client import Producer

# in a child process: a certificate without its key made gRPC abort the process (SIGABRT)
_MAKE = """
import asyncio, json, sys
from siftmq.client import FilterExpression, Producer, PullConsumer
options = json.loads(sys.argv[1])
async def main():
    for make in (lambda: Producer("127.0.0.1:1", **options),
                 lambda: PullConsumer("127.0.0.1:1", "g", "T", FilterExpression.tag(), **options)):
        try:
            client = make()
        except ValueError as exc:
            print("ValueError:", exc)
            continue
        try:
            await client.start()
        except Exception as exc:
            print("started:", type(exc).__name__)
        await client.connection.close()
asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cert_file": "PEM"}, "cert_file needs key_file"),
        ({"key_file": "PEM"}, "key_file needs cert_file"),
        ({"key_file": "PEM", "tls": True}, "key_file needs cert_file"),
        ({"secret_key": "s3cret"}, "secret_key needs access_key"),
        ({"access_key": "svc"}, "access_key needs secret_key"),
    ],
)
def test_an_option_without_its_pair_is_refused(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    """A certificate without its key aborted the whole process at the first call; a key alone
    connected in plaintext; a secret key alone left every call unsigned."""
    pem = tmp_path / "x.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    given = {k: str(pem) if v == "PEM" else v for k, v in options.items()}
    child = subprocess.run(
        [sys.executable, "-c", _MAKE, json.dumps(given)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-1000:]
    lines = child.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"ValueError: {message}") for line in lines), lines


@pytest.mark.parametrize(
    "endpoint", ["127.0.0.1:65536", "127.0.0.1:73217", "127.0.0.1:0", "127.0.0.1", "host:x"]
)
def test_an_endpoint_without_a_valid_port_is_refused(endpoint: str) -> None:
    """gRPC connected a port above 65535 to it modulo 65536: another endpoint than the one given."""
    with pytest.raises(ValueError, match=r"endpoint must be host:port \(port 1\.\.65535\)"):
        Producer(endpoint)


def test_bad_arguments_are_refused_naming_them() -> None:
    """An AssertionError, an AttributeError from deep inside, a key per character of a string, or
    nothing at all (receive(0) returned a message, poll(-1) nothing) before."""
    import asyncio

    from siftmq.client import FilterExpression, PullConsumer, SimpleConsumer

    async def scenario() -> None:
        with pytest.raises(ValueError, match="max_attempts"):
            Producer("127.0.0.1:1", max_attempts=0)
        with pytest.raises(TypeError, match=r"subscriptions\['T'\] must be a FilterExpression"):
            SimpleConsumer("127.0.0.1:1", "g", {"T": "*"})  # type: ignore[dict-item]
        producer = Producer("127.0.0.1:1")
        for kwargs, says in (
            ({"body": "text"}, "body must be bytes"),
            ({"body": b"x", "keys": "abc"}, "keys must be a list of strings"),
        ):
            with pytest.raises(TypeError, match=says):
                producer.message("T", **kwargs)  # type: ignore[arg-type]
        # bytes-like bodies are taken as bytes (the encoder refused them, naming nothing)
        assert type(producer.message("T", bytearray(b"ba")).body) is bytes
        assert producer.message("T", memoryview(b"mv")).body == b"mv"
        # a key or property that is no string is named as the request is made, on either path
        for extension in (True, False):
            producer.connection.batch_extension = extension
            for kwargs, says in (
                ({"properties": {"n": 1}}, r"message 1: properties must map strings to strings, not 'n': 1"),
                ({"keys": ["k", 2]}, "message 1: keys must be strings, not 2"),
            ):
                bad = [producer.message("T", b"ok"), producer.message("T", b"x", **kwargs)]  # type: ignore[arg-type]
                with pytest.raises(TypeError, match=says):
                    await producer.connection.send(bad)
        await producer.connection.close()
        consumer = SimpleConsumer("127.0.0.1:1", "g", {"T": FilterExpression.tag()})
        with pytest.raises(ValueError, match="max_messages must be 1 or more"):
            await consumer.receive(0)
        await consumer.connection.close()
        puller = PullConsumer("127.0.0.1:1", "g", "T", FilterExpression.tag())
        for count in (0, -1):
            with pytest.raises(ValueError, match="max_messages must be 1 or more"):
                await puller.poll(count)
        await puller.connection.close()

    asyncio.run(scenario())
