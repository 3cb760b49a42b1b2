"""Live user and ACL changes (pure rules) and the auth file written back: what is parsed again
decides as before."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.auth import manage
from siftmq.auth.acl import Action, AuthTable, dump_auth_file, parse_auth_file, parse_entries
from siftmq.errors import BadRequestError, NotFoundError

BASE = parse_auth_file(
    json.dumps(
        {
            "users": [
                {"username": "root", "password": "r00t-pass", "userType": "Super"},
                {"username": "alice", "password": "alice-pass"},
            ],
            "acls": [
                {
                    "subject": "User:alice",
                    "policies": [
                        {"entries": [{"resource": ["Topic:a-*", "Group:g"], "actions": ["Pub", "Sub"]}]},
                        {"entries": [{"resource": ["Topic:a-secret"], "actions": ["All"], "decision": "Deny",
                                      "sourceIps": ["10.0.0.0/8", "127.0.0.1"]}]},
                    ],
                }
            ],
        }
    )
)  # fmt: skip


def test_add_update_remove_user() -> None:
    table = manage.add_user(BASE, "bob", "bob-pass-1", super_user=False)
    assert table.users["bob"].secret == "bob-pass-1" and "bob" not in BASE.users  # BASE unchanged
    table = manage.update_user(table, "bob", password="bob-pass-2", super_user=True)
    assert table.users["bob"].secret == "bob-pass-2" and table.users["bob"].super_user
    table = manage.remove_user(table, "alice")
    assert "alice" not in table.users and "alice" not in table.entries  # the ACL goes with the user
    with pytest.raises(NotFoundError):
        manage.update_user(table, "ghost", password="whatever-1")


@pytest.mark.parametrize(
    ("name", "password", "message"),
    [("alice", "alice-pass-2", "already exists"), ("a b", "long-enough", "must be 1-64"),
     ("carol", "short", "8 to 256"), ("", "long-enough", "must be 1-64")],
)  # fmt: skip
def test_bad_users_are_refused(name: str, password: str, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        manage.add_user(BASE, name, password, super_user=False)


def test_the_last_super_user_stays() -> None:
    with pytest.raises(BadRequestError, match="last Super user"):
        manage.remove_user(BASE, "root")
    with pytest.raises(BadRequestError, match="last Super user"):
        manage.update_user(BASE, "root", super_user=False)
    two = manage.add_user(BASE, "root2", "r00t-pass-2", super_user=True)
    assert "root" not in manage.remove_user(two, "root").users


def test_acl_entries_added_replaced_and_removed() -> None:
    entries = parse_entries([{"resource": ["Topic:b", "Topic:c"], "actions": ["Pub"]}], "t")
    added = manage.add_entries(BASE, "alice", entries)
    assert len(added.entries["alice"]) == 3
    assert added.decide(added.users["alice"], "Topic:b", Action.PUB, None)
    replaced = manage.add_entries(added, "alice", entries, replace=True)
    assert replaced.entries["alice"] == entries
    assert not replaced.decide(replaced.users["alice"], "Topic:a-x", Action.PUB, None)
    narrowed = manage.remove_entries(replaced, "alice", "Topic:b")
    assert narrowed.entries["alice"][0].resources == ("Topic:c",)
    assert "alice" not in manage.remove_entries(narrowed, "alice", "Topic:c").entries
    with pytest.raises(NotFoundError):
        manage.remove_entries(narrowed, "alice", "Topic:zzz")
    with pytest.raises(NotFoundError):
        manage.add_entries(BASE, "ghost", entries)


def test_a_dumped_file_parses_back_to_the_same_table() -> None:
    again = parse_auth_file(dump_auth_file(BASE))
    assert again == BASE
    shown = BASE.as_json(with_secrets=False)
    assert "pass" not in json.dumps(shown)


RESOURCES = ["Topic:a-1", "Topic:a-secret", "Topic:b", "Group:g", "Group:h", "Cluster"]
PEERS = [None, "10.1.2.3", "127.0.0.1", "192.168.0.1"]
_entry = st.fixed_dictionaries(
    {
        "resource": st.lists(
            st.sampled_from([*RESOURCES, "Topic:a-*", "*", "Group:*"]), min_size=1, max_size=3
        ),
        "actions": st.lists(st.sampled_from([a.value for a in Action]), min_size=1, max_size=3),
        "decision": st.sampled_from(["Allow", "Deny"]),
    },
    optional={"sourceIps": st.lists(st.sampled_from(["10.0.0.0/8", "127.0.0.1", "::1"]), min_size=1)},
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_entry, min_size=1, max_size=4), min_size=1, max_size=4))
def test_live_changes_written_and_read_back_decide_the_same(batches: list[list[dict[str, object]]]) -> None:
    """Each batch appended through ``manage`` (as the admin API does), the file dumped and parsed
    after each: every decision of the parsed table equals the one in memory."""
    table: AuthTable = BASE
    for batch in batches:
        table = manage.add_entries(table, "alice", parse_entries(batch, "t"))
        parsed = parse_auth_file(dump_auth_file(table))
        for resource in RESOURCES:
            for action in Action:
                for peer in PEERS:
                    assert parsed.decide(parsed.users["alice"], resource, action, peer) == table.decide(
                        table.users["alice"], resource, action, peer
                    )
