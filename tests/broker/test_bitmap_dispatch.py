"""The bitmap dispatcher sets the same bloom bits whether a batch is evaluated row by row (small
batches) or through pyarrow (large ones): hypothesis, differential across VECTOR_MIN_ROWS."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.broker.filter_registry import VECTOR_MIN_ROWS, FilterRegistry
from siftmq.filter import BloomFilter, compile_filter
from siftmq.store import DispatchRequest

EXPRESSIONS = {
    "g1": "a > 5",
    "g2": "b = 'x' OR a IS NULL",
    "g3": "a BETWEEN 2 AND 8 AND b <> 'y'",
    "g4": "c IN ('p', 'q')",
}
_value = st.one_of(st.none(), st.sampled_from(["0", "3", "7", "12", "x", "y", "p", "q", "1e3", " 4", "-2"]))
_props = st.fixed_dictionaries({}, optional={"a": _value, "b": _value, "c": _value, "TAGS": st.just("T")})


def _requests(rows: list[dict[str, str | None]]) -> list[DispatchRequest]:
    out = []
    for i, row in enumerate(rows):
        props = {k: v for k, v in row.items() if v is not None}
        out.append(DispatchRequest("Topic", 0, i * 100, 100, 0, 1, i, "", None, props))
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> FilterRegistry:
    reg = FilterRegistry(tmp_path_factory.mktemp("filters"), BloomFilter(), expire_s=3600)
    for group, expression in EXPRESSIONS.items():
        reg.register(group, "Topic", compile_filter("SQL92", expression))
    return reg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_props, min_size=1, max_size=40))
def test_small_and_large_batches_set_the_same_bits(
    registry: FilterRegistry, rows: list[dict[str, str | None]]
) -> None:
    requests = _requests(rows)
    small = registry.compute_bitmaps(requests)  # below the threshold: row by row
    repeats = VECTOR_MIN_ROWS // len(requests) + 1
    large = registry.compute_bitmaps(requests * repeats)  # the same rows, vectorized
    assert len(requests) * repeats >= VECTOR_MIN_ROWS
    assert large == small * repeats
    for req, bitmap in zip(requests, small, strict=True):  # and the bits are the filters' verdicts
        assert bitmap is not None
        for group, expression in EXPRESSIONS.items():
            reg = registry.get(group, "Topic")
            assert reg is not None
            hit = all(bitmap[p >> 3] & (1 << (p & 7)) for p in reg.positions)
            if compile_filter("SQL92", expression).matches(req.properties):
                assert hit


@pytest.mark.parametrize("expressions", [("TRUE", "1 = 1", "NOT FALSE", "FALSE"), ("TRUE", "a > 5")])
def test_filters_reading_no_property_get_their_bits_in_large_batches(
    tmp_path_factory: pytest.TempPathFactory, expressions: tuple[str, ...]
) -> None:
    """A registration reading no property met no column in a vectorized batch, so no row: its
    messages got no bit, and the index stage dropped every one of them (200 of 200)."""
    registry = FilterRegistry(tmp_path_factory.mktemp("filters"), BloomFilter(), expire_s=3600)
    for i, expression in enumerate(expressions):
        registry.register(f"c{i}", "Topic", compile_filter("SQL92", expression))
    requests = _requests([{"a": str(i % 10)} for i in range(2 * VECTOR_MIN_ROWS)])
    large = registry.compute_bitmaps(requests)
    assert large == [registry.compute_bitmaps([req])[0] for req in requests]  # as row by row
    for i, expression in enumerate(expressions):
        reg = registry.get(f"c{i}", "Topic")
        assert reg is not None
        for req, bitmap in zip(requests, large, strict=True):
            assert bitmap is not None
            hit = all(bitmap[p >> 3] & (1 << (p & 7)) for p in reg.positions)
            assert hit or not compile_filter("SQL92", expression).matches(req.properties)


def test_a_topics_sql92_registrations_are_bounded(tmp_path: Path) -> None:
    """Every registration is evaluated on each record its topic stores: before, new group names
    without end (2,000 from one anonymous client) made each send 4x slower and filters.json 2.8 MB,
    rewritten whole for each new one."""
    from siftmq.broker.filter_registry import MAX_REGISTRATIONS_PER_TOPIC
    from siftmq.errors import BadRequestError, StatusCode

    registry = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600)
    expression = compile_filter("SQL92", "a > 1")
    for i in range(MAX_REGISTRATIONS_PER_TOPIC):
        registry.register(f"g{i}", "T", expression)
    assert not (tmp_path / "filters.json").exists()  # new ones are written by the sweep or the stop
    with pytest.raises(BadRequestError, match="holds 512 SQL92 filter registrations") as refused:
        registry.register("one-more", "T", expression)
    assert refused.value.status is StatusCode.PRECONDITION_FAILED
    registry.register("g0", "T", compile_filter("SQL92", "a > 2"))  # a group's new version: allowed
    registry.register("other", "U", expression)  # another topic: allowed
    registry.save()
    assert (
        len(FilterRegistry(tmp_path, BloomFilter(), expire_s=3600).all()) == MAX_REGISTRATIONS_PER_TOPIC + 1
    )


def test_a_removal_the_file_did_not_take_is_written_before_the_key_is_registered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal whose write failed (a full disk) left the file holding the old registration, and a
    new one of the key waited for the sweep: killed meanwhile, the old born time came back and records
    dispatched in between, without the group's bits, were trusted to have them."""
    import errno
    import time

    from siftmq.broker import filter_registry as module

    registry = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600)
    expression = compile_filter("SQL92", "a > 1")
    old = registry.register("g", "T", expression)
    registry.save()
    real = module.write_json

    def full(path: Path, data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, "write_json", full)
    with pytest.raises(OSError):
        registry.remove_where(lambda reg: reg.group == "g")
    monkeypatch.setattr(module, "write_json", real)
    time.sleep(0.01)  # records are dispatched meanwhile, without g's bits
    again = registry.register("g", "T", expression)
    assert again.born_time_ms > old.born_time_ms
    reloaded = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600).get("g", "T")  # as after a kill -9
    assert reloaded is not None and reloaded.born_time_ms == again.born_time_ms
