"""The admin API's users, ACLs and bearer tokens: the auth file managed on a running broker.

Users and ACLs keep RocketMQ 5.3's JSON shapes (``username``, ``password``, ``userType``;
``subject`` and ``policies`` of ``entries``), so what ``GET /acls`` answers can be put in another
broker's auth file. A change is checked by :mod:`siftmq.auth.manage`, written to the auth file
(atomically, 0600) and in force for the next call. A password is never answered, except one the
broker generated, once, in the answer that created it. Only Super users get here (the login
middleware sees to it); tokens are for any user.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from siftmq.auth import manage
from siftmq.auth.acl import MAX_PASSWORD, AuthTable, Entry, parse_entries
from siftmq.errors import BadRequestError, ConfigError, NotFoundError, StatusCode
from siftmq.server.admin_auth import Tokens, bearer_token
from siftmq.server.auth import Gate

_log = logging.getLogger(__name__)

UserType = Literal["Super", "Normal"]


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)
    password: str | None = Field(default=None, max_length=MAX_PASSWORD)  # None: generate one
    userType: UserType = "Normal"  # RocketMQ's field names


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    password: str | None = Field(default=None, max_length=MAX_PASSWORD)
    generatePassword: bool = False
    userType: UserType | None = None


class Policy(BaseModel):
    policyType: Literal["Custom", "Default"] = "Custom"
    entries: list[dict[str, Any]] = Field(min_length=1, max_length=1000)


MAX_POLICIES: Final = 10  # per request: at most 10,000 entries are looked at


class AclBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subject: str = Field(min_length=6, max_length=80)
    policies: list[Policy] = Field(min_length=1, max_length=MAX_POLICIES)


class AclReplace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policies: list[Policy] = Field(min_length=1, max_length=MAX_POLICIES)


def _user_json(table: AuthTable, name: str) -> dict[str, Any]:
    user = table.users.get(name)
    if user is None:
        raise NotFoundError(f"no user {name[:80]!r}")
    return {"username": user.name, "userType": "Super" if user.super_user else "Normal"}


def _subject(subject: str) -> str:
    if not subject.startswith("User:"):
        raise BadRequestError(f"subject must be User:<name>, not {subject[:80]!r}")
    return subject[5:]


def _entries(policies: list[Policy]) -> tuple[Entry, ...]:
    raw = [entry for policy in policies for entry in policy.entries]
    try:
        return parse_entries(raw, "policies.entries")
    except ConfigError as exc:
        raise BadRequestError(exc.message) from exc


def _acl_json(table: AuthTable, name: str) -> dict[str, Any]:
    entries = table.entries.get(name)
    if not entries:
        raise NotFoundError(f"user {name[:80]!r} has no ACL")
    return {"subject": f"User:{name}",
            "policies": [{"policyType": "Custom", "entries": [e.as_json() for e in entries]}]}  # fmt: skip


def users_router(gate: Gate | None, tokens: Tokens | None) -> APIRouter:
    """``/users``, ``/acls`` and ``/tokens``; with authentication off they answer 412."""
    router = APIRouter()

    def in_force() -> Gate:
        if gate is None:
            raise BadRequestError(
                "authentication is off on this broker: users, ACLs and tokens need authentication_enabled",
                status=StatusCode.PRECONDITION_FAILED,
            )
        return gate

    def who(request: Request) -> str:
        return str(request.state.user.name)

    # ------------------------------------------------------------------------------------ users

    @router.get("/users")
    async def list_users() -> list[dict[str, Any]]:
        table = in_force().table
        return [_user_json(table, name) for name in sorted(table.users)]

    @router.get("/users/{name}")
    async def get_user(name: str) -> dict[str, Any]:
        return _user_json(in_force().table, name)

    @router.post("/users", status_code=201)
    async def create_user(body: UserCreate, request: Request) -> dict[str, Any]:
        g = in_force()
        password = body.password if body.password is not None else manage.generate_secret()
        # the answer is made of the table this request put in force (another may follow during the wait)
        table = manage.add_user(g.table, body.username, password, super_user=body.userType == "Super")
        await g.change_everywhere(table)
        _log.info("user %s (%s) created by %s", body.username, body.userType, who(request))
        answer = _user_json(table, body.username)
        if body.password is None:
            answer["password"] = password  # generated: shown this once
        return answer

    @router.patch("/users/{name}")
    async def update_user(name: str, body: UserUpdate, request: Request) -> dict[str, Any]:
        g = in_force()
        if body.generatePassword and body.password is not None:
            raise BadRequestError("give a password or ask for a generated one, not both")
        password = manage.generate_secret() if body.generatePassword else body.password
        super_user = None if body.userType is None else body.userType == "Super"
        table = manage.update_user(g.table, name, password=password, super_user=super_user)
        await g.change_everywhere(table)
        _log.info("user %s updated by %s%s", name, who(request), " (new password)" if password else "")
        answer = _user_json(table, name)
        if body.generatePassword:
            answer["password"] = password
        return answer

    @router.delete("/users/{name}", status_code=204)
    async def delete_user(name: str, request: Request) -> Response:
        g = in_force()
        await g.change_everywhere(manage.remove_user(g.table, name))
        _log.info("user %s and its ACL deleted by %s", name, who(request))
        return Response(status_code=204)

    # ------------------------------------------------------------------------------------- acls

    @router.get("/acls")
    async def list_acls() -> list[dict[str, Any]]:
        table = in_force().table
        return [_acl_json(table, name) for name in sorted(table.entries) if table.entries[name]]

    @router.get("/acls/{subject}")
    async def get_acl(subject: str) -> dict[str, Any]:
        return _acl_json(in_force().table, _subject(subject))

    @router.post("/acls", status_code=201)
    async def add_acl(body: AclBody, request: Request) -> dict[str, Any]:
        g, name = in_force(), _subject(body.subject)
        table = manage.add_entries(g.table, name, _entries(body.policies))
        await g.change_everywhere(table)
        _log.info("ACL of %s extended by %s", name, who(request))
        return _acl_json(table, name)

    @router.put("/acls/{subject}")
    async def replace_acl(subject: str, body: AclReplace, request: Request) -> dict[str, Any]:
        g, name = in_force(), _subject(subject)
        table = manage.add_entries(g.table, name, _entries(body.policies), replace=True)
        await g.change_everywhere(table)
        _log.info("ACL of %s replaced by %s", name, who(request))
        return _acl_json(table, name)

    @router.delete("/acls/{subject}", status_code=204)
    async def delete_acl(subject: str, request: Request, resource: str | None = None) -> Response:
        g, name = in_force(), _subject(subject)
        await g.change_everywhere(manage.remove_entries(g.table, name, resource))
        _log.info("ACL of %s: %s deleted by %s", name, resource or "every entry", who(request))
        return Response(status_code=204)

    # ----------------------------------------------------------------------------------- tokens

    @router.post("/tokens", status_code=201)
    async def issue_token(request: Request) -> dict[str, Any]:
        in_force()
        assert tokens is not None  # issued with the gate
        if bearer_token(request.headers.get("authorization")) is not None:
            # a token minting tokens would outlive its expiry for ever
            raise BadRequestError("tokens are issued to a user and password (HTTP Basic), not to a token")
        token = tokens.issue(request.state.user)
        if token is None:
            raise BadRequestError(
                "too many tokens are out; try again when some expire", status=StatusCode.TOO_MANY_REQUESTS
            )
        return {"token": token, "token_type": "Bearer", "expires_in": int(tokens.ttl_s)}

    @router.delete("/tokens", status_code=204)
    async def revoke_token(request: Request) -> Response:
        in_force()
        token = bearer_token(request.headers.get("authorization"))
        if token is None or tokens is None or not tokens.revoke(token):
            raise BadRequestError("DELETE /tokens revokes the bearer token it is sent with")
        return Response(status_code=204)

    return router
