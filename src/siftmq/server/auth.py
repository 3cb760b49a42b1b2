"""Authentication and authorization at the gRPC edge: every call signed, every action allowed.

With ``authentication_enabled`` each call's ``authorization`` and ``x-mq-date-time`` metadata must
be a valid MQv2-HMAC-SHA1 signature of a known user (:mod:`siftmq.auth.signature`); a Telemetry
stream is checked once, when it opens (its timestamp then ages, as the clients expect). A failure
answers ``UNAUTHORIZED`` (40100) and nothing of the request is acted on. With
``authorization_enabled`` the request's resources are then checked against the user's policies
(:mod:`siftmq.auth.acl`) using :data:`ACTIONS`, the one table of what each RPC needs; a denial
answers ``FORBIDDEN`` (40300) naming the resource and the action.
"""

from __future__ import annotations

import collections
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from siftmq.auth.acl import Action, AuthTable, User, dump_auth_file, parse_auth_file
from siftmq.auth.signature import SignatureError, Verifier, peer_address, signature_headers
from siftmq.durable import write_atomically
from siftmq.errors import BadRequestError, ConfigError, StatusCode, UnsupportedError
from siftmq.protocol.service import Rpc
from siftmq.server.convert import client_id_of, topic_name
from siftmq.server.status import status

_log = logging.getLogger(__name__)

#: One audit line per this many seconds at most (the rest are counted into the next line).
AUDIT_INTERVAL_S: Final = 10.0
AUDIT_FIELD: Final = 512  # characters of one text an audit line shows at most
#: Generations of the users table count 1 to this and round again (a frame holds 32 bits).
MAX_GENERATION: Final = 2**32 - 1
CACHE_SIZE: Final = 4096  # remembered decisions (cleared when full)
#: Calls that act on the calling client's session by its id (their own, or its owner's, only).
SESSION_CALLS: Final = frozenset({"Telemetry", "Heartbeat", "NotifyClientTermination"})
MAX_OWNED_CLIENTS: Final = 65_536

Need = tuple[tuple[str, Action], ...]
"""Resource/action pairs a request needs, all of them."""


def _topic(resource: Any) -> str:
    # the name the broker acts on: a namespace is part of it (namespace%name), as RocketMQ wraps it
    return f"Topic:{topic_name(resource)}"


def _group(resource: Any) -> str:
    return f"Group:{topic_name(resource)}"


def _sub(request: Any, topic: Any) -> Need:
    return ((_topic(topic), Action.SUB), (_group(request.group), Action.SUB))


def _heartbeat(request: Any) -> Need:
    return ((_group(request.group), Action.SUB),) if request.group.name else ()


def _ack_and_receive(request: Any) -> Need:
    """What AckMessage and ReceiveMessages need (an ack without entries names nothing)."""
    receive = _sub(request.receive, request.receive.message_queue.topic)
    if not request.ack.entries:
        return receive
    return tuple(dict.fromkeys(_sub(request.ack, request.ack.topic) + receive))


def _telemetry(command: Any) -> Need:
    """A Telemetry stream's settings: a producer's topics need Pub, a consumer's group and topics
    Sub (as RocketMQ 5.3 checks them); its other commands need nothing."""
    if command.WhichOneof("command") != "settings":
        return ()
    settings = command.settings
    which = settings.WhichOneof("pub_sub")
    if which == "publishing":
        return tuple((_topic(t), Action.PUB) for t in settings.publishing.topics)
    if which == "subscription":
        sub = settings.subscription
        topics = tuple((_topic(e.topic), Action.SUB) for e in sub.subscriptions)
        return (((_group(sub.group), Action.SUB),) if sub.group.name else ()) + topics
    return ()


#: What each RPC needs (``None``: any of Pub, Sub or Get on the topic, for a route lookup).
ACTIONS: Final[dict[str, Callable[[Any], Need] | None]] = {
    "QueryRoute": None,
    "SendMessage": lambda r: tuple({(_topic(m.topic), Action.PUB) for m in r.messages}),
    "SendMessages": lambda r: ((_topic(r.topic), Action.PUB),),
    "ReceiveMessage": lambda r: _sub(r, r.message_queue.topic),
    "ReceiveMessages": lambda r: _sub(r, r.message_queue.topic),
    "AckAndReceive": _ack_and_receive,
    "PullMessage": lambda r: _sub(r, r.message_queue.topic),
    "PullMessages": lambda r: _sub(r, r.message_queue.topic),
    "AckMessage": lambda r: _sub(r, r.topic),
    "ChangeInvisibleDuration": lambda r: _sub(r, r.topic),
    "ForwardMessageToDeadLetterQueue": lambda r: _sub(r, r.topic),
    "QueryAssignment": lambda r: _sub(r, r.topic),
    "UpdateOffset": lambda r: _sub(r, r.message_queue.topic),
    "UpdateOffsets": lambda r: _sub(r, r.topic),
    "GetOffset": lambda r: _sub(r, r.message_queue.topic),
    "QueryOffset": lambda r: ((_topic(r.message_queue.topic), Action.SUB),),  # names no group
    "Heartbeat": _heartbeat,
    "NotifyClientTermination": _heartbeat,
    "Telemetry": _telemetry,  # per command of the stream
}
_ROUTE_ACTIONS: Final = (Action.PUB, Action.SUB, Action.GET)
#: The calls that create a topic they name when it does not exist (``auto_create_topics``): they
#: also need Create on it (a dead-letter topic too: a route lookup would create one).
CREATES: Final = frozenset({
    "QueryRoute", "SendMessage", "SendMessages", "ReceiveMessage", "ReceiveMessages", "PullMessage",
    "PullMessages", "QueryAssignment", "UpdateOffset", "UpdateOffsets", "GetOffset", "QueryOffset",
    "AckAndReceive",
})  # fmt: skip


@dataclass
class Gate:
    """The users and policies in force, and the settings of the checks."""

    table: AuthTable
    authenticate: bool
    authorize: bool
    skew_s: float
    #: authentication failures by reason, and denials by action (for the metrics)
    failures: Counter[str] = field(default_factory=Counter)
    denials: Counter[str] = field(default_factory=Counter)
    # per kind of audit line (failure, denial): when it was last written, and how many since
    _audited: dict[str, tuple[float, int]] = field(default_factory=dict)
    _decided: dict[tuple[str, str, Action, str | None], bool] = field(default_factory=dict)

    path: Path | None = None
    #: the auth file as it was when the table in force was read from or written to it
    _loaded_mtime: tuple[int, int, int] = (0, 0, 0)
    #: the auth file as it was when it last failed to load, and why ("" once one loads)
    _failed_mtime: tuple[int, int, int] | None = None
    load_error: str = ""
    #: with topic auto-creation on: whether a topic does not exist yet (calling on it creates it)
    missing_topic: Callable[[str], bool] | None = None
    #: which users table is in force (each one put in force counts one up): a front-end names the
    #: one it checked a signature against, and a claim made against an older one is checked again
    generation: int = 0
    #: called (on the event loop) after each new table is put in force: the front-ends hear of it
    on_change: list[Callable[[], None]] = field(default_factory=list)
    #: with front-ends: until every one of them checks signatures against the table in force
    delivered: Callable[[], Awaitable[None]] | None = None
    #: accept dates stamped in the broker's local time as well as UTC (see signature.verify)
    local_time: bool = False
    verifier: Verifier = field(init=False, repr=False)
    #: the secrets the last change of the users replaced (see signature.STALE_S); never logged
    stale: dict[str, str] = field(init=False, repr=False)
    #: client id -> the user who first used it (see session_refusal), oldest first
    _owners: collections.OrderedDict[str, str] = field(default_factory=collections.OrderedDict)

    def __post_init__(self) -> None:
        self._install(self.table)

    @classmethod
    def load(
        cls, path: Path, *, authenticate: bool, authorize: bool, skew_s: float, local_time: bool = False
    ) -> Gate:
        """Read ``path`` (refuses a missing or malformed file with what is wrong)."""
        gate = cls(_read_table(path), authenticate, authorize, skew_s, path=path, local_time=local_time)
        gate._loaded_mtime = _mtime(path)
        return gate

    def reload(self, *, if_changed: bool = False) -> bool:
        """Read the auth file again; a file that cannot be read or parsed keeps the policy in force
        (logged with what is wrong). True when a new policy took effect."""
        if self.path is None:
            return False
        mtime = _mtime(self.path)
        if if_changed and mtime in (self._loaded_mtime, self._failed_mtime):
            return False  # unchanged, or the same broken file: logged once
        try:
            table = _read_table(self.path)
        except ConfigError as exc:
            # the file's mtime is not taken as loaded: the admin API would take the broken file for
            # one it may write over, and the operator's edit would be lost (see change)
            self._failed_mtime, self.load_error = mtime, exc.message
            _log.error(
                "the auth file was not reloaded; the previous users and policies stay: %s", exc.message
            )
            return False
        self._loaded_mtime, self._failed_mtime, self.load_error = mtime, None, ""
        self._install(table)
        _log.info("auth file %s reloaded: %d user(s)", self.path, len(table.users))
        return True

    def change(self, table: AuthTable) -> None:
        """Put ``table`` in force, written to the auth file first (atomically, mode 0600): a change
        the admin API made survives a restart, and a failed write changes nothing."""
        if self.path is None:
            raise UnsupportedError("this broker has no auth file to keep users in")
        if _mtime(self.path) != self._loaded_mtime:  # edited by hand since it was read
            if not self.reload():  # a hand edit that does not load: never written over
                raise BadRequestError(
                    f"the auth file {self.path} on disk does not load ({self.load_error}); the change "
                    "was not made: fix the file (or restore it) and repeat, the broker reads it again",
                    status=StatusCode.PRECONDITION_FAILED,
                )
            raise BadRequestError(
                "the auth file changed on disk and was read again; repeat the change against it",
                status=StatusCode.PRECONDITION_FAILED,
            )
        write_auth_file(self.path, table)
        self._loaded_mtime = _mtime(self.path)
        self._install(table)

    def _install(self, table: AuthTable) -> None:
        # the secrets this change replaces: a client still signing with one is not guessing
        self.stale = {
            name: user.secret
            for name, user in self.table.users.items()
            if (now := table.users.get(name)) is None or now.secret != user.secret
        }
        self.table = table
        self.verifier = Verifier(self.secrets(), self.skew_s, local_time=self.local_time, stale=self.stale)
        self._decided.clear()
        self.generation = self.generation % MAX_GENERATION + 1
        for listener in list(self.on_change):
            listener()

    async def change_everywhere(self, table: AuthTable) -> None:
        """:meth:`change`, returning once the front-ends have the new users too: the next call,
        whichever process it reaches, meets the change (a new password works, an old one fails).
        A front-end that has not confirmed it within ``USERS_DELIVERY_S`` is logged and not waited
        for (the core still refuses an old password it passes on)."""
        self.change(table)
        if self.delivered is not None:
            await self.delivered()

    def secrets(self) -> dict[str, str]:
        """Each user's secret key: what checking a signature needs."""
        return {name: user.secret for name, user in self.table.users.items()}

    def who(self, context: Any) -> User:
        """The user who signed the call; raises :class:`SignatureError`.

        A call a front-end passed on names who signed it, checked there against the users of a
        generation: taken when that is the table in force, checked again here otherwise.
        """
        claim = getattr(context, "signed_by", None)
        if claim is not None and claim[1] == self.generation:
            user = self.table.users.get(claim[0])
            if user is not None:
                return user
        name = self.verifier.who(*signature_headers(context.invocation_metadata()), _peer_ip(context))
        return self.table.users[name]

    def allowed(self, user: User, resource: str, action: Action, peer: str | None) -> bool:
        """:meth:`AuthTable.decide`, remembered until the table is reloaded.

        No lock: the checks and the reloads all run on the event loop, and neither awaits.
        """
        key = (user.name, resource, action, peer)
        found = self._decided.get(key)
        if found is None:
            found = self.table.decide(user, resource, action, peer)
            if len(self._decided) >= CACHE_SIZE:
                self._decided.clear()
            self._decided[key] = found
        return found

    def refusal(self, rpc: str, request: Any, context: Any) -> Any:
        """The status to answer with, or None when the call may go on."""
        user, refused = self.authenticated(rpc, context)
        if refused is not None or user is None:
            return refused
        if rpc in SESSION_CALLS:
            refused = self.session_refusal(user, rpc, context)
            if refused is not None:
                return refused
        if not self.authorize:
            return None
        return self.authorized(user, rpc, request, context)

    def session_refusal(self, user: User, rpc: str, context: Any) -> Any:
        """A client id belongs to the user who first used it (its Telemetry stream, or a heartbeat):
        another user's call on it — which could end or take over that client's session, and needs
        no right on any resource — is refused."""
        client = client_id_of(context)  # as the broker keys the session (cut at 256 characters)
        if not client:
            return None
        owner = self._owners.get(client)
        if owner is None:
            if len(self._owners) >= MAX_OWNED_CLIENTS:
                self._owners.popitem(last=False)  # the oldest claim goes
            self._owners[client] = user.name
            return None
        self._owners.move_to_end(client)
        if owner == user.name:
            return None
        self.denials["session"] += 1
        line = "denied %s: user %s may not act as client %s of another user (from %s)"
        self.audit("denial", line, rpc, user.name, _client(context), _peer(context))
        return status(StatusCode.FORBIDDEN, f"{rpc}: the client id belongs to another user")

    def authenticated(self, rpc: str, context: Any) -> tuple[User | None, Any]:
        """Who signed the call (None with authentication off), or the UNAUTHORIZED status."""
        if not self.authenticate:
            return None, None
        try:
            return self.who(context), None
        except SignatureError as exc:
            self.failed(rpc, _peer(context), _client(context), exc.reason, str(exc))
            return None, status(StatusCode.UNAUTHORIZED, f"{rpc}: {exc}")

    def failed(self, rpc: str, peer: str, client: str, reason: str, message: str, *, count: int = 1) -> None:
        """Count and audit ``count`` calls refused unauthenticated alike (here, or by a front-end)."""
        self.failures[reason] += count
        line = "authentication failed for %s from %s (client %s): %s"
        self.audit("failure", line, rpc, peer, client, message, count=count)

    def authorized(self, user: User, rpc: str, request: Any, context: Any) -> Any:
        """The FORBIDDEN status when ``user`` may not make ``request`` (a Telemetry stream's command
        is checked one by one), else None. A topic the call would auto-create also needs Create."""
        peer = _peer_ip(context)
        need = ACTIONS.get(rpc, ())
        if need is None:  # a route lookup: any of Pub, Sub, Get on the topic
            resource = _topic(request.topic)
            if not any(self.allowed(user, resource, a, peer) for a in _ROUTE_ACTIONS):
                return self._deny(user, rpc, resource, Action.GET, context)
            pairs: Need = ((resource, Action.GET),)
        else:
            pairs = need(request) if need else ()
            for resource, action in pairs:
                if not self.allowed(user, resource, action, peer):
                    return self._deny(user, rpc, resource, action, context)
        if self.missing_topic is not None and rpc in CREATES:
            for resource, _ in pairs:
                if (
                    resource.startswith("Topic:")
                    and self.missing_topic(resource[6:])
                    and not self.allowed(user, resource, Action.CREATE, peer)
                ):
                    return self._deny(user, rpc, resource, Action.CREATE, context)
        return None

    def _deny(self, user: User, rpc: str, resource: str, action: Action, context: Any) -> Any:
        self.denials[action.value] += 1
        line = "denied %s: user %s may not %s %s (from %s, client %s)"
        self.audit("denial", line, rpc, user.name, action, resource, _peer(context), _client(context))
        return status(StatusCode.FORBIDDEN, f"{rpc}: user {user.name} may not {action} {resource}")

    def audit(self, kind: str, message: str, *args: object, count: int = 1) -> None:
        """Log an audit line of ``kind`` (for ``count`` events alike), at most one per
        :data:`AUDIT_INTERVAL_S` (the lines held back are counted into the next one)."""
        now = time.monotonic()
        at, unwritten = self._audited.get(kind, (-AUDIT_INTERVAL_S, 0))
        if now - at < AUDIT_INTERVAL_S:
            self._audited[kind] = (at, unwritten + count)
            return
        more = unwritten + count - 1  # held back since the last line, and this line's alike
        self._audited[kind] = (now, 0)
        # every text filled in may come from a client (a topic, a path, a name): none may break the line
        shown = [printable(a, AUDIT_FIELD) if isinstance(a, str) else a for a in args]
        _log.warning(message + (f" (+{more} more since the last line)" if more else ""), *shown)


def _read_table(path: Path) -> AuthTable:
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the auth file {path}: {exc.strerror}") from exc
    if mode & 0o077:
        _log.warning("the auth file %s holds passwords and can be read by other users: chmod 600 it", path)
    return parse_auth_file(text, source=str(path))


def write_auth_file(path: Path, table: AuthTable) -> None:
    """Replace the auth file with ``table``, atomically and readable by its owner only."""
    try:
        write_atomically(path, dump_auth_file(table).encode(), mode=0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write the auth file {path}: {exc.strerror}") from exc


def _mtime(path: Path) -> tuple[int, int, int]:
    """What tells a changed auth file (nanosecond mtime, inode and size: one coarse tick is not enough)."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_ino, st.st_size)


def _peer(context: Any) -> str:
    return str(context.peer() or "")


def printable(text: str, limit: int = 128) -> str:
    """``text`` for the audit log: its first ``limit`` characters, each one not printable as ``?``
    (a line break in a client's text would forge lines of the log); ``-`` when empty."""
    text = text[:limit]
    return "".join(c if c.isprintable() else "?" for c in text) if text else "-"


def _client(context: Any) -> str:
    """The client id the call names (for the audit log; ``-`` when it names none)."""
    return printable(client_id_of(context))


def _peer_ip(context: Any) -> str:
    return peer_address(_peer(context))


def guard(behaviour: Any, rpc: Rpc, gate: Gate) -> Any:
    """``behaviour`` behind the gate: a refused call gets ``rpc``'s answer carrying the status."""

    if rpc.shape == "unary_unary":

        async def unary(request: Any, context: Any) -> Any:
            refused = gate.refusal(rpc.name, request, context)
            if refused is not None:
                return rpc.status_answer(refused)
            return await behaviour(request, context)

        return unary
    if rpc.shape == "unary_stream":

        async def server_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            refused = gate.refusal(rpc.name, request, context)
            if refused is not None:
                yield rpc.status_answer(refused)
                return
            async for item in behaviour(request, context):
                yield item

        return server_stream

    async def bidi(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        user, refused = gate.authenticated(rpc.name, context)  # once, when it opens
        if refused is None and user is not None:
            refused = gate.session_refusal(user, rpc.name, context)
        if refused is not None:
            yield rpc.status_answer(refused)
            return
        if user is None:
            async for item in behaviour(requests, context):
                yield item
            return
        denied: list[Any] = []

        async def checked() -> AsyncIterator[Any]:
            # each command as the user who opened the stream is now (deleted, or a changed
            # password, ends it — with authorization off too), on the command's resources; a
            # denial ends the stream
            async for command in requests:
                current = gate.table.users.get(user.name)
                if current is None or current.secret != user.secret:
                    denied.append(
                        status(StatusCode.UNAUTHORIZED, f"{rpc.name}: the credential is no longer valid")
                    )
                    return
                refused = gate.authorized(current, rpc.name, command, context) if gate.authorize else None
                if refused is not None:
                    denied.append(refused)
                    return
                yield command

        async for item in behaviour(checked(), context):
            yield item
        if denied:
            yield rpc.status_answer(denied[0])

    return bidi


def auth_file(config_dir: Path, name: str) -> Path:
    """The auth file: ``name`` as given when absolute, else in the data dir's ``config/``."""
    path = Path(name)
    return path if path.is_absolute() else config_dir / path
