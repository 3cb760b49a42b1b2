"""A queue's due-heap: bounded however many acks go by, and always answering what is due."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.broker import consumer_state
from siftmq.broker.consumer_state import DUE_SLACK, InFlight, QueueProgress


def item(offset: int, visible_at_ms: int, nonce: int) -> InFlight:
    return InFlight(offset, offset * 100, 100, 1, visible_at_ms, nonce)


def test_acks_do_not_grow_the_heap() -> None:
    prog = QueueProgress(pop_offset=0)
    for offset in range(50_000):
        prog.put(item(offset, 10**12 + offset, offset))
        if offset % 100:  # all but every hundredth acknowledged
            del prog.inflight[offset]
        assert list(prog.pop_due(0, 10)) == []  # a receive's pass: nothing due yet
        assert len(prog._due) <= 2 * len(prog.inflight) + DUE_SLACK + 1
    assert len(prog.inflight) == 500
    assert [i.queue_offset for i in prog.pop_due(2 * 10**12, 10**6)] == list(range(0, 50_000, 100))


_OPS = st.lists(
    st.tuples(st.sampled_from(["put", "ack", "rearm"]), st.integers(0, 20), st.integers(0, 50)), max_size=80
)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS, now=st.integers(0, 50))
def test_due_messages_match_a_model(ops: list[tuple[str, int, int]], now: int) -> None:
    """Differential against a plain dict: with the heap rebuilt at every chance (no slack), what
    is due and when the next comes due are what the in-flight messages say."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(consumer_state, "DUE_SLACK", 0)
        prog = QueueProgress(pop_offset=0)
        model: dict[int, tuple[int, int]] = {}  # offset -> (visible at, nonce)
        for n, (op, offset, at) in enumerate(ops):
            if op == "ack":
                prog.inflight.pop(offset, None)
                model.pop(offset, None)
            elif op == "put" or offset in model:  # a re-arm is a put with a new nonce
                prog.put(item(offset, at, n))
                model[offset] = (at, n)
        assert prog.next_due_ms() == min((at for at, _ in model.values()), default=None)
        due = [(i.visible_at_ms, i.queue_offset) for i in prog.pop_due(now, 10**6)]
        assert due == sorted((at, offset) for offset, (at, _) in model.items() if at <= now)


def test_what_a_pass_took_never_comes_back_twice() -> None:
    """A pass takes due messages, delivers others (puts) and puts back what it could not handle:
    each comes due once, however small the slack (a rebuild in put brought back what was taken)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(consumer_state, "DUE_SLACK", 0)
        prog = QueueProgress(pop_offset=0)
        for offset in range(3):
            prog.put(item(offset, 0, 1))
        taken = list(prog.pop_due(10, 10))
        assert [i.queue_offset for i in taken] == [0, 1, 2]
        prog.put(item(0, 5_000, 2))  # the first delivered again, with a new nonce
        for offset in range(10, 20):
            prog.put(item(offset, 5_000, 1))  # new messages delivered in the same pass
        prog.put(taken[1])  # the rest could not be read: put back, due again
        prog.put(taken[2])
        assert [i.queue_offset for i in prog.pop_due(10, 100)] == [1, 2]
