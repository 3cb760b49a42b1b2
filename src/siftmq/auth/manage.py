"""Live changes to the users and ACLs: each builds a new :class:`AuthTable` from the one in force.

Pure, so the admin API (which writes the result to the auth file and swaps it in) and the tests
share one set of rules: names and passwords bounded, a user's ACL gone with the user, and the last
Super user never deleted or demoted (that would lock every administrator out of a running broker).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Final

from siftmq.auth.acl import MAX_ENTRIES, MAX_PASSWORD, MAX_USER_NAME, MAX_USERS, AuthTable, Entry, User
from siftmq.errors import BadRequestError, NotFoundError, StatusCode

MIN_PASSWORD: Final = 8
#: RocketMQ's user names are plain identifiers; nothing here may need quoting in a subject.
USER_NAME: Final = re.compile(rf"[A-Za-z0-9_.@-]{{1,{MAX_USER_NAME}}}")


def generate_secret() -> str:
    """A new password: 192 random bits, URL-safe (it is printed once and never again)."""
    return secrets.token_urlsafe(24)


def check_password(password: str) -> None:
    if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise BadRequestError(f"a password must be {MIN_PASSWORD} to {MAX_PASSWORD} characters long")


def add_user(table: AuthTable, name: str, password: str, *, super_user: bool) -> AuthTable:
    if not USER_NAME.fullmatch(name):
        raise BadRequestError(f"user name {name[:80]!r} must be 1-64 of letters, digits and _.@-")
    check_password(password)
    if name in table.users:
        raise BadRequestError(f"user {name!r} already exists", status=StatusCode.PRECONDITION_FAILED)
    if len(table.users) >= MAX_USERS:
        raise BadRequestError(f"the broker holds {MAX_USERS} users, its limit")
    return AuthTable({**table.users, name: User(name, password, super_user)}, table.entries)


def update_user(
    table: AuthTable, name: str, *, password: str | None = None, super_user: bool | None = None
) -> AuthTable:
    old = _user(table, name)
    if password is not None:
        check_password(password)
    new = User(name, old.secret if password is None else password,
               old.super_user if super_user is None else super_user)  # fmt: skip
    if old.super_user and not new.super_user:
        _keep_a_super_user(table, name, "demoted")
    return AuthTable({**table.users, name: new}, table.entries)


def remove_user(table: AuthTable, name: str) -> AuthTable:
    """The table without the user and its ACL."""
    if _user(table, name).super_user:
        _keep_a_super_user(table, name, "deleted")
    users = {k: v for k, v in table.users.items() if k != name}
    return AuthTable(users, {k: v for k, v in table.entries.items() if k != name})


def add_entries(table: AuthTable, name: str, entries: Sequence[Entry], *, replace: bool = False) -> AuthTable:
    """The user's ACL with ``entries`` appended (or, with ``replace``, instead of what it had)."""
    _user(table, name)
    kept = () if replace else table.entries.get(name, ())
    if sum(len(v) for k, v in table.entries.items() if k != name) + len(kept) + len(entries) > MAX_ENTRIES:
        raise BadRequestError(f"the auth file may hold at most {MAX_ENTRIES} policy entries")
    return AuthTable(table.users, {**table.entries, name: (*kept, *entries)})


def remove_entries(table: AuthTable, name: str, resource: str | None = None) -> AuthTable:
    """The user's ACL emptied, or with ``resource`` taken out of every entry (an entry left with no
    resource goes)."""
    _user(table, name)
    if name not in table.entries:
        raise NotFoundError(f"user {name!r} has no ACL")
    kept: tuple[Entry, ...] = ()
    if resource is not None:
        if not any(resource in e.resources for e in table.entries[name]):
            raise NotFoundError(f"no entry of user {name!r} names {resource!r}")
        for entry in table.entries[name]:
            left = tuple(r for r in entry.resources if r != resource)
            if left:
                kept += (Entry(left, entry.actions, entry.networks, entry.allow),)
    entries = {k: v for k, v in table.entries.items() if k != name}
    if kept:
        entries[name] = kept
    return AuthTable(table.users, entries)


def _user(table: AuthTable, name: str) -> User:
    found = table.users.get(name)
    if found is None:
        raise NotFoundError(f"no user {name[:80]!r}")
    return found


def _keep_a_super_user(table: AuthTable, name: str, done: str) -> None:
    if not any(u.super_user for k, u in table.users.items() if k != name):
        raise BadRequestError(
            f"user {name!r} is the last Super user and cannot be {done}: create another one first",
            status=StatusCode.PRECONDITION_FAILED,
        )
