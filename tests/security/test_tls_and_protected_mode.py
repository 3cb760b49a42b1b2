"""TLS (and mutual TLS) with a CA made in the test, siftmq's client signing its calls, and protected
mode, against real broker processes."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
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


def test_protected_mode_refuses_a_public_address_without_authentication(
    start_broker: Any, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match="protected mode"):
        start_broker("refused", listen="0.0.0.0:0")
    assert not [p for p in (tmp_path / "refused").rglob("*") if p.is_file()]  # the refusal wrote nothing
    broker = start_broker("open", listen="0.0.0.0:0", config={"allow_anonymous": True})
    assert "--allow-anonymous" in broker.log() and "anyone who can reach the port" in broker.log()
    health = httpx.get(f"{broker.admin_url}/healthz", timeout=10).json()
    assert (
        health["status"] == "ok"
        and "gRPC listens on 0.0.0.0:0 with authentication off" in health["warnings"][0]
    )
    assert broker.stop() == 0


def test_admin_api_logins_over_https(start_broker: Any, pki: dict[str, Path], tmp_path: Path) -> None:
    auth = tmp_path / "admin-auth.json"
    auth.write_text(
        json.dumps(
            {
                "users": [
                    {"username": "root", "password": "R00t-s3cret", "userType": "Super"},
                    {"username": "viewer", "password": "V1ew-s3cret", "userType": "Normal"},
                ],
                "acls": [
                    {
                        "subject": "User:viewer",
                        "policies": [
                            {"entries": [{"resource": ["Topic:*", "Cluster"], "actions": ["Get", "List"]}]}
                        ],
                    }
                ],
            }
        )
    )
    broker = start_broker(
        "data",
        config={
            "authentication_enabled": True,
            "authorization_enabled": True,
            "auth_file": str(auth),
            "tls_cert_file": str(pki["cert"]),
            "tls_key_file": str(pki["key"]),
        },
    )
    url = broker.admin_url
    assert url.startswith("https://")
    with httpx.Client(verify=ssl.create_default_context(cafile=str(pki["ca"])), timeout=10) as http:
        assert http.get(f"{url}/healthz").status_code == 200  # open
        assert http.get(f"{url}/metrics").status_code == 200  # open for a local Prometheus (default)
        anonymous = http.get(f"{url}/topics")
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Basic")
        assert http.get(f"{url}/topics", auth=("root", "wrong")).status_code == 401
        assert http.get(f"{url}/topics", auth=("ghost", "R00t-s3cret")).status_code == 401
        assert (
            http.post(
                f"{url}/topics", json={"name": "Made", "queue_nums": 2}, auth=("root", "R00t-s3cret")
            ).status_code
            == 201
        )
        assert http.get(f"{url}/topics", auth=("viewer", "V1ew-s3cret")).status_code == 200
        assert http.get(f"{url}/topics/Made", auth=("viewer", "V1ew-s3cret")).status_code == 200
        refused = http.delete(f"{url}/topics/Made", auth=("viewer", "V1ew-s3cret"))
        assert refused.status_code == 403 and "may not Delete Topic:Made" in refused.json()["message"]
        assert http.delete(f"{url}/topics/Made", auth=("root", "R00t-s3cret")).status_code == 204
        body = http.get(f"{url}/topics", auth=("root", "R00t-s3cret")).text
        assert "R00t-s3cret" not in body and "V1ew-s3cret" not in body
    env = {**os.environ, "SIFTMQ_ADMIN_CA_FILE": str(pki["ca"])}
    cli = [sys.executable, "-m", "siftmq", "admin", "topics", "--json", "--url", url]
    refused = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and "error 401" in refused.stderr
    logged_in = {**env, "SIFTMQ_ADMIN_USER": "viewer", "SIFTMQ_ADMIN_PASSWORD": "V1ew-s3cret"}
    listed = subprocess.run(cli, env=logged_in, capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and json.loads(listed.stdout) is not None
    with pytest.raises(httpx.TransportError):  # plain HTTP to the HTTPS port: no answer
        httpx.get(url.replace("https://", "http://") + "/healthz", timeout=5)
    assert "R00t-s3cret" not in broker.log()
    assert broker.stop() == 0


def test_a_changed_auth_file_takes_effect_without_a_restart(start_broker: Any, tmp_path: Path) -> None:
    import signal
    import time

    from siftmq.errors import RemoteForbidden

    def policy(*topics: str) -> str:
        return json.dumps(
            {
                "users": [{"username": "alice", "password": "Al1ce-s3cret", "userType": "Normal"}],
                "acls": [
                    {
                        "subject": "User:alice",
                        "policies": [
                            {
                                "entries": [
                                    {"resource": [f"Topic:{t}" for t in topics], "actions": ["Pub", "Create"]}
                                ]
                            }
                        ],
                    }
                ],
            }
        )

    auth = tmp_path / "live-auth.json"
    auth.write_text(policy("Orders"))
    broker = start_broker(
        "data", config={"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth)}
    )
    alice = {"access_key": "alice", "secret_key": "Al1ce-s3cret"}

    async def send(topic: str) -> str:
        async with Producer(broker.endpoint, max_attempts=1, request_timeout=5, **alice) as producer:
            return (await producer.send(topic, b"x", tag="t")).message_id

    with pytest.raises(RemoteForbidden, match="may not Pub Topic:Secure"):
        asyncio.run(send("Secure"))
    auth.write_text(policy("Orders", "Secure"))
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGHUP)  # (the file is also watched: SIGHUP just does not wait)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert asyncio.run(send("Secure"))
            break
        except RemoteForbidden:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    auth.write_text("{not json")  # a broken edit keeps the policy in force
    broker.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert asyncio.run(send("Secure"))
    assert "was not reloaded; the previous users and policies stay" in broker.log()
    assert broker.stop() == 0
