"""The v2 HMAC signature and ACL 2.0 decisions, without a broker."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator

import pytest

from siftmq.auth.acl import Action, parse_auth_file
from siftmq.auth.signature import INVALID, SignatureError, Verifier, parse, sign, verify
from siftmq.auth.throttle import FAILURES as GUESSES
from siftmq.errors import ConfigError

NOW = dt.datetime(2026, 11, 25, 10, 15, 0, tzinfo=dt.UTC)
STAMP = "20261125T101500Z"


def header(ak: str, signature: str) -> str:
    return f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={signature}"


def test_a_signature_made_as_the_official_client_makes_it_verifies() -> None:
    request = parse(header("alice", sign("s3cret", STAMP)), STAMP)
    assert request.access_key == "alice"
    verify(request, "s3cret", now=NOW, skew_s=300)


@pytest.mark.parametrize(
    ("authorization", "date", "secret", "message"),
    [
        (None, STAMP, "s3cret", "not signed"),
        ("Bearer x", STAMP, "s3cret", "not MQv2-HMAC-SHA1"),
        (header("", "ab"), STAMP, "s3cret", "no credential"),
        (header("alice", sign("wrong", STAMP)), STAMP, "s3cret", INVALID),
        (header("alice", sign("s3cret", "20261125T090000Z")), "20261125T090000Z", "s3cret", "clock skew"),
        (header("alice", sign("s3cret", "20261125T113000Z")), "20261125T113000Z", "s3cret", "clock skew"),
        (header("alice", sign("s3cret", "garbage")), "garbage", "s3cret", "YYYYMMDD"),
        (header("alice", sign("s3cret", STAMP)), None, "s3cret", "no x-mq-date-time"),
    ],
)
def test_bad_signatures_are_refused_with_a_reason(
    authorization: str | None, date: str | None, secret: str, message: str
) -> None:
    with pytest.raises(SignatureError, match=message):
        verify(parse(authorization, date), secret, now=NOW, skew_s=300)


def test_wrong_signatures_are_bounded_per_credential_and_address_a_replaced_password_no_guess() -> None:
    """Past GUESSES wrong signatures a minute, a credential's calls from that address are refused
    unchecked, the right one too; other addresses and credentials are served. A client still
    signing with the password the last change replaced is refused but not counted: the updated
    clients at its address go on being served while the change is rolled out."""
    now = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    right = header("alice", sign("N3w-pw", now))
    verifier = Verifier({"alice": "N3w-pw", "bob": "B0b-pw"}, 300, stale={"alice": "0ld-pw"})
    for _ in range(3 * GUESSES):  # the old password, again and again, from one address
        with pytest.raises(SignatureError, match="not valid"):
            verifier.who(header("alice", sign("0ld-pw", now)), now, "10.0.0.1")
    for i in range(GUESSES):  # guesses from another
        with pytest.raises(SignatureError, match="not valid"):
            verifier.who(header("alice", sign(f"guess-{i}", now)), now, "10.0.0.2")
    with pytest.raises(SignatureError, match="too many wrong signatures") as refused:
        verifier.who(right, now, "10.0.0.2")
    assert refused.value.reason == "throttled"
    assert verifier.who(header("bob", sign("B0b-pw", now)), now, "10.0.0.2") == "bob"
    assert verifier.who(right, now, "10.0.0.1") == "alice"


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is five hours behind UTC (in November)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y%m%dT%H%M%SZ")


def test_a_local_time_stamp_is_refused_by_name_unless_accepted_by_option(new_york: None) -> None:
    """The official Python client stamps its local time with a Z; accepted only when the broker is
    told to, since a UTC stamp then also passes as many hours later as the zone's offset."""
    local = _stamp(NOW.astimezone().replace(tzinfo=None))
    signed = parse(header("alice", sign("s3cret", local)), local)
    with pytest.raises(SignatureError, match="the broker's local time, not UTC"):
        verify(signed, "s3cret", now=NOW, skew_s=300)
    verify(signed, "s3cret", now=NOW, skew_s=300, local_time=True)
    five_hours_ago = _stamp(NOW.replace(tzinfo=None) - dt.timedelta(hours=5))  # a captured UTC stamp
    replayed = parse(header("alice", sign("s3cret", five_hours_ago)), five_hours_ago)
    with pytest.raises(SignatureError):
        verify(replayed, "s3cret", now=NOW, skew_s=300)


AUTH = {
    "users": [
        {"username": "admin", "password": "Sup3r-secret", "userType": "Super"},
        {"username": "alice", "password": "Al1ce-secret", "userType": "Normal"},
    ],
    "acls": [
        {
            "subject": "User:alice",
            "policies": [
                {
                    "policyType": "Custom",
                    "entries": [
                        {
                            "resource": ["Topic:Orders", "Group:alice-*"],
                            "actions": ["Pub", "Sub"],
                            "decision": "Allow",
                        },
                        {"resource": ["Topic:Audit*"], "actions": ["All"], "sourceIps": ["10.0.0.0/8"]},
                        {"resource": ["Topic:AuditSecret"], "actions": ["Sub"], "decision": "Deny"},
                    ],
                }
            ],
        }
    ],
}


@pytest.mark.parametrize(
    ("user", "resource", "action", "peer", "allowed"),
    [
        ("admin", "Topic:anything", Action.DELETE, "1.2.3.4", True),  # Super
        ("alice", "Topic:Orders", Action.PUB, "127.0.0.1", True),  # exact
        ("alice", "Topic:Orders", Action.DELETE, "127.0.0.1", False),  # action not granted
        ("alice", "Topic:Other", Action.PUB, "127.0.0.1", False),  # no matching entry
        ("alice", "Group:alice-web", Action.SUB, "127.0.0.1", True),  # prefix
        ("alice", "Group:bob-web", Action.SUB, "127.0.0.1", False),
        ("alice", "Topic:AuditLog", Action.PUB, "10.1.2.3", True),  # All, from the network
        ("alice", "Topic:AuditLog", Action.PUB, "192.168.0.1", False),  # source IP outside
        ("alice", "Topic:AuditSecret", Action.SUB, "10.1.2.3", False),  # Deny beats Allow
        ("alice", "Topic:AuditSecret", Action.PUB, "10.1.2.3", True),
    ],
)
def test_decisions(user: str, resource: str, action: Action, peer: str, allowed: bool) -> None:
    table = parse_auth_file(json.dumps(AUTH))
    assert table.decide(table.users[user], resource, action, peer) is allowed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"users": [}', "line 1"),
        ('{"users": [{"username": "a"}]}', "password"),
        ('{"users": [{"username": "a", "password": "p", "userType": "Root"}]}', "Super or Normal"),
        ('{"users": [], "acls": [{"subject": "User:ghost", "policies": []}]}', "subject"),
        (
            json.dumps(
                {
                    **AUTH,
                    "acls": [
                        {
                            "subject": "User:alice",
                            "policies": [{"entries": [{"resource": ["Queue:x"], "actions": ["Pub"]}]}],
                        }
                    ],
                }
            ),
            "resource 'Queue:x'",
        ),
        (
            json.dumps(
                {
                    **AUTH,
                    "acls": [
                        {
                            "subject": "User:alice",
                            "policies": [{"entries": [{"resource": ["Topic:x"], "actions": ["Fly"]}]}],
                        }
                    ],
                }
            ),
            "actions must be among",
        ),
        (
            json.dumps({"users": [{"username": f"u{i}", "password": "p"} for i in range(10_001)]}),
            "10001 users; at most 10000",
        ),
        ('{"users": [{"username": "%s", "password": "p"}]}' % ("u" * 65), "a username may have 64"),
        ('{"users": [{"username": "u", "password": "%s"}]}' % ("p" * 257), "a password 256"),
    ],
)
def test_a_malformed_file_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_auth_file(text)


def test_secrets_are_not_in_the_users_repr() -> None:
    table = parse_auth_file(json.dumps(AUTH))
    assert "Sup3r-secret" not in repr(table.users["admin"]) and "Al1ce-secret" not in repr(table)
