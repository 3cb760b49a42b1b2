"""The client registry's answers by group agree with a plain pass over every session, whatever
sequence of touches, group changes, removals, expiries and time passing came before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.broker import clients as clients_module
from siftmq.broker.clients import ClientRegistry
from siftmq.testing import SteppedClock

GROUPS = ["g1", "g2", "g3"]
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("touch"), st.integers(0, 7), st.sampled_from([None, *GROUPS])),
        st.tuples(st.just("remove"), st.integers(0, 7), st.none()),
        st.tuples(st.just("expire"), st.just(0), st.none()),
        st.tuples(st.just("wait"), st.integers(1, 40), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_members_by_group_agree_with_every_session(ops: list[tuple[str, int, str | None]]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        clock = SteppedClock()
        patch.setattr(clients_module, "time", clock)
        registry = ClientRegistry(expire_s=60)
        for op, n, group in ops:
            if op == "touch":
                registry.touch(f"c{n}", group=group)
            elif op == "remove":
                registry.remove(f"c{n}")
            elif op == "expire":
                gone = registry.expire()
                assert all(registry.get(s.client_id) is None for s in gone)
            else:
                clock.advance(n)
            everyone = registry.sessions()
            cutoff = clock.monotonic() - 60
            for g in GROUPS:
                live = sorted(
                    (s for s in everyone if s.group == g and s.last_seen >= cutoff), key=lambda s: s.client_id
                )
                assert registry.members(g) == live
                assert registry.live_ids(g) == {s.client_id for s in live}
            assert registry.live_groups() == {s.group for s in everyone if s.group}
