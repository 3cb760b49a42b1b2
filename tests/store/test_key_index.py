"""The in-memory key index: lookups by UNIQ_KEY and KEYS agree with a plain model through any
sequence of appends, prunes and clears; and a prune filters outside the lock, so appends and
lookups made while it runs are served at once and kept."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.store.commitlog import AppendedRecord
from siftmq.store.keyindex import KeyIndex

KEYS = ["a", "b", "c", "d"]


def _add(index: KeyIndex, offset: int, uniq: str | None, keys: list[str], topic: str = "T") -> None:
    props: dict[str, str] = {}
    if uniq:
        props["UNIQ_KEY"] = uniq
    if keys:
        props["KEYS"] = " ".join(keys)
    index.add_appended([AppendedRecord(topic, 0, 0, offset, 10, 0)], [props])


class _Model:
    def __init__(self) -> None:
        self.uniq: dict[str, int] = {}
        self.keys: dict[str, list[int]] = {}

    def add(self, offset: int, uniq: str | None, keys: list[str]) -> None:
        if uniq and self.uniq.get(uniq, -1) < offset:
            self.uniq[uniq] = offset
        for k in keys:
            self.keys[k] = sorted([*self.keys.get(k, []), offset])

    def prune(self, min_offset: int) -> None:
        self.uniq = {k: v for k, v in self.uniq.items() if v >= min_offset}
        self.keys = {k: [o for o in v if o >= min_offset] for k, v in self.keys.items()}


def _agree(index: KeyIndex, model: _Model) -> None:
    for uniq in [f"u{i}" for i in range(12)]:
        assert index.offset_of_uniq_key(uniq) == model.uniq.get(uniq)
    for key in KEYS:
        assert index.offsets_of_key("T", key) == model.keys.get(key, [])


operation = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, 10_000),
        st.one_of(st.none(), st.sampled_from([f"u{i}" for i in range(12)])),
        st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
    ),
    st.tuples(st.just("prune"), st.integers(0, 10_000)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=60))
def test_lookups_agree_with_a_model(ops: list[Any]) -> None:
    index, model = KeyIndex(), _Model()
    for op in ops:
        if op[0] == "add":
            index_args = op[1:]
            _add(index, *index_args)
            model.add(*index_args)
        elif op[0] == "prune":
            index.prune(op[1])
            model.prune(op[1])
        else:
            index.clear()
            model = _Model()
        _agree(index, model)


class _PausingDict(dict):  # type: ignore[type-arg]
    """A map whose pass over its items waits until told to go (the prune's filtering, held open)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.started = threading.Event()
        self.go = threading.Event()

    def items(self) -> Any:
        self.started.set()
        assert self.go.wait(30)
        return super().items()


def test_appends_and_lookups_during_a_prune_are_served_and_kept() -> None:
    index = KeyIndex()
    for offset in range(0, 1000, 10):
        _add(index, offset, f"old{offset}", ["k"])
    paused = _PausingDict(index._by_uniq_key)
    index._by_uniq_key = paused
    pruning = threading.Thread(target=index.prune, args=(500,))
    pruning.start()
    assert paused.started.wait(10)  # the prune is filtering: the lock must be free
    _add(index, 2000, "new", ["k", "n"])
    _add(index, 2010, "old600", [])  # a newer offset for a kept key
    assert index.offset_of_uniq_key("new") == 2000
    assert index.offset_of_uniq_key("old600") == 2010
    assert index.offset_of_uniq_key("old700") == 700  # kept: still found
    assert index.offset_of_uniq_key("old100") is None  # below the bound: gone already
    assert index.offsets_of_key("T", "k") == [*range(500, 1000, 10), 2000]
    paused.go.set()
    pruning.join(10)
    assert not pruning.is_alive()
    assert index.offset_of_uniq_key("new") == 2000 and index.offset_of_uniq_key("old600") == 2010
    assert index.offset_of_uniq_key("old700") == 700 and index.offset_of_uniq_key("old100") is None
    assert index.offsets_of_key("T", "k") == [*range(500, 1000, 10), 2000]
    assert index.offsets_of_key("T", "n") == [2000]


def test_a_clear_during_a_prune_wins() -> None:
    index = KeyIndex()
    _add(index, 10, "a", ["k"])
    paused = _PausingDict(index._by_uniq_key)
    index._by_uniq_key = paused
    pruning = threading.Thread(target=index.prune, args=(0,))
    pruning.start()
    assert paused.started.wait(10)
    index.clear()
    _add(index, 20, "b", [])
    assert index.offset_of_uniq_key("a") is None and index.offsets_of_key("T", "k") == []
    paused.go.set()
    pruning.join(10)
    assert index.offset_of_uniq_key("a") is None and index.offset_of_uniq_key("b") == 20
    assert index.offsets_of_key("T", "k") == []


def test_the_index_is_trimmed_to_its_bound_oldest_first(tmp_path: Path) -> None:
    """Every id stayed in memory until retention removed its segment (72 h by default: tens of GB
    at a steady rate); past key_index_max_messages the oldest go at the next retention pass, and
    a retry of a recent message is still found."""
    from siftmq.store import MessageStore
    from store_helpers import msg, small_config

    with MessageStore.open(small_config(tmp_path, key_index_max_messages=100)) as store:
        for i in range(250):
            store.put_message(msg(body=b"x", UNIQ_KEY=f"u{i}", KEYS=f"k{i}"))
        store.delete_expired_files()
        held = [i for i in range(250) if store.query_message_by_uniq_key(f"u{i}") is not None]
        assert held == list(range(160, 250))  # nine tenths of the bound, the newest
        assert store.query_messages_by_key("T", "k100") == []
        assert [m.body for m in store.query_messages_by_key("T", "k249")] == [b"x"]
        store.delete_expired_files()  # within the bound: nothing more goes
        assert store.query_message_by_uniq_key("u160") is not None
