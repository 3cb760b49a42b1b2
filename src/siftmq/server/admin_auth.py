"""Logins for the admin HTTP API: the broker's users (HTTP Basic, meant for HTTPS, or a bearer
token the API issued) and their ACLs.

With authentication on, every admin request but ``/healthz`` (and ``/metrics`` when
``admin_metrics_open``) needs ``Authorization: Basic`` with a user and password of the auth file,
or ``Authorization: Bearer`` with a token from ``POST /tokens``: 401 otherwise, with the same
message for an unknown user, a wrong password and a bad token. With authorization on,
:func:`admin_action` maps the request to the resource and action RocketMQ's ACL 2.0 uses (list →
``List`` on ``Cluster``, read → ``Get``, create → ``Create``, change → ``Update``, delete →
``Delete`` on the topic or group named in the path; checking or trying an expression is ``Get``, resending
a dead letter ``Update`` on its dead-letter topic): 403 without it. Users and ACLs
(``/users``, ``/acls``) are Super users' business only, whatever the policies say.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from siftmq.auth.acl import Action, User
from siftmq.auth.signature import UNKNOWN_USER_SECRET
from siftmq.server.auth import Gate

OPEN_PATHS: Final = frozenset({"/healthz"})
SUPER_PATHS: Final = ("users", "acls")  # first path parts only Super users may touch
#: A group's routes that name a topic after it: /groups/{group}/<route>/{topic}.
GROUP_TOPIC_ROUTES: Final = frozenset({"subscriptions", "programs", "lag"})
MAX_TOKENS: Final = 10_000
MAX_TOKENS_PER_USER: Final = 20
_BY_METHOD: Final = {"GET": Action.GET, "POST": Action.CREATE, "PATCH": Action.UPDATE, "PUT": Action.UPDATE}


@dataclass
class Tokens:
    """Bearer tokens issued to logged-in users. Only their SHA-256 is kept, with the user's name, a
    digest of the password it was issued under and its expiry. Each users table put in force
    (:meth:`user_table_changed`) ends the tokens of users it changed the password of or left out: a
    user deleted and created again under the same name and password is another login. In memory: a
    restart ends every token."""

    ttl_s: float
    _issued: dict[bytes, tuple[str, bytes, float]] = field(default_factory=dict)

    def issue(self, user: User) -> str | None:
        """A new token for ``user``; a user's oldest goes past :data:`MAX_TOKENS_PER_USER` (one user
        cannot use up the others' room); None while :data:`MAX_TOKENS` unexpired ones are out."""
        now = time.monotonic()
        mine = [k for k, v in self._issued.items() if v[0] == user.name]
        for old in mine[: max(0, len(mine) + 1 - MAX_TOKENS_PER_USER)]:  # dicts keep issue order
            del self._issued[old]
        if len(self._issued) >= MAX_TOKENS:
            self._issued = {k: v for k, v in self._issued.items() if v[2] > now}
            if len(self._issued) >= MAX_TOKENS:
                return None
        token = secrets.token_urlsafe(32)
        self._issued[_digest(token)] = (user.name, _digest(user.secret), now + self.ttl_s)
        return token

    def user(self, gate: Gate, token: str) -> User | None:
        found = self._issued.get(_digest(token))
        if found is None:
            return None
        name, secret_digest, expires = found
        user = gate.table.users.get(name)
        if (
            expires <= time.monotonic()
            or user is None
            or not hmac.compare_digest(secret_digest, _digest(user.secret))
        ):
            del self._issued[_digest(token)]
            return None
        return user

    def user_table_changed(self, users: Mapping[str, User]) -> None:
        """Ends the tokens of users not in ``users`` (the table now in force) or whose password is
        another: checked here, not on the token's next use, which may come after the user's name
        is taken again."""
        digests = {name: _digest(user.secret) for name, user in users.items()}
        self._issued = {
            k: v
            for k, v in self._issued.items()
            if v[0] in digests and hmac.compare_digest(v[1], digests[v[0]])
        }

    def revoke(self, token: str) -> bool:
        return self._issued.pop(_digest(token), None) is not None


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def bearer_token(authorization: str | None) -> str | None:
    if authorization and authorization.startswith("Bearer "):
        return authorization[7:].strip() or None
    return None


def needs_super(path: str) -> bool:
    parts = [p for p in path.split("/") if p]  # as admin_action splits it: "//users" is users too
    return bool(parts) and parts[0] in SUPER_PATHS


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


def admin_actions(method: str, path: str, query_topic: str | None) -> list[tuple[str, Action]]:
    """What an admin request needs, every one: its resource and action, and for a group's route
    that names a topic (its subscription, program or lag there) Get on that topic too — a program
    is tried on the topic's newest message, and the lag tells the topic's offsets. The group's
    routes reporting on all its topics leave out those the user may not Get (the routes' own check,
    :func:`siftmq.server.admin_inspect.may_get_topic`)."""
    needs = [admin_action(method, path, query_topic)]
    parts = [p for p in path.split("/") if p]
    if len(parts) == 4 and parts[0] == "groups" and parts[2] in GROUP_TOPIC_ROUTES:
        needs.append((f"Topic:{parts[3]}", Action.GET))
    return needs


def admin_action(method: str, path: str, query_topic: str | None) -> tuple[str, Action]:
    """The resource and action of an admin request."""
    parts = [p for p in path.split("/") if p]
    action = Action.DELETE if method == "DELETE" else _BY_METHOD.get(method, Action.GET)
    if parts[:1] == ["filter"] or (len(parts) == 3 and parts[0] == "topics" and parts[2] == "try"):
        # checking an expression, or trying it on a topic's newest messages, changes nothing
        return ("Cluster" if parts[0] == "filter" else f"Topic:{parts[1]}"), Action.GET
    if _is_resend(method, parts):
        return f"Topic:{parts[1]}", Action.UPDATE  # a dead letter sent back to its origin topic
    if len(parts) >= 2 and parts[0] == "topics":
        return f"Topic:{parts[1]}", action
    if len(parts) >= 2 and parts[0] == "groups":
        # a group's subscriptions and filter programs are changes to the group (Update)
        changed = len(parts) > 2 and method in ("PUT", "DELETE")
        return f"Group:{parts[1]}", Action.UPDATE if changed else action
    if parts[:1] == ["messages"] and query_topic:
        return f"Topic:{query_topic}", Action.GET
    if parts and parts[0] in ("topics", "groups", "dead-letters") and method == "GET":
        return "Cluster", Action.LIST
    return "Cluster", action


def _is_resend(method: str, parts: list[str]) -> bool:
    """``POST /topics/{t}/queues/{q}/messages/{o}/resend``, that route's shape exactly: a topic,
    queue or offset named ``resend`` is no resend."""
    return (
        method == "POST"
        and len(parts) == 7
        and (parts[0], parts[2], parts[4], parts[6]) == ("topics", "queues", "messages", "resend")
    )
