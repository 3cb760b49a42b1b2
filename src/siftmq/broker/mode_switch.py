"""A group's message model switched: its position goes with it, so nothing is skipped.

A clustering group's progress is the group's (``group``); a broadcasting group's is each client's
(``group@client``). Without a carry, a member's first read after a switch followed the rule for a new
group (from offset 0 while the queue still holds it, else from its end): after retention that
skipped every message the group had not consumed, without it every acknowledged one came again.

* clustering -> broadcasting: the group's progress on each queue becomes a bare position, its
  committed offset (messages in flight are delivered again, to every member), and each member's
  first read of a queue starts there. Per-client progress of an earlier broadcasting time is
  dropped: it is older than what the group consumed since.
* broadcasting -> clustering: the group's position on each queue is the smallest of its members'
  (the safe choice: a member behind the others gets its messages; the others get again what they
  had past it, none is skipped), and the per-client progress is dropped. A queue no member read
  keeps the group's position from before.

The carry runs and is saved before the switch is: a crash between the two leaves the old mode over
the carried positions, which repeats messages at worst. Switches happen only while the group has
no live member (the callers refuse them otherwise), so no read races the carry.
"""

from __future__ import annotations

import logging

from siftmq.broker.client_state import CLIENT_SEPARATOR
from siftmq.broker.consumer_state import ConsumerStateTable
from siftmq.broker.offsets import OffsetTable

_log = logging.getLogger(__name__)


def group_of(progress_group: str) -> str | None:
    """The group of a broadcasting client's progress name (None: the name is a group's own)."""
    group, sep, _ = progress_group.partition(CLIENT_SEPARATOR)
    return group if sep else None


def member_start(
    consumers: ConsumerStateTable, offsets: OffsetTable, group: str, topic: str, qid: int
) -> int | None:
    """Where a broadcasting member new to a queue starts: the group's position there (None: the
    group has none, and the rule for a new group applies)."""
    found = []
    prog = consumers.get((group, topic, qid))
    if prog is not None:
        with prog.lock:
            found.append(prog.committed_offset)
    offset = offsets.get((group, topic, qid))
    if offset is not None:
        found.append(offset)
    return min(found, default=None)


def carry_position(
    consumers: ConsumerStateTable, offsets: OffsetTable, group: str, old: str, new: str
) -> None:
    """Carry ``group``'s position from mode ``old`` to ``new`` and save it (see the module)."""
    if old == new:
        return
    own = f"{group}{CLIENT_SEPARATOR}"
    carried = 0
    if new == "broadcasting":
        for key, prog in consumers.items():
            if key[0] == group:
                with prog.lock:
                    position, held = prog.committed_offset, bool(prog.inflight)
                if held:
                    consumers.reset(key, position)
                carried += 1
        carried += len([key for key, _ in offsets.items() if key[0] == group])
    else:
        lowest: dict[tuple[str, int], int] = {}
        for (name, topic, qid), prog in consumers.items():
            if name.startswith(own):
                with prog.lock:
                    position = prog.committed_offset
                lowest[(topic, qid)] = min(position, lowest.get((topic, qid), position))
        for (topic, qid), position in lowest.items():
            consumers.reset((group, topic, qid), position)
        pulled: dict[tuple[str, int], int] = {}
        for (name, topic, qid), position in offsets.items():
            if name.startswith(own):
                pulled[(topic, qid)] = min(position, pulled.get((topic, qid), position))
        for (topic, qid), position in pulled.items():
            offsets.set((group, topic, qid), position)
        carried = len(lowest) + len(pulled)
    dropped = consumers.remove_where(lambda key: key[0].startswith(own))
    dropped += offsets.remove_where(lambda key: key[0].startswith(own))
    consumers.save()
    offsets.save()
    _log.info(
        "group %s switching from %s to %s: position carried on %d queue(s), %d per-client entries dropped",
        group, old, new, carried, dropped,
    )  # fmt: skip
