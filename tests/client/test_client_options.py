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
