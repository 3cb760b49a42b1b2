"""Users and ACL 2.0 policies, in RocketMQ 5.3's file shapes, and the decision for one action.

The auth file (JSON)::

    {"users": [{"username": "admin", "password": "...", "userType": "Super"},
               {"username": "alice", "password": "...", "userType": "Normal"}],
     "acls":  [{"subject": "User:alice",
                "policies": [{"policyType": "Custom",
                              "entries": [{"resource": ["Topic:Orders", "Group:alice-*"],
                                           "actions": ["Pub", "Sub", "Get"],
                                           "sourceIps": ["127.0.0.1", "10.0.0.0/8"],
                                           "decision": "Allow"}]}]}]}

A user's ``password`` is the secret key its clients sign with (RocketMQ's access key / secret key
pair). Resources are ``Cluster``, ``Namespace``, ``Topic:<name>`` and ``Group:<name>``, matched
exactly, by prefix (``Topic:orders-*``) or all of a kind (``Topic:*``, or ``*`` for everything).
Super users may do everything. A Normal user may do what an Allow entry matching the resource,
the action and the peer address grants, unless a matching Deny entry forbids it: Deny wins, and
no matching entry means no.
"""

from __future__ import annotations

import enum
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from siftmq.errors import ConfigError


class Action(enum.StrEnum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


RESOURCE_KINDS: Final = ("Cluster", "Namespace", "Topic", "Group")
MAX_ENTRIES: Final = 10_000  # entries of one file (bounds the work of one decision)
#: Users of one file, and the characters of a user's name and password (the admin API's bounds
#: too): the table crosses to every front-end in one frame, which must stay within its size.
MAX_USERS: Final = 10_000
MAX_USER_NAME: Final = 64
MAX_PASSWORD: Final = 256


@dataclass(frozen=True, slots=True)
class User:
    name: str
    secret: str = field(repr=False)  # never printed
    super_user: bool = False


@dataclass(frozen=True, slots=True)
class Entry:
    resources: tuple[str, ...]
    actions: frozenset[Action]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]  # empty: any address
    allow: bool

    def matches(self, resource: str, action: Action, peer: str | None) -> bool:
        if Action.ALL not in self.actions and action not in self.actions:
            return False
        if not any(_resource_matches(pattern, resource) for pattern in self.resources):
            return False
        if not self.networks:
            return True
        try:
            address = ipaddress.ip_address(peer or "")
        except ValueError:
            return False
        return any(address in net for net in self.networks)

    def as_json(self) -> dict[str, Any]:
        """The entry in the auth file's shape."""
        out: dict[str, Any] = {
            "resource": list(self.resources),
            "actions": sorted(a.value for a in self.actions),
            "decision": "Allow" if self.allow else "Deny",
        }
        if self.networks:
            out["sourceIps"] = [str(net) for net in self.networks]
        return out


@dataclass(frozen=True, slots=True)
class AuthTable:
    """The users and their policy entries; immutable (a reload builds a new one)."""

    users: Mapping[str, User]
    entries: Mapping[str, tuple[Entry, ...]]

    def decide(self, user: User, resource: str, action: Action, peer: str | None) -> bool:
        """Whether ``user`` may take ``action`` on ``resource`` from ``peer`` (an IP address)."""
        if user.super_user:
            return True
        allowed = False
        for entry in self.entries.get(user.name, ()):
            if entry.matches(resource, action, peer):
                if not entry.allow:
                    return False  # Deny wins
                allowed = True
        return allowed

    def as_json(self, *, with_secrets: bool) -> dict[str, Any]:
        """The table in the auth file's shape; the passwords only ``with_secrets`` (for the file).

        A user's entries are written as one ``Custom`` policy (the file may have split them over
        several; a decision does not depend on how)."""
        users = []
        for user in self.users.values():
            item = {"username": user.name, "userType": "Super" if user.super_user else "Normal"}
            if with_secrets:
                item["password"] = user.secret
            users.append(item)
        acls = [
            {"subject": f"User:{name}",
             "policies": [{"policyType": "Custom", "entries": [e.as_json() for e in found]}]}
            for name, found in self.entries.items() if found
        ]  # fmt: skip
        return {"users": users, "acls": acls}


def dump_auth_file(table: AuthTable) -> str:
    """The text of an auth file holding ``table`` (parsed back, it decides the same)."""
    return json.dumps(table.as_json(with_secrets=True), indent=2, ensure_ascii=False) + "\n"


def parse_entries(raw: Any, where: str) -> tuple[Entry, ...]:
    """Policy entries sent to the admin API, checked as the auth file's are."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list of entries")
    if len(raw) > MAX_ENTRIES:
        raise ConfigError(f"{where}: more than {MAX_ENTRIES} entries")
    return tuple(_entry(item, f"{where}[{i}]") for i, item in enumerate(raw))


def _resource_matches(pattern: str, resource: str) -> bool:
    if pattern == "*" or pattern == resource:
        return True
    return pattern.endswith("*") and resource.startswith(pattern[:-1])


def parse_auth_file(text: str, *, source: str = "the auth file") -> AuthTable:
    """Parse an auth file; raises :class:`ConfigError` naming the line (for JSON errors) or the
    entry and what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected an object with 'users' and 'acls'")
    users: dict[str, User] = {}
    listed = _list(data, "users", source)
    if len(listed) > MAX_USERS:
        raise ConfigError(f"{source}: {len(listed)} users; at most {MAX_USERS}")
    for i, item in enumerate(listed):
        where = f"{source}: users[{i}]"
        name, secret = _text(item, "username", where), _text(item, "password", where)
        if len(name) > MAX_USER_NAME or len(secret) > MAX_PASSWORD:
            raise ConfigError(
                f"{where}: a username may have {MAX_USER_NAME} characters, a password {MAX_PASSWORD}"
            )
        kind = item.get("userType", "Normal")
        if kind not in ("Super", "Normal"):
            raise ConfigError(f"{where}: userType must be Super or Normal, not {kind!r}")
        if name in users:
            raise ConfigError(f"{where}: user {name!r} is defined twice")
        users[name] = User(name, secret, kind == "Super")
    entries: dict[str, list[Entry]] = {}
    count = 0
    for i, acl in enumerate(_list(data, "acls", source)):
        where = f"{source}: acls[{i}]"
        subject = _text(acl, "subject", where)
        if not subject.startswith("User:") or subject[5:] not in users:
            raise ConfigError(f"{where}: subject must be User:<a user defined in 'users'>, not {subject!r}")
        for j, policy in enumerate(_list(acl, "policies", where)):
            for k, raw in enumerate(_list(policy, "entries", f"{where}.policies[{j}]")):
                count += 1
                if count > MAX_ENTRIES:
                    raise ConfigError(f"{source}: more than {MAX_ENTRIES} policy entries")
                entries.setdefault(subject[5:], []).append(_entry(raw, f"{where}.policies[{j}].entries[{k}]"))
    return AuthTable(users, {name: tuple(found) for name, found in entries.items()})


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected an object")
    resources = tuple(_strings(raw, "resource", where))
    for resource in resources:
        kind = resource.split(":", 1)[0]
        if resource != "*" and kind not in RESOURCE_KINDS:
            raise ConfigError(f"{where}: resource {resource!r} is not Cluster, Namespace, Topic:x or Group:x")
    try:
        actions = frozenset(Action(a) for a in _strings(raw, "actions", where))
    except ValueError as exc:
        raise ConfigError(f"{where}: actions must be among {', '.join(a.value for a in Action)}") from exc
    try:
        networks = tuple(ipaddress.ip_network(n, strict=False) for n in raw.get("sourceIps", []) or [])
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: sourceIps: {exc}") from exc
    decision = raw.get("decision", "Allow")
    if decision not in ("Allow", "Deny"):
        raise ConfigError(f"{where}: decision must be Allow or Deny, not {decision!r}")
    return Entry(resources, actions, networks, decision == "Allow")


def _list(item: Any, key: str, where: str) -> Sequence[Any]:
    found = item.get(key, []) if isinstance(item, dict) else None
    if not isinstance(found, list):
        raise ConfigError(f"{where}: {key!r} must be a list")
    return found


def _text(item: Any, key: str, where: str) -> str:
    value = item.get(key) if isinstance(item, dict) else None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    return value


def _strings(item: dict[str, Any], key: str, where: str) -> Iterable[str]:
    values = item.get(key)
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise ConfigError(f"{where}: {key!r} must be a non-empty list of strings")
    return values
