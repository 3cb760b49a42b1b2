"""TLS (and mutual TLS) with a CA made in the test, siftmq's client signing its calls, and protected
mode, against real broker processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme

from siftmq.client import Producer
from siftmq.errors import RemoteError, RemoteUnauthorized

pytestmark = pytest.mark.integration


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.siftmq.test")
    files = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "server.pem",
        "key": tmp_path / "server.key",
        "client_cert": tmp_path / "client.pem",
        "client_key": tmp_path / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


async def _send(endpoint: str, **options: Any) -> str:
    async with Producer(endpoint, max_attempts=1, request_timeout=5, **options) as producer:
        return (await producer.send("Secure", b"x", tag="t")).message_id


OFFICIAL = """
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=10)
p = Producer(config, ("Secure",), tls_enable=True)
p.startup()
m = Message(); m.topic = "Secure"; m.body = b"official over tls"; m.tag = "t"
print("sent", p.send(m).message_id)
p.shutdown()
"""


def test_tls_serves_siftmq_and_official_clients_that_trust_the_ca(
    start_broker: Any, pki: dict[str, Path]
) -> None:
    broker = start_broker("data", config={"tls_cert_file": str(pki["cert"]), "tls_key_file": str(pki["key"])})
    assert "tls" in broker.log()
    assert asyncio.run(_send(broker.endpoint, tls=True, ca_file=str(pki["ca"])))
    with pytest.raises(RemoteError):  # plaintext to a TLS port
        asyncio.run(_send(broker.endpoint))
    official = subprocess.run(
        [sys.executable, "-c", OFFICIAL, broker.endpoint],
        env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(pki["ca"])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert official.returncode == 0 and "sent " in official.stdout, official.stderr[-2000:]
    assert broker.stop() == 0


def test_mutual_tls_needs_a_client_certificate_from_the_ca(start_broker: Any, pki: dict[str, Path]) -> None:
    broker = start_broker(
        "data",
        config={
            "tls_cert_file": str(pki["cert"]),
            "tls_key_file": str(pki["key"]),
            "tls_client_ca_file": str(pki["ca"]),
        },
    )
    with pytest.raises(RemoteError):  # no client certificate
        asyncio.run(_send(broker.endpoint, tls=True, ca_file=str(pki["ca"])))
    assert asyncio.run(
        _send(
            broker.endpoint,
            ca_file=str(pki["ca"]),
            cert_file=str(pki["client_cert"]),
            key_file=str(pki["client_key"]),
        )
    )
    assert broker.stop() == 0


def test_siftmq_client_signs_its_calls(start_broker: Any, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps({"users": [{"username": "svc", "password": "Svc-s3cret", "userType": "Super"}]})
    )
    broker = start_broker("data", config={"authentication_enabled": True, "auth_file": str(auth)})
    assert asyncio.run(_send(broker.endpoint, access_key="svc", secret_key="Svc-s3cret"))
    with pytest.raises(RemoteUnauthorized):
        asyncio.run(_send(broker.endpoint))
    with pytest.raises(RemoteUnauthorized):
        asyncio.run(_send(broker.endpoint, access_key="svc", secret_key="wrong"))
    assert "Svc-s3cret" not in broker.log()
    assert broker.stop() == 0


def test_protected_mode_refuses_a_public_address_without_authentication(start_broker: Any) -> None:
    with pytest.raises(RuntimeError, match="protected mode"):
        start_broker("refused", listen="0.0.0.0:0")
    broker = start_broker("open", listen="0.0.0.0:0", config={"allow_anonymous": True})
    assert "--allow-anonymous" in broker.log() and "anyone who can reach the port" in broker.log()
    assert broker.stop() == 0
