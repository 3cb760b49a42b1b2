"""TAG subscriptions, Java string hashes and the bloom filter."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from siftmq.filter import BloomFilter, FilterSyntaxError, TagFilter, compile_filter, java_string_hash


def _reference_hash(s: str) -> int:
    # Java String.hashCode written from its definition: s[0]*31^(n-1) + ... over UTF-16 units
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = h * 31 + int.from_bytes(units[i : i + 2], "big")
    h %= 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", 0),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -2147483648),
        ("TagA", 2598919),
        ("😀", 1772899),
    ],
)
def test_java_string_hash(text: str, code: int) -> None:
    assert java_string_hash(text) == code


@given(st.text())
def test_java_string_hash_matches_definition(text: str) -> None:
    assert java_string_hash(text) == _reference_hash(text)


@pytest.mark.parametrize(
    ("text", "sub_all", "tags"),
    [
        (None, True, set()),
        ("", True, set()),
        ("*", True, set()),
        ("  *  ", False, {"*"}),
        ("*||TagA", False, {"*", "TagA"}),
        ("TagA||TagB", False, {"TagA", "TagB"}),
        (" TagA || TagB ", False, {"TagA", "TagB"}),
        ("TagA|||TagB", False, {"TagA", "|TagB"}),
        ("TagA | TagB", False, {"TagA | TagB"}),
        (" ", False, set()),
        ("|| ||", False, set()),
        ("\t", False, set()),
        ("TagA||", False, {"TagA"}),
        ("||TagA", False, {"TagA"}),
        ("\u3000TagA\u00a0", False, {"\u3000TagA\u00a0"}),
    ],
)
def test_tag_parsing(text: str | None, sub_all: bool, tags: set[str]) -> None:
    f = TagFilter.parse(text)
    assert f.sub_all is sub_all
    assert f.tags == tags
    assert f.codes == {java_string_hash(t) for t in tags}


@pytest.mark.parametrize("text", ["||", "||||"])
def test_tag_split_error(text: str) -> None:
    with pytest.raises(FilterSyntaxError, match="split"):
        TagFilter.parse(text)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [("b||a", "a||b"), ("  *  ", "*||"), (" ", " "), ("|| ||", " "), ("a| || b", "a| || b"), ("*", "*")],
)
def test_the_normalized_text_reads_back_as_the_same_tags(text: str, normalized: str) -> None:
    """The group keeps the normalized text and reads filter with what it parses to: "  *  " (the
    tag "*") became "*" (every message), " " (no tag) became "" (every message), and "a| || b"
    became "a|||b", read as "a" and "|b" (messages tagged b lost)."""
    assert TagFilter.parse(text).normalized() == normalized


@given(st.text(alphabet="ab|* \t", max_size=12))
def test_normalized_round_trips(text: str) -> None:
    try:
        parsed = TagFilter.parse(text)
    except FilterSyntaxError:
        return
    again = TagFilter.parse(parsed.normalized())
    assert (again.sub_all, again.tags) == (parsed.sub_all, parsed.tags)


def test_collision_passes_the_index_but_not_the_exact_check() -> None:
    f = TagFilter.parse("Aa||BB")
    assert len(f.codes) == 1
    only_aa = TagFilter.parse("Aa")
    assert only_aa.matches_code(java_string_hash("BB"))  # the index cannot tell them apart
    assert not only_aa.matches_tag("BB")
    assert only_aa.matches_tag("Aa")
    assert not only_aa.matches_tag(None)
    assert TagFilter.parse("*").matches_tag(None)
    # a consume queue stores the code widened to a long
    assert only_aa.matches_code(2112)
    assert TagFilter.parse("polygenelubricants").matches_code(-2147483648)


def test_tag_compiled_filter_scalar_and_batch() -> None:
    f = compile_filter("TAG", "Pay || Order")
    rows = [{"TAGS": "Pay"}, {"TAGS": "Order"}, {"TAGS": "Logistics"}, {}, {"TAGS": "pay"}]
    assert [f.matches(r) for r in rows] == [True, True, False, False, False]
    batch = {"TAGS": [r.get("TAGS") for r in rows]}
    assert list(f.matches_batch(batch)) == [True, True, False, False, False]
    everything = compile_filter("TAG", "*")
    assert list(everything.matches_batch(pa.table({"x": ["1", "2"]}))) == [True, True]
    assert compile_filter("TAG", None).matches({})


@pytest.mark.parametrize(
    ("f", "n", "k", "m"),
    [(10, 32, 4, 160), (20, 32, 3, 112), (20, 64, 3, 216), (5, 128, 5, 800), (1, 16, 7, 160), (50, 8, 1, 16)],
)
def test_bloom_sizing(f: int, n: int, k: int, m: int) -> None:
    bloom = BloomFilter(f, n)
    assert (bloom.k, bloom.m) == (k, m)
    assert len(bloom.bitmap([])) == m // 8


@pytest.mark.parametrize(("f", "n"), [(0, 32), (100, 32), (-1, 1), (20, 0), (20, -5)])
def test_bloom_invalid_parameters(f: int, n: int) -> None:
    with pytest.raises(ValueError):
        BloomFilter(f, n)


def test_bloom_empty_key_hashes_to_zero() -> None:
    assert BloomFilter(20, 32).bit_positions("") == [0, 0, 0]


@given(st.lists(st.text(max_size=30), max_size=20), st.text(max_size=30))
def test_bloom_has_no_false_negatives(keys: list[str], probe: str) -> None:
    bloom = BloomFilter(20, 32)
    bitmap = bloom.bitmap(keys)
    for key in keys:
        assert bloom.is_hit(key, bitmap)
        assert all(0 <= p < bloom.m for p in bloom.bit_positions(key))
    bits = bloom.bit_positions(probe)
    assert bloom.is_hit(probe, bitmap) == all(bitmap[p // 8] >> (p % 8) & 1 for p in bits)


def test_bloom_lone_surrogate_is_hashed_as_question_mark() -> None:
    bloom = BloomFilter(20, 32)
    assert bloom.bit_positions("g\ud800#t") == bloom.bit_positions("g?#t")


def test_bloom_bitmap_layout() -> None:
    bloom = BloomFilter(20, 32)
    positions = bloom.bit_positions("group#topic")
    bitmap = bloom.bitmap(["group#topic"])
    for p in positions:
        assert bitmap[p // 8] & (1 << (p % 8))
    assert sum(bin(b).count("1") for b in bitmap) == len(set(positions))
    with pytest.raises(ValueError):
        bloom.is_hit("x", b"\x00")


@pytest.mark.parametrize(
    ("expr", "values"),
    [
        ("a = 16", ["0x10", "16", "-5", "0X10", "00016", None]),
        ("a > 1.0", ["inf", "NaN", "Infinity", "1.5", "nan", "-Infinity", "+inf", "2", None]),
        ("a > 1.0", ["1d", " 2 ", "0x1p3", "2"]),
        ("a = 3", ["٣", "+3", "3", "1" * 25]),
    ],
)
def test_batch_fast_paths_agree_with_scalar(expr: str, values: list[str | None]) -> None:
    """Columns that Arrow's cast accepts whole go through the fast path; it must stay exact."""
    compiled = compile_filter("SQL92", expr)
    rows = values * 1000
    want = [compiled.matches({"a": v}) for v in rows]
    for array in (pa.array(rows, type=pa.string()), pa.array(rows, type=pa.string()).dictionary_encode()):
        assert list(compiled.matches_batch(pa.table({"a": array}))) == want
