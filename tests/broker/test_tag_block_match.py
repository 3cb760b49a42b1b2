"""TagMessageFilter's block match (comparisons for a few tag codes, np.isin for more) against the
tag filter's own check of each code, differentially."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.broker.message_filters import TagMessageFilter
from siftmq.filter.tags import TagFilter, java_string_hash

TAGS = [f"T{i}" for i in range(12)]


@settings(max_examples=300, deadline=None)
@given(
    chosen=st.lists(st.sampled_from(TAGS), min_size=1, max_size=9, unique=True),
    stored=st.lists(st.sampled_from([*TAGS, None]), max_size=200),
)
def test_a_block_matches_as_each_code_does(chosen: list[str], stored: list[str | None]) -> None:
    tag_filter = TagFilter.parse("||".join(chosen))
    codes = np.array([0 if t is None else java_string_hash(t) for t in stored], dtype=np.int64)
    mask = TagMessageFilter(tag_filter).match_consume_queue_block(codes, None)
    assert mask.dtype == np.bool_ and mask.shape == codes.shape
    assert mask.tolist() == [tag_filter.matches_code(int(c)) for c in codes]
