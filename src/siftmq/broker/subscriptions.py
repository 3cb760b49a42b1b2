"""Subscriptions: a client's TAG or SQL92 subscription resolved against its group's (strict or compat
consistency), compiled, registered for bitmaps, and turned into the store's MessageFilter."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, overload

from siftmq.broker.client_state import client_progress_group
from siftmq.broker.clients import ClientSession
from siftmq.broker.groups import GroupSubscription, SubscriptionConflictError
from siftmq.broker.message_filters import TagMessageFilter
from siftmq.broker.mode_switch import carry_position, group_of, member_start
from siftmq.broker.model import (
    Subscription,
)
from siftmq.broker.program_reads import ProgramReads
from siftmq.broker.validation import (
    check_group,
    check_topic,
)
from siftmq.errors import (
    BadRequestError,
    FilterError,
    StatusCode,
    UnsupportedError,
)
from siftmq.filter import CompiledFilter, compile_filter
from siftmq.store import (
    MessageFilter,
)

_log = logging.getLogger(__name__)

#: Subscriptions one client may declare.
MAX_SUBSCRIPTIONS: Final = 1024
FILTER_KINDS: Final = {"TAG": "TAG", "SQL": "SQL92", "SQL92": "SQL92"}
#: What serves a client's request (:meth:`Subscribing._resolve`): the group's store filter, and the
#: client's own filter when that differs (compat groups).
Resolved = tuple[MessageFilter | None, CompiledFilter | None]


class Subscribing(ProgramReads):
    """Subscription handling of :class:`~siftmq.broker.broker.Broker`."""

    def message_filter(self, group: str, subscription: Subscription) -> MessageFilter | None:
        """The store-level filter for ``group``'s subscription (None for TAG ``*``).

        SQL92 subscriptions register the expression with the bitmap dispatcher (bloom key
        ``group#topic``). Raises :class:`FilterError` for an invalid expression and
        :class:`UnsupportedError` for SQL92 when property filtering is turned off.
        """
        compiled = self._compile(subscription)
        kind = compiled.kind
        if kind == "TAG":
            assert compiled.tag_filter is not None
            if compiled.tag_filter.sub_all:
                return None
            return TagMessageFilter(compiled.tag_filter, self.stats.filter(group, subscription.topic))
        registration = self.filters.register(group, subscription.topic, compiled)
        return registration.message_filter(self.stats.filter(group, subscription.topic))

    def _compile(self, subscription: Subscription) -> CompiledFilter:
        kind = FILTER_KINDS.get(subscription.kind.upper())
        if kind is None:
            raise BadRequestError(
                f"unknown filter type {subscription.kind!r}; use TAG or SQL92",
                status=StatusCode.ILLEGAL_FILTER_EXPRESSION,
            )
        if kind == "SQL92" and not self.config.enable_property_filter:
            raise UnsupportedError(
                "SQL92 filtering is turned off on this broker (enable_property_filter = false); "
                "subscribe with a TAG expression or turn it on"
            )
        return compile_filter(kind, subscription.expression)

    def subscribe(
        self,
        client_id: str,
        client_type: str,
        group: str | None,
        subscriptions: Sequence[Subscription],
        *,
        address: str = "",
        message_model: str | None = None,
    ) -> None:
        """Record a client's declared settings (Telemetry).

        Consumers' subscriptions are validated, checked against the group's (consistency policy) and
        recorded; SQL92 ones are registered with the bitmap dispatcher at once. A declared
        ``message_model`` (``clustering``/``broadcasting``) must agree with the group's live members.
        """
        if group is None:
            self.clients.touch(client_id, client_type=client_type, address=address)
            return
        check_group(group)
        compiled: list[tuple[Subscription, CompiledFilter]] = []
        errors: list[tuple[str, Exception]] = []
        if len(subscriptions) > MAX_SUBSCRIPTIONS:
            raise BadRequestError(f"{len(subscriptions)} subscriptions exceed the limit {MAX_SUBSCRIPTIONS}")
        for sub in subscriptions:
            try:
                check_topic(sub.topic)
                compiled.append((sub, self._compile(sub)))
            except (FilterError, BadRequestError, UnsupportedError) as exc:
                errors.append((f"{sub.topic}: {exc}", exc))
        if errors:
            first = errors[0][1]
            text = "; ".join(msg for msg, _ in errors)
            if isinstance(first, UnsupportedError):
                raise UnsupportedError(text)
            raise BadRequestError(
                text,
                status=first.status
                if isinstance(first, BadRequestError)
                else StatusCode.ILLEGAL_FILTER_EXPRESSION,
            )
        # check before recording: a refused client must not become the holder of anything
        session = self.clients.touch(client_id, client_type=client_type, group=group, address=address)
        session.declared = (group, frozenset(sub.topic for sub, _ in compiled))
        try:
            if message_model is not None:
                self.groups.declare_mode(
                    group,
                    message_model,
                    client_id,
                    live=self.clients.live_ids(group),
                    on_switch=self.carry_position,
                )
            self._check_members(group, session)
        except SubscriptionConflictError as exc:
            self._mark_refused(client_id, exc.message)
            raise
        live = self.clients.live_ids(group)
        try:
            for sub, cf in compiled:
                entry = self.groups.claim(
                    group,
                    client_id,
                    sub.topic,
                    kind=cf.kind,
                    expression=cf.normalized,
                    live=live,
                    from_settings=True,
                )
                self._entry_filter(group, entry)
        except SubscriptionConflictError as exc:
            self.groups.release(group, client_id)
            self._mark_refused(client_id, exc.message)
            raise
        self._mark_refused(client_id, None)
        self.clients.touch(client_id, subscriptions=list(subscriptions))

    def _check_members(self, group: str, session: ClientSession) -> None:
        """The strict group's rules between members: the same set of topics, the same way of
        consuming (raises :class:`SubscriptionConflictError`)."""
        assert session.declared is not None
        members = self.clients.members(group)
        client_id = session.client_id
        topics = {m.client_id: set(m.subscriptions) for m in members}
        self.groups.check_topics(group, client_id, set(session.declared[1]), topics)
        kinds = {m.client_id: m.client_type for m in members if not m.refused}
        self.groups.check_kinds(group, client_id, session.client_type, kinds)

    def _mark_refused(self, client_id: str, why: str | None) -> None:
        session = self.clients.get(client_id)
        if session is not None:
            session.refused = why

    def _entry_filter(self, group: str, entry: GroupSubscription) -> MessageFilter | None:
        return self.message_filter(group, Subscription(entry.topic, entry.kind, entry.expression))

    @overload
    def _resolve(self, group: str, client_id: str, subscription: Subscription) -> Resolved: ...
    @overload
    def _resolve(
        self, group: str, client_id: str, subscription: Subscription, *, held_only: bool
    ) -> Resolved | None: ...

    def _resolve(
        self, group: str, client_id: str, subscription: Subscription, *, held_only: bool = False
    ) -> Resolved | None:
        """The store filter serving ``client_id``'s request, and its own filter when that differs.

        A strict group refuses a request whose filter differs from the group's; a compat group serves
        it with the group's subscription and drops what the client's own filter rejects (RocketMQ's
        client-side tag check), which is how seed 004 loses messages. ``held_only``: None, having
        recorded nothing (so written no file: what an event loop may call), unless the group holds
        this very subscription already; never None without it.
        """
        compiled = self._compile(subscription)
        session = self.clients.touch(client_id, group=group)
        if session.refused is not None and session.declared is not None and session.declared[0] == group:
            # refused on its settings: its requests are refused as long as the group would refuse those
            try:
                self._check_members(group, session)
            except SubscriptionConflictError as exc:
                session.refused = exc.message
                raise
        asked: dict[str, Any] = {
            "kind": compiled.kind,
            "expression": compiled.normalized,
            "live": self.clients.live_ids(group),
        }
        entry = (
            self.groups.claim_held(group, client_id, subscription.topic, **asked)
            if held_only
            else self.groups.claim(group, client_id, subscription.topic, from_settings=False, **asked)
        )
        if entry is None:
            return None
        if (entry.kind, entry.expression) == (compiled.kind, compiled.normalized):
            self._mark_refused(client_id, None)  # the group accepts it now
            return self._entry_filter(group, entry), None
        return self._entry_filter(group, entry), compiled

    def progress_group(self, group: str, client_id: str) -> str:
        """Whose progress a client uses: the group's (clustering) or its own (broadcasting)."""
        return client_progress_group(group, client_id) if self.groups.mode(group) == "broadcasting" else group

    def carry_position(self, group: str, old: str, new: str) -> None:
        """A group's switch of message model takes its position along (:mod:`~siftmq.broker.mode_switch`)."""
        carry_position(self.consumers, self.offsets, group, old, new)

    def member_start(self, progress_group: str, topic: str, qid: int) -> int | None:
        """Where a broadcasting member's first read of a queue starts: its group's position (None: a
        group's own progress, or a group without a position there)."""
        group = group_of(progress_group)
        return None if group is None else member_start(self.consumers, self.offsets, group, topic, qid)
