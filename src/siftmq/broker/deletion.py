"""Deleting a topic or a consumer group: everything of it goes, and it stays gone after a restart.

A topic: its configuration, its stored messages (the store's tombstone makes every record of it
dead to dispatch, recovery, lookups and the offline jobs; its queues are deleted at once), every
group's progress, in-flight messages, pull offsets, SQL92 registration, filter program and
subscription of it. A topic created later under the name starts empty and unfiltered.

A group: refused while it has live members (they would recreate it at their next call); else its
mode, policy, subscriptions, progress (per client too, for a broadcasting group), in-flight
messages, pull offsets, SQL92 registrations and filter programs. A group created later under the
name starts like a new one: a program left behind would filter it without its owner knowing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from siftmq.broker.client_state import CLIENT_SEPARATOR
from siftmq.broker.validation import check_group
from siftmq.errors import BadRequestError, NotFoundError, StatusCode

if TYPE_CHECKING:
    from siftmq.broker.broker import Broker
    from siftmq.broker.consumer_state import QueueKey, QueueProgress

_log = logging.getLogger(__name__)


def delete_topic(broker: Broker, name: str) -> None:
    """Delete topic ``name`` and everything of it (raises :class:`NotFoundError` if it does not exist)."""
    broker.topics.existing(name)

    def of_topic(key: tuple[str, str, int]) -> bool:
        return key[1] == name

    # The tombstone first: once it is on disk the topic's messages are dead whatever happens after
    # (a send racing the deletion is kept, not acknowledged and then killed). Its groups' progress
    # goes next: should a crash keep it on disk, the broker brings progress past its queue's end
    # back to the end at start (a topic created again must not be read from the old positions).
    queues = broker.store.delete_topic(name)
    progress, offsets = _forget_progress(broker, of_topic)
    broker.topics.delete(name)
    again = _forget_progress(broker, of_topic)  # made by reads that ran meanwhile
    progress, offsets = progress + again[0], offsets + again[1]
    filters = broker.filters.remove_where(lambda reg: reg.topic == name)
    programs = broker.programs.remove_where(lambda program: program.topic == name)
    groups = broker.groups.drop_topic(name)
    _log.info(
        "deleted topic %s: %d queue(s), %d group progress and %d offset entries, %d SQL92 registration(s), "
        "%d filter program(s), subscriptions of %d group(s)",
        name,
        queues,
        progress,
        offsets,
        len(filters),
        len(programs),
        len(groups),
    )


def delete_group(broker: Broker, group: str) -> None:
    """Delete consumer group ``group`` and all its state; refused while it has live members."""
    check_group(group)
    live = broker.clients.live_ids(group)
    if live:
        raise BadRequestError(
            f"group {group!r} has {len(live)} live client(s); stop them before deleting it",
            status=StatusCode.PRECONDITION_FAILED,
        )
    own = f"{group}{CLIENT_SEPARATOR}"

    def of_group(key: tuple[str, str, int]) -> bool:
        return key[0] == group or key[0].startswith(own)

    # Progress first, on disk: kept past a crash, it would be the start of a group created again.
    # A deletion that fails puts it back: a group that stays must not lose its position (a group
    # without one starts at the queue's end once its first message is gone).
    progress = broker.consumers.take_where(of_group)
    offsets = broker.offsets.take_where(of_group)
    try:
        _save(broker, progress, offsets)
        known = broker.groups.delete(group)
        filters = broker.filters.remove_where(lambda reg: reg.group == group)
        programs = broker.programs.remove_where(lambda program: program.group == group)
    except BaseException:
        broker.consumers.put_back(progress)
        broker.offsets.put_back(offsets)
        with contextlib.suppress(OSError):  # else the housekeeping writes it
            _save(broker, progress, offsets)
        raise
    if not (known or progress or offsets or filters or programs):
        raise NotFoundError(
            f"consumer group {group!r} is unknown", status=StatusCode.CONSUMER_GROUP_NOT_FOUND
        )
    _log.info(
        "deleted group %s: %d progress and %d offset entries, %d SQL92 registration(s), %d filter program(s)",
        group,
        len(progress),
        len(offsets),
        len(filters),
        len(programs),
    )


def _forget_progress(broker: Broker, doomed: Callable[[tuple[str, str, int]], bool]) -> tuple[int, int]:
    """Remove the group progress and pull offsets ``doomed`` accepts and write both tables at once
    (the housekeeping would write them up to a second later); how many of each were removed. A
    write that fails is left to the housekeeping (and to the start's check of queue ends)."""
    progress = broker.consumers.take_where(doomed)
    offsets = broker.offsets.take_where(doomed)
    try:
        _save(broker, progress, offsets)
    except OSError as exc:
        _log.warning("the progress a deletion removed is written later: %s", exc)
    return len(progress), len(offsets)


def _save(broker: Broker, progress: dict[QueueKey, QueueProgress], offsets: dict[QueueKey, int]) -> None:
    if progress:
        broker.consumers.save()
    if offsets:
        broker.offsets.save()
