"""Users, ACLs and bearer tokens managed live through the admin API and ``siftmq admin``, against a
real broker process, with siftmq's client signing its calls."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from security_users import ALICE, ROOT, auth_file
from siftmq.client import Producer
from siftmq.errors import RemoteForbidden, RemoteUnauthorized

pytestmark = pytest.mark.integration
#: what siftmq's own callers send: a POST without a JSON body needs it (see the admin API)
OWN = {"X-Siftmq-Client": "test"}

AUTH = auth_file(
    [
        {"resource": ["Topic:Orders"], "actions": ["Pub", "Create"]},
        {"resource": ["Topic:Audit"], "actions": ["Pub"]},  # no Create
    ]
)


def start(start_broker: Any, auth_file: Path) -> Any:
    return start_broker(
        "data",
        config={"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth_file)},
    )


def send(endpoint: str, user: str, password: str, topic: str = "Orders") -> str:
    async def go() -> str:
        async with Producer(
            endpoint, max_attempts=1, request_timeout=5, access_key=user, secret_key=password
        ) as producer:
            return (await producer.send(topic, b"x", tag="t")).message_id

    return asyncio.run(go())


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(AUTH))
    path.chmod(0o600)
    return path


def test_users_and_acls_change_live_and_survive_a_restart(start_broker: Any, auth_file: Path) -> None:
    broker = start(start_broker, auth_file)
    url = broker.admin_url
    with httpx.Client(base_url=url, timeout=10, auth=ROOT, headers=OWN) as http:
        created = http.post("/users", json={"username": "bob"})
        assert created.status_code == 201, created.text
        bob = created.json()["password"]  # generated, shown once
        assert len(bob) >= 24 and created.json()["userType"] == "Normal"
        listed = http.get("/users").json()
        assert {"username": "bob", "userType": "Normal"} in listed
        assert not any("password" in user for user in listed)
        assert "password" not in http.get("/users/bob").json()
        assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600 and '"bob"' in auth_file.read_text()

        with pytest.raises(RemoteForbidden, match="may not Pub Topic:Orders"):
            send(broker.endpoint, "bob", bob)  # a user without an ACL
        acl = {
            "subject": "User:bob",
            "policies": [{"entries": [{"resource": ["Topic:Ord*"], "actions": ["Pub"]}]}],
        }
        assert http.post("/acls", json=acl).status_code == 201
        send(broker.endpoint, "alice", ALICE[1])  # alice creates Orders (she may Create it)
        assert send(broker.endpoint, "bob", bob)  # in force for the next call, no restart

        # a bad entry is refused naming what is wrong, and changes nothing
        before = auth_file.read_text()
        bad = {
            "subject": "User:bob",
            "policies": [{"entries": [{"resource": ["Topic:x"], "actions": ["Fly"]}]}],
        }
        refused = http.post("/acls", json=bad)
        assert refused.status_code == 400 and "actions must be among" in refused.json()["message"]
        assert http.post("/acls", json={**acl, "subject": "User:ghost"}).status_code == 404
        assert http.post("/users", json={"username": "bob"}).status_code == 409
        assert http.post("/users", json={"username": "x", "password": "short"}).status_code == 400
        assert http.post("/users", json={"username": "bad name!"}).status_code == 400
        assert http.post("/users", json={"username": "empty", "password": ""}).status_code == 400
        too_long = http.post("/users", json={"username": "long", "password": "P" * 300})
        assert too_long.status_code == 422 and "P" * 300 not in too_long.text  # not echoed
        assert auth_file.read_text() == before

        renewed = http.patch("/users/bob", json={"generatePassword": True})
        new_bob = renewed.json()["password"]
        assert renewed.status_code == 200 and new_bob != bob
        with pytest.raises(RemoteUnauthorized):
            send(broker.endpoint, "bob", bob)  # the old password no longer signs
        assert send(broker.endpoint, "bob", new_bob)

        last = http.delete(f"/users/{ROOT[0]}")
        assert last.status_code == 409 and "last Super user" in last.json()["message"]
        demoted = http.patch(f"/users/{ROOT[0]}", json={"userType": "Normal"})
        assert demoted.status_code == 409

        assert http.delete("/acls/User:bob", params={"resource": "Topic:Nope"}).status_code == 404
        assert http.delete("/acls/User:bob", params={"resource": "Topic:Ord*"}).status_code == 204
        assert http.get("/acls/User:bob").status_code == 404
        with pytest.raises(RemoteForbidden):
            send(broker.endpoint, "bob", new_bob)

    # a Normal user: no user admin
    with httpx.Client(base_url=url, timeout=10, auth=ALICE, headers=OWN) as http:
        program = {"source": "def match(m):\n    return True\n"}
        denied = http.put("/groups/alice-app/programs/Orders", json=program)  # needs Update on the group
        assert denied.status_code == 403 and "may not Update Group:alice-app" in denied.json()["message"]
        refused = http.get("/users")
        assert refused.status_code == 403 and "users and ACLs" in refused.json()["message"]
        assert http.post("/users", json={"username": "eve"}).status_code == 403

    assert broker.stop() == 0
    log = broker.log()
    assert "user bob (Normal) created by root" in log
    assert not any(secret in log for secret in (bob, new_bob, ROOT[1], ALICE[1]))

    broker = start(start_broker, auth_file)  # the changes were written, not only held in memory
    assert send(broker.endpoint, "alice", ALICE[1])
    with pytest.raises(RemoteForbidden):
        send(broker.endpoint, "bob", new_bob)
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT, headers=OWN) as http:
        assert http.delete("/users/bob").status_code == 204
    with pytest.raises(RemoteUnauthorized):
        send(broker.endpoint, "bob", new_bob)
    assert broker.stop() == 0


def test_an_edit_by_hand_is_not_overwritten_by_the_api(start_broker: Any, auth_file: Path) -> None:
    broker = start(start_broker, auth_file)
    edited = json.loads(auth_file.read_text())
    edited["users"].append({"username": "handmade", "password": "H4ndmade-pw"})
    auth_file.write_text(json.dumps(edited))  # and the API changes something before the watcher looks
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT, headers=OWN) as http:
        stale = http.post("/users", json={"username": "viaapi"})
        assert stale.status_code == 409 and "changed on disk" in stale.json()["message"]
        assert http.post("/users", json={"username": "viaapi"}).status_code == 201  # against the edit
        names = {u["username"] for u in http.get("/users").json()}
    assert {"handmade", "viaapi"} <= names
    assert broker.stop() == 0


def test_a_hand_edit_that_failed_to_load_is_not_overwritten_by_the_api(
    start_broker: Any, auth_file: Path
) -> None:
    """Before, the failed reload took the broken file for the one in force, and the next API change
    wrote the broker's table over the operator's edit."""
    broker = start(start_broker, auth_file)
    edited = json.loads(auth_file.read_text())
    edited["users"].append({"username": "handmade", "password": "H4ndmade-pw"})
    broken = json.dumps(edited)[:-1] + ', "operatorNote": [1, 2,}'
    auth_file.write_text(broken)
    broker.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "was not reloaded" not in broker.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "was not reloaded" in broker.log()
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT, headers=OWN) as http:
        refused = http.post("/users", json={"username": "viaapi"})
        assert refused.status_code == 409, refused.text
        assert "does not load" in refused.json()["message"] and "not made" in refused.json()["message"]
        assert auth_file.read_text() == broken  # the operator's edit is there to fix
        auth_file.write_text(json.dumps(edited))  # fixed
        for _ in range(2):  # the first may meet the fixed file before the watcher read it
            created = http.post("/users", json={"username": "viaapi"})
            if created.status_code != 409:
                break
        assert created.status_code == 201, created.text
        names = {u["username"] for u in http.get("/users").json()}
    assert {"handmade", "viaapi"} <= names
    assert broker.stop() == 0


def test_a_topic_the_call_would_create_needs_create(start_broker: Any, auth_file: Path) -> None:
    broker = start(start_broker, auth_file)
    with pytest.raises(RemoteForbidden, match="may not Create Topic:Audit"):
        send(broker.endpoint, *ALICE, topic="Audit")
    made = httpx.post(f"{broker.admin_url}/topics", json={"name": "Audit"}, auth=ROOT, timeout=10)
    assert made.status_code == 201
    assert send(broker.endpoint, *ALICE, topic="Audit")  # Pub is enough on a topic that exists
    assert broker.stop() == 0


def test_bearer_tokens(start_broker: Any, auth_file: Path) -> None:
    broker = start(start_broker, auth_file)
    url = broker.admin_url
    with httpx.Client(base_url=url, timeout=10, headers=OWN) as http:
        assert http.post("/tokens").status_code == 401
        issued = http.post("/tokens", auth=ROOT)
        assert issued.status_code == 201 and issued.json()["token_type"] == "Bearer"
        token = issued.json()["token"]
        bearer = {"Authorization": f"Bearer {token}"}
        assert http.get("/topics", headers=bearer).status_code == 200
        assert http.get("/users", headers=bearer).status_code == 200  # the token acts as its user
        assert http.get("/topics", headers={"Authorization": f"Bearer {token}x"}).status_code == 401
        minted = http.post("/tokens", headers=bearer)  # a token cannot renew itself for ever
        assert minted.status_code == 400 and "HTTP Basic" in minted.json()["message"]
        assert http.delete("/tokens", headers=bearer).status_code == 204
        assert http.get("/topics", headers=bearer).status_code == 401  # revoked

        alice_token = http.post("/tokens", auth=ALICE).json()["token"]
        alice = {"Authorization": f"Bearer {alice_token}"}
        assert http.get("/users", headers=alice).status_code == 403
        assert http.get("/topics", headers=alice).status_code == 403  # her ACL has no List on Cluster
        assert http.patch("/users/alice", json={"password": "An0ther-s3cret"}, auth=ROOT).status_code == 200
        assert http.get("/topics", headers=alice).status_code == 401  # her password changed: token gone
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'siftmq_auth_failures_total{reason="admin"}' in metrics
    assert "admin API login failed" in broker.log() and token not in broker.log()
    assert broker.stop() == 0


def test_a_token_ends_with_its_users_deletion_or_password_for_good(
    start_broker: Any, auth_file: Path
) -> None:
    """A token is its user's login: the user deleted and created again under the same name and
    password (a provisioning script restoring an account), or the password changed and changed back,
    and the token issued before is refused, though it was not used in between."""
    broker = start(start_broker, auth_file)
    may_list = {
        "subject": "User:alice",
        "policies": [{"entries": [{"resource": ["Cluster"], "actions": ["List"]}]}],
    }
    with httpx.Client(base_url=broker.admin_url, timeout=10, headers=OWN) as http:
        assert http.post("/acls", json=may_list, auth=ROOT).status_code == 201

        def alice_token() -> dict[str, str]:
            token = http.post("/tokens", auth=ALICE).json()["token"]
            bearer = {"Authorization": f"Bearer {token}"}
            assert http.get("/topics", headers=bearer).status_code == 200
            return bearer

        bearer = alice_token()
        assert http.delete("/users/alice", auth=ROOT).status_code == 204
        again = {"username": ALICE[0], "password": ALICE[1]}
        assert http.post("/users", json=again, auth=ROOT).status_code == 201
        assert http.post("/acls", json=may_list, auth=ROOT).status_code == 201
        assert http.get("/topics", auth=ALICE).status_code == 200  # the new alice logs in
        assert http.get("/topics", headers=bearer).status_code == 401  # not with the old alice's token

        bearer = alice_token()
        for password in ("Interim-s3cret-pw", ALICE[1]):
            assert http.patch("/users/alice", json={"password": password}, auth=ROOT).status_code == 200
        assert http.get("/topics", headers=bearer).status_code == 401


def test_users_and_acls_need_authentication_on(start_broker: Any) -> None:
    broker = start_broker("plain")
    answer = httpx.get(f"{broker.admin_url}/users", timeout=10)
    assert answer.status_code == 409 and "authentication is off" in answer.json()["message"]
    assert broker.stop() == 0


def _cli(
    url: str, *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "siftmq", "admin", *args, "--url", url],
        env={**os.environ, **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_line(start_broker: Any, tmp_path: Path) -> None:
    auth_file = tmp_path / "fresh-auth.json"
    made = subprocess.run(
        [sys.executable, "-m", "siftmq", "admin", "init-auth", str(auth_file), "--user", "boss"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    password = made.stdout.rsplit("password: ", 1)[1].strip()
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
    again = subprocess.run(
        [sys.executable, "-m", "siftmq", "admin", "init-auth", str(auth_file)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 1 and "exists" in again.stderr

    broker = start(start_broker, auth_file)
    url = broker.admin_url
    boss = {"SIFTMQ_ADMIN_USER": "boss", "SIFTMQ_ADMIN_PASSWORD": password}
    created = _cli(url, "user", "create", "carol", env=boss)
    assert created.returncode == 0, created.stderr
    carol = created.stdout.rsplit("password of carol: ", 1)[1].strip()
    chosen = _cli(url, "user", "create", "dave", "--password-stdin", env=boss, stdin="Dave-s3cret-pw\n")
    assert chosen.returncode == 0 and "password of" not in chosen.stdout
    acl = _cli(url, "acl", "create", "carol", "-r", "Topic:Orders", "-a", "Pub", "-a", "Create", env=boss)
    assert acl.returncode == 0 and "Topic:Orders" in acl.stdout, acl.stderr
    assert send(broker.endpoint, "carol", carol)
    with pytest.raises(RemoteForbidden):  # dave signs with the password from stdin (and has no ACL)
        send(broker.endpoint, "dave", "Dave-s3cret-pw")
    listed = _cli(url, "user", "list", "--json", env=boss)
    assert {u["username"] for u in json.loads(listed.stdout)} == {"boss", "carol", "dave"}
    acls = json.loads(_cli(url, "acl", "list", "--json", env=boss).stdout)
    assert acls[0]["subject"] == "User:carol"

    token = _cli(url, "token", env=boss)
    assert token.returncode == 0
    by_token = _cli(url, "user", "list", "--json", env={"SIFTMQ_ADMIN_TOKEN": token.stdout.strip()})
    assert by_token.returncode == 0 and "carol" in by_token.stdout

    assert _cli(url, "acl", "delete", "carol", "-y", env=boss).returncode == 0
    with pytest.raises(RemoteForbidden):
        send(broker.endpoint, "carol", carol)
    assert _cli(url, "user", "delete", "carol", "-y", env=boss).returncode == 0
    refused = _cli(url, "user", "delete", "boss", "-y", env=boss)
    assert refused.returncode == 1 and "last Super user" in refused.stderr
    assert broker.stop() == 0
