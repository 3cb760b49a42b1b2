"""Spark's pushed filters -> the broker's filter, and queue/offset bounds for partition planning.

:func:`plan_pushdown` takes the filters Spark offers ``DataSourceReader.pushFilters`` (an implicit
AND; see ``spark-facts.md`` 2b) and decides, filter by filter, whether the source can apply it
*exactly*. A filter is accepted only when the rows the source then returns are exactly the rows
Spark would keep; everything else is handed back to Spark, which then evaluates it itself.

What is accepted:

* ``tag`` and hot property columns (strings; ``tag`` is ``TAGS`` in SQL92): ``=``, ``<=>``, ``IN``,
  ``IS [NOT] NULL``, ``STARTSWITH``/``ENDSWITH``/``CONTAINS`` (non-empty pattern) and their
  negations, rendered as SQL92 over the message's properties. Positive tag sets (``tag = 'A'``,
  ``tag IN ('A', 'B')``) become a TAG expression when nothing else needs SQL92 (the broker then
  filters on the tag hash in its index), or ``TAGS IN (...)`` inside the SQL92 filter.
* ``queue_id`` and ``queue_offset`` comparisons: they only narrow the partitions to read.
* ``topic``: decided here (every row has the option's topic), so always-true or matches-nothing.

What is returned to Spark: ordering comparisons on strings (RocketMQ SQL92 orders numbers only),
empty patterns (RocketMQ answers FALSE for ``CONTAINS ''``, Spark TRUE), ``NOT IN`` with a NULL in
the list, anything on ``message_id``/``keys``/``body``/``properties``/timestamps, hot properties
whose names are not SQL92 identifiers, and every SQL92-only filter when SQL92 is not available.

Why each rendering is exact: a hot property column is ``properties[name]`` as a string (NULL when
the message lacks it) and the broker evaluates the same string. ``=``/``<>``/``IN``/``NOT IN``
compare strings in both engines with the same three-valued logic (NULL is never TRUE); a NULL in
an ``IN`` list only turns FALSE into NULL, so dropping it keeps the rows that pass;
``NOT STARTSWITH`` on a missing property is FALSE in RocketMQ and NULL in Spark — neither keeps
the row. ``NOT (a <=> 'x')`` is ``a IS NULL OR a <> 'x'``.

The batch source takes only the filters whose plan keeps every row (:attr:`Pushdown.keeps_every_row`):
Spark 4.3 shares one pushdown's read plan between every scan of a loaded relation (``source.py``).

Pure: imports only the filter classes of ``pyspark.sql.datasource`` (no session, no JVM).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeGuard

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

from siftmq.errors import FilterError
from siftmq.filter import TagFilter, compile_filter
from siftmq.spark.options import is_sql92_identifier

TAGS: Final = "TAGS"
_ORDERING: Final = (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
_MATCH_SQL: Final = {StringStartsWith: "STARTSWITH", StringEndsWith: "ENDSWITH", StringContains: "CONTAINS"}
_NEGATED_ORDER: Final = {
    GreaterThan: LessThanOrEqual,
    GreaterThanOrEqual: LessThan,
    LessThan: GreaterThanOrEqual,
    LessThanOrEqual: GreaterThan,
}


def sql_string(value: str) -> str:
    """An SQL92 string literal: quotes doubled (the only escape RocketMQ's grammar has)."""
    return "'" + value.replace("'", "''") + "'"


def tag_expression(tags: Iterable[str]) -> str:
    """The TAG expression that parses back to exactly ``tags`` (" " for none, "*||" for the tag "*")."""
    return TagFilter.of_tags(tags).normalized()


def tags_in_sql(tags: Iterable[str]) -> str:
    return f"{TAGS} IN ({', '.join(sql_string(t) for t in sorted(tags))})"


def tag_expressible(tag: str) -> bool:
    """Does the TAG expression ``tag`` select exactly the messages whose tag is ``tag``?"""
    if "|" in tag:
        return False
    try:
        parsed = TagFilter.parse(tag)
    except FilterError:
        return False
    return not parsed.sub_all and parsed.tags == frozenset({tag})


@dataclass(frozen=True, slots=True)
class Range:
    """An integer interval ``[lo, hi)`` minus ``excluded``, optionally limited to ``only``."""

    lo: int = 0
    hi: int | None = None
    only: frozenset[int] | None = None
    excluded: frozenset[int] = frozenset()

    def contains(self, value: int) -> bool:
        return (
            value >= self.lo
            and (self.hi is None or value < self.hi)
            and (self.only is None or value in self.only)
            and value not in self.excluded
        )

    def clip(self, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` intersected with ``[lo, hi)`` (``only``/``excluded`` ignored)."""
        lo = max(start, self.lo)
        hi = end if self.hi is None else min(end, self.hi)
        return lo, max(lo, hi)

    def narrowed(self, op: type, value: int) -> Range:
        lo, hi = self.lo, self.hi
        if op is GreaterThan:
            lo = max(lo, value + 1)
        elif op is GreaterThanOrEqual:
            lo = max(lo, value)
        elif op is LessThan:
            hi = value if hi is None else min(hi, value)
        elif op is LessThanOrEqual:
            hi = value + 1 if hi is None else min(hi, value + 1)
        return Range(lo, hi, self.only, self.excluded)

    def only_in(self, values: Iterable[int]) -> Range:
        wanted = frozenset(values)
        return Range(self.lo, self.hi, wanted if self.only is None else self.only & wanted, self.excluded)

    def without(self, values: Iterable[int]) -> Range:
        return Range(self.lo, self.hi, self.only, self.excluded | frozenset(values))

    def describe(self, name: str) -> str:
        parts = []
        if self.lo > 0:
            parts.append(f"{name} >= {self.lo}")
        if self.hi is not None:
            parts.append(f"{name} < {self.hi}")
        if self.only is not None:
            parts.append(f"{name} IN {sorted(self.only)}")
        if self.excluded:
            parts.append(f"{name} NOT IN {sorted(self.excluded)}")
        return " AND ".join(parts)


@dataclass(frozen=True, slots=True)
class Pushdown:
    """What the source applies itself; ``rejected`` goes back to Spark (the same objects)."""

    accepted: tuple[Any, ...] = ()
    rejected: tuple[Any, ...] = ()
    sql_terms: tuple[str, ...] = ()  # SQL92 conjuncts over TAGS and hot properties
    tags: frozenset[str] | None = None  # only these tags (None: no tag constraint)
    queues: Range = field(default_factory=Range)
    offsets: Range = field(default_factory=Range)
    empty: bool = False  # an accepted filter matches no row at all

    @property
    def keeps_every_row(self) -> bool:
        """Does the read narrowed by this keep every row of the read without it?"""
        return (
            not self.sql_terms
            and self.tags is None
            and self.queues == Range()
            and self.offsets == Range()
            and not self.empty
        )

    def describe(self) -> str:
        parts = list(self.sql_terms)
        if self.tags is not None:
            parts.append(tags_in_sql(self.tags) if self.tags else "no tag")
        for text in (self.queues.describe("queue_id"), self.offsets.describe("queue_offset")):
            if text:
                parts.append(text)
        if self.empty:
            parts.append("FALSE")
        return " AND ".join(parts) or "nothing"


@dataclass(slots=True)
class _Acc:
    sql: list[str] = field(default_factory=list)
    null_rejecting: set[str] = field(default_factory=set)  # columns some SQL term needs non-NULL
    tag_sets: list[frozenset[str]] = field(default_factory=list)
    tag_not_null: list[Any] = field(default_factory=list)
    queues: Range = field(default_factory=Range)
    offsets: Range = field(default_factory=Range)
    empty: bool = False


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _unwrap(f: Any) -> tuple[bool, Any]:
    if isinstance(f, Not):
        return True, f.child
    return False, f


def _string_sql(name: str, negated: bool, f: Any) -> str | None:
    """SQL92 over the string property ``name`` equal (in Spark's filter sense) to ``f``, or None."""
    v = getattr(f, "value", None)
    if isinstance(f, EqualTo):
        if not isinstance(v, str):
            return None
        return f"{name} {'<>' if negated else '='} {sql_string(v)}"
    if isinstance(f, EqualNullSafe):
        if v is None:
            return f"{name} IS {'NOT ' if negated else ''}NULL"
        if not isinstance(v, str):
            return None
        if negated:
            return f"({name} IS NULL OR {name} <> {sql_string(v)})"
        return f"{name} = {sql_string(v)}"
    if isinstance(f, In):
        values = list(v) if isinstance(v, list | tuple) else None
        if values is None:
            return None
        strings = [x for x in values if x is not None]
        if not strings or not all(isinstance(x, str) for x in strings):
            return None
        if negated and len(strings) != len(values):
            return None  # NOT IN (.., NULL) is never TRUE in Spark
        unique = sorted(set(strings))
        return f"{name} {'NOT IN' if negated else 'IN'} ({', '.join(sql_string(x) for x in unique)})"
    if isinstance(f, IsNull):
        return f"{name} IS {'NOT ' if negated else ''}NULL"
    if isinstance(f, IsNotNull):
        return f"{name} IS {'' if negated else 'NOT '}NULL"
    op = _MATCH_SQL.get(type(f))
    if op is not None:
        if not isinstance(v, str) or not v:
            return None  # RocketMQ: an empty pattern never matches; Spark: it always does
        return f"{name} {'NOT ' if negated else ''}{op} {sql_string(v)}"
    return None  # orderings: RocketMQ SQL92 orders numbers only


def _tag_set(negated: bool, f: Any) -> frozenset[str] | None:
    """The tags a positive ``tag = / <=> / IN`` filter keeps, when a TAG expression can say so."""
    if negated:
        return None
    v = getattr(f, "value", None)
    if isinstance(f, EqualTo | EqualNullSafe) and isinstance(v, str):
        values = [v]
    elif isinstance(f, In) and isinstance(v, list | tuple):
        values = [x for x in v if x is not None]
        if not values or not all(isinstance(x, str) for x in values):
            return None
    else:
        return None
    if not all(tag_expressible(x) for x in values):
        return None
    return frozenset(values)


def _topic_decision(topic: str, negated: bool, f: Any) -> bool | None:
    """Every row has ``topic``: True keeps every row, False none, None = cannot decide."""
    v = getattr(f, "value", None)
    result: bool | None
    if isinstance(f, IsNull):
        result = False
    elif isinstance(f, IsNotNull):
        result = True
    elif isinstance(f, EqualTo | EqualNullSafe) and isinstance(v, str):
        result = topic == v
    elif (
        isinstance(f, In) and isinstance(v, list | tuple) and all(x is None or isinstance(x, str) for x in v)
    ):
        if topic in v:
            result = True
        elif negated and None in v:
            return False  # NOT IN (.., NULL): never TRUE
        else:
            result = False  # NULL or FALSE: not kept
    elif isinstance(f, StringStartsWith) and isinstance(v, str):
        result = topic.startswith(v)
    elif isinstance(f, StringEndsWith) and isinstance(v, str):
        result = topic.endswith(v)
    elif isinstance(f, StringContains) and isinstance(v, str):
        result = v in topic
    elif isinstance(f, _ORDERING) and isinstance(v, str):
        # Spark orders strings by UTF-8 bytes, which is code point order, as Python's
        result = {
            GreaterThan: topic > v,
            GreaterThanOrEqual: topic >= v,
            LessThan: topic < v,
            LessThanOrEqual: topic <= v,
        }[type(f)]
    else:
        return None
    return (not result) if negated else result


def _int_column(acc_range: Range, negated: bool, f: Any, *, exclusions: bool) -> Range | bool | None:
    """A non-null integer column: a narrower Range, True (no-op), False (no row), or None (reject)."""
    v = getattr(f, "value", None)
    if isinstance(f, IsNotNull):
        return not negated
    if isinstance(f, IsNull):
        return negated
    if isinstance(f, EqualTo | EqualNullSafe):
        if not _is_int(v):
            return None
        if negated:
            return acc_range.without([v]) if exclusions else None
        return acc_range.narrowed(GreaterThanOrEqual, v).narrowed(LessThanOrEqual, v)
    if isinstance(f, In):
        if not isinstance(v, list | tuple):
            return None
        ints = [x for x in v if x is not None]
        if not all(_is_int(x) for x in ints):
            return None
        if negated:
            if len(ints) != len(v) or not exclusions:
                return None
            return acc_range.without(ints)
        if not ints:
            return False
        if not exclusions:  # queue offsets: only a contiguous IN is exact as a range
            lo, hi = min(ints), max(ints)
            if len(set(ints)) != hi - lo + 1:
                return None
            return acc_range.narrowed(GreaterThanOrEqual, lo).narrowed(LessThanOrEqual, hi)
        return acc_range.only_in(ints)
    if isinstance(f, _ORDERING):
        if not _is_int(v):
            return None
        op = _NEGATED_ORDER[type(f)] if negated else type(f)
        return acc_range.narrowed(op, v)
    return None


def plan_pushdown(
    filters: Sequence[Any],
    *,
    topic: str,
    hot_properties: Sequence[str],
    sql92: bool,
    base_tags: frozenset[str] | None = None,
) -> Pushdown:
    """Split ``filters`` into what the source applies exactly and what Spark must still apply.

    ``sql92`` says whether the broker may be sent an SQL92 filter; without it only tag sets (a
    TAG expression) and queue/offset bounds are accepted. ``base_tags`` is the ``tags`` option's
    tag set: it already guarantees a non-NULL tag, so ``tag IS NOT NULL`` is then free.
    """
    hot = {name.lower(): name for name in hot_properties}
    acc = _Acc()
    accepted: list[Any] = []
    rejected: list[Any] = []
    for f in filters:
        negated, inner = _unwrap(f)
        attr = getattr(inner, "attribute", None)
        if not isinstance(attr, tuple) or len(attr) != 1 or not isinstance(attr[0], str):
            rejected.append(f)
            continue
        column = attr[0].lower()
        ok = False
        if column == "tag":
            tag_set = _tag_set(negated, inner)
            if isinstance(inner, IsNotNull) and not negated:
                acc.tag_not_null.append(f)  # decided once every tag filter is known
                continue
            if tag_set is not None:
                acc.tag_sets.append(tag_set)
                ok = True
            elif sql92:
                ok = _add_sql(acc, TAGS, negated, inner)
        elif column in hot:
            name = hot[column]
            if sql92 and is_sql92_identifier(name):
                ok = _add_sql(acc, name, negated, inner)
        elif column == "topic":
            decided = _topic_decision(topic, negated, inner)
            if decided is not None:
                acc.empty = acc.empty or not decided
                ok = True
        elif column in ("queue_id", "queue_offset"):
            current = acc.queues if column == "queue_id" else acc.offsets
            out = _int_column(current, negated, inner, exclusions=column == "queue_id")
            if out is not None:
                ok = True
                if isinstance(out, Range):
                    if column == "queue_id":
                        acc.queues = out
                    else:
                        acc.offsets = out
                elif out is False:
                    acc.empty = True
        (accepted if ok else rejected).append(f)
    tags: frozenset[str] | None = None
    for each in acc.tag_sets:
        tags = each if tags is None else tags & each
    for f in acc.tag_not_null:
        if tags is not None or base_tags is not None:
            accepted.append(f)  # implied by the tag constraint
        elif sql92:
            acc.sql.append(f"{TAGS} IS NOT NULL")
            accepted.append(f)
        else:
            rejected.append(f)
    if tags is not None and base_tags is not None:
        tags &= base_tags
    empty = acc.empty or (tags is not None and not tags)
    # "x IS NOT NULL" beside a term that is never TRUE for a NULL x says nothing more
    redundant = {f"{name} IS NOT NULL" for name in acc.null_rejecting}
    sql_terms = tuple(sorted(set(acc.sql) - redundant))
    return Pushdown(
        accepted=tuple(accepted),
        rejected=tuple(rejected),
        sql_terms=sql_terms,
        tags=tags,
        queues=acc.queues,
        offsets=acc.offsets,
        empty=empty,
    )


def _add_sql(acc: _Acc, name: str, negated: bool, f: Any) -> bool:
    """Push a string predicate on property ``name`` as SQL92 (if it translates and compiles)."""
    sql = _string_sql(name, negated, f)
    if sql is None or not _compiles(sql):
        return False
    acc.sql.append(sql)
    if _rejects_null(sql, name):
        acc.null_rejecting.add(name)
    return True


def _rejects_null(sql: str, name: str) -> bool:
    """Is the term built by :func:`_string_sql` never TRUE when ``name`` is NULL (and not IS NOT NULL)?"""
    return not (sql.startswith(("(", f"{name} IS ")))


def _compiles(sql: str) -> bool:
    try:
        compile_filter("SQL92", sql)
    except FilterError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class BrokerFilter:
    """The filter sent with every pull: ``kind`` is ``TAG`` or ``SQL92``."""

    kind: str
    expression: str

    @property
    def needs_sql92(self) -> bool:
        return self.kind == "SQL92"


def broker_filter(
    *,
    sql_filter: str | None,
    base_tags: frozenset[str] | None,
    pushdown: Pushdown | None = None,
) -> BrokerFilter:
    """The one filter for the broker: the ``filter`` option AND the ``tags`` option AND what was pushed.

    A tag constraint alone is a TAG expression (the broker then skips by the index's tag hash);
    anything else is one SQL92 expression, the tag set becoming ``TAGS IN (...)``. An empty tag set
    matches nothing, as it does for a consumer: the TAG expression ``" "``, or ``FALSE`` in SQL92.
    """
    tags = base_tags
    terms: list[str] = []
    if sql_filter is not None:
        terms.append(f"({compile_filter('SQL92', sql_filter).normalized})")
    if pushdown is not None:
        if pushdown.tags is not None:
            tags = pushdown.tags if tags is None else tags & pushdown.tags
        terms.extend(pushdown.sql_terms)
    if terms:
        if tags is not None:
            # an empty tag set matches no message (RocketMQ), and SQL92 has no empty IN list
            terms.append(tags_in_sql(tags) if tags else "FALSE")
        text = " AND ".join(terms)
        compile_filter("SQL92", text)  # raises FilterError: caller decides
        return BrokerFilter("SQL92", text)
    if tags is not None:
        return BrokerFilter("TAG", tag_expression(tags))
    return BrokerFilter("TAG", "*")
