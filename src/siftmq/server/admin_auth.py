"""Logins for the admin HTTP API: the broker's users (HTTP Basic, meant for HTTPS) and their ACLs.

With authentication on, every admin request but ``/healthz`` (and ``/metrics`` when
``admin_metrics_open``) needs ``Authorization: Basic`` with a user and password of the auth file:
401 otherwise, with the same message for an unknown user and a wrong password. With authorization
on, :func:`admin_action` maps the request to the resource and action RocketMQ's ACL 2.0 uses (list
→ ``List`` on ``Cluster``, read → ``Get``, create → ``Create``, change → ``Update``, delete →
``Delete`` on the topic or group named in the path): 403 without it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Final

from siftmq.auth.acl import Action, User
from siftmq.server.auth import UNKNOWN_USER_SECRET, Gate

OPEN_PATHS: Final = frozenset({"/healthz"})
_BY_METHOD: Final = {"GET": Action.GET, "POST": Action.CREATE, "PATCH": Action.UPDATE, "PUT": Action.UPDATE}


def basic_user(gate: Gate, authorization: str | None) -> User | None:
    """The user an ``Authorization: Basic`` header names with the right password; None otherwise."""
    if not authorization or not authorization.startswith("Basic "):
        return None
    try:
        name, _, password = base64.b64decode(authorization[6:], validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user = gate.table.users.get(name)
    secret = user.secret if user is not None else UNKNOWN_USER_SECRET
    if not hmac.compare_digest(secret.encode(), password.encode()) or user is None:
        return None
    return user


def admin_action(method: str, path: str, query_topic: str | None) -> tuple[str, Action]:
    """The resource and action of an admin request."""
    parts = [p for p in path.split("/") if p]
    action = Action.DELETE if method == "DELETE" else _BY_METHOD.get(method, Action.GET)
    if len(parts) >= 2 and parts[0] == "topics":
        return f"Topic:{parts[1]}", action
    if len(parts) >= 2 and parts[0] == "groups":
        return f"Group:{parts[1]}", Action.UPDATE if len(parts) > 2 and method == "PUT" else action
    if parts[:1] == ["messages"] and query_topic:
        return f"Topic:{query_topic}", Action.GET
    if parts and parts[0] in ("topics", "groups") and method == "GET":
        return "Cluster", Action.LIST
    return "Cluster", action
