"""The users the security tests sign in as, and an auth file of them (shared by name)."""

from __future__ import annotations

from typing import Any

ROOT = ("root", "R00t-s3cret-pw")  # a Super user
ALICE = ("alice", "Al1ce-s3cret-pw")  # a Normal user: only what her ACL entries allow


def auth_file(alice_may: list[dict[str, Any]]) -> dict[str, Any]:
    """An auth file's content: root and alice, alice's ACL made of the entries ``alice_may``."""
    return {
        "users": [
            {"username": ROOT[0], "password": ROOT[1], "userType": "Super"},
            {"username": ALICE[0], "password": ALICE[1], "userType": "Normal"},
        ],
        "acls": [{"subject": f"User:{ALICE[0]}", "policies": [{"entries": alice_may}]}],
    }
