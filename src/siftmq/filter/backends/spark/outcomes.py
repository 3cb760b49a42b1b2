"""Four outcomes on a three-valued engine: RocketMQ's semantics, contexts and lookup tables.

Owns the per-node semantics over thunks (``_sem_*``, used to fold constants and fill tables),
predicate contexts (which of FALSE/NULL/TRUE/ERROR an ancestor still tells apart;
``_child_context``, memoized with :func:`~siftmq.filter.javalang.typed_key` keys), the translated
values (``_Str``, ``_Const``, ``_Pred``, ``_Rendered``) and the outcome-code tables
(``element_at(array(...), code)``) that ``_node``/``_leaf`` build.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Final, TypeAlias

from siftmq.errors import FilterEvaluationError
from siftmq.filter import javalang
from siftmq.filter.ast import (
    CmpOp,
    MatchOp,
)
from siftmq.filter.backends.spark.conversions import _FALSE, _NULL, _TRUE, _int, _is_true_text
from siftmq.filter.backends.spark.expressions import _X, _Call, _Case, _IsNull, _Lit

# ---------------------------------------------------------------------------------------- semantics
#
# RocketMQ's evaluation of each node kind over its operands, given as thunks: calling one returns the
# operand's value or raises where RocketMQ throws. Used to fold constants, to compute each
# predicate's context, and to fill lookup tables.

Thunk: TypeAlias = Callable[[], object]
Semantics: TypeAlias = Callable[..., object]

_F, _N, _T, _E = 0, 1, 2, 3  # the outcomes of a predicate; a Spark code is the outcome + 1
Context: TypeAlias = tuple[int, ...]  # outcome -> class; outcomes in one class need not be told apart
_ROOT: Final[Context] = (0, 0, 1, 0)  # at the top only TRUE matters


class _Raises:
    """The representative of an operand whose evaluation throws."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<raises>"


_RAISES: Final = _Raises()
_PREDICATE_VALUES: Final[tuple[object, ...]] = (False, None, True, _RAISES)  # indexed by outcome
# a string operand of a lookup table: null, Boolean.valueOf true, anything else
_STRING_VALUES: Final[tuple[object, ...]] = (None, "true", "x")


def _thunk(value: object) -> Thunk:
    if value is _RAISES:

        def raises() -> object:
            raise javalang.JavaEvaluationError("an operand threw")

        return raises
    return lambda: value


def _outcome(semantics: Semantics, values: Sequence[object]) -> int:
    try:
        result = semantics(*(_thunk(v) for v in values))
    except FilterEvaluationError:
        return _E
    if result is None:
        return _N
    if result is True:
        return _T
    if result is False:
        return _F
    raise AssertionError(f"a predicate evaluated to {result!r}")


def _sem_not(operand: Thunk) -> object:
    value = operand()
    return None if value is None else not value


def _sem_and(*operands: Thunk) -> object:
    return javalang.and_all(operand() for operand in operands)


def _sem_or(*operands: Thunk) -> object:
    return javalang.or_any(operand() for operand in operands)


def _sem_equal(left: Thunk, right: Thunk) -> object:
    return javalang.equal(left(), right())


def _sem_is_null(operand: Thunk) -> object:
    return operand() is None


def _sem_negate(operand: Thunk) -> object:
    return javalang.negate(operand())


@cache
def _sem_compare(op: CmpOp) -> Semantics:
    def compare(left: Thunk, right: Thunk) -> object:
        lv = left()
        if lv is None:
            return None
        rv = right()
        if rv is None:
            return None
        return op.holds(javalang.relational_compare(lv, rv))

    return compare


@cache
def _sem_match(op: MatchOp, pattern: str, negated: bool) -> Semantics:
    def match(operand: Thunk) -> object:
        if not pattern:
            return False
        value = operand()
        if type(value) is not str:
            return False
        return op.holds(value, pattern) is not negated

    return match


_CHILD_CONTEXTS: dict[object, Context] = {}
_MAX_CHILD_CONTEXTS: Final = 4096


def _child_context(
    semantics: Semantics, domains: tuple[tuple[object, ...], ...], index: int, parent: Context
) -> Context:
    """The context of operand ``index``: two of its outcomes share a class when, whatever the other
    operands are (one representative per class of their values), the node's outcomes share a class
    of ``parent``. Memoized with the domains' constants type-tagged: ``TRUE`` and ``1`` are equal
    in Python, not in a filter."""
    key = (semantics, javalang.typed_key(domains), index, parent)
    hit = _CHILD_CONTEXTS.get(key)
    if hit is None:
        if len(_CHILD_CONTEXTS) >= _MAX_CHILD_CONTEXTS:
            _CHILD_CONTEXTS.clear()
        hit = _CHILD_CONTEXTS[key] = _derive_child_context(semantics, domains, index, parent)
    return hit


def _derive_child_context(
    semantics: Semantics, domains: tuple[tuple[object, ...], ...], index: int, parent: Context
) -> Context:
    others = domains[:index] + domains[index + 1 :]
    signatures = []
    for value in _PREDICATE_VALUES:
        signature = tuple(
            parent[_outcome(semantics, (*combo[:index], value, *combo[index:]))]
            for combo in itertools.product(*others)
        )
        signatures.append(signature)
    classes: dict[tuple[int, ...], int] = {}
    return tuple(classes.setdefault(s, len(classes)) for s in signatures)


def _present(context: Context, outcome: int) -> int:
    """The outcome to show for ``outcome`` in ``context``: NULL when it cannot be told from NULL, an
    ERROR as FALSE or TRUE when it cannot be told from that, else itself."""
    if context[outcome] == context[_N]:
        return _N
    if outcome == _E:
        for other in (_F, _T):
            if context[other] == context[_E]:
                return other
    return outcome


# ------------------------------------------------------------------------------- translated values


@dataclass(frozen=True, slots=True)
class _Rendered:
    """A predicate as Spark sees it: a boolean (three-valued, no ERROR) or an outcome code 1-4."""

    expr: _X
    coded: bool
    constant: int | None = None


def _constant(outcome: int) -> _Rendered:
    if outcome == _E:
        return _Rendered(_int(_E + 1), True, outcome)
    return _Rendered((_FALSE, _NULL, _TRUE)[outcome], False, outcome)


def _boolean_of(outcome: int) -> _Lit:
    return (_FALSE, _NULL, _TRUE)[outcome]


def _code_of_boolean(b: _X) -> _X:
    """Outcome code of a three-valued boolean (FALSE 1, NULL 2, TRUE 3), ``b`` referenced once."""
    looked_up = _Call("element_at", (_Call("map", (_FALSE, _int(_F + 1), _TRUE, _int(_T + 1))), b))
    return _Call("coalesce", (looked_up, _int(_N + 1)))


@dataclass(frozen=True, slots=True)
class _Str:
    """A property: a nullable string column."""

    expr: _X


@dataclass(frozen=True, slots=True)
class _Const:
    """A value known before any row is read (Java-typed; None is NULL)."""

    value: object


@dataclass(frozen=True, slots=True)
class _Pred:
    """A predicate (or a NULL that may throw): rendered for the context its parent gives it."""

    render: Callable[[Context], _Rendered]


_Val: TypeAlias = _Str | _Const | _Pred


def _throws() -> _Pred:
    return _Pred(lambda context: _constant(_present(context, _E)))


def _fold(semantics: Semantics, values: Sequence[object]) -> _Val:
    """A node whose operands are all constants."""
    try:
        return _Const(semantics(*(_thunk(v) for v in values)))
    except FilterEvaluationError:
        return _throws()


def _domain(val: _Val) -> tuple[object, ...]:
    if isinstance(val, _Str):
        return _STRING_VALUES
    if isinstance(val, _Const):
        return (val.value,)
    return _PREDICATE_VALUES


@dataclass(frozen=True, slots=True)
class _Operand:
    """An operand of a lookup table: representative values, and a Spark expression giving the
    (1-based) index of the row's value among them; None when there is a single one."""

    values: tuple[object, ...]
    index: _X | None
    string: _X | None = None  # a string operand, whose classes may be merged


def _operand(val: _Str | _Const | _Rendered) -> _Operand:
    if isinstance(val, _Const):
        return _Operand((val.value,), None)
    if isinstance(val, _Str):
        s = val.expr
        index = _Case(((_IsNull(s), _int(1)), (_is_true_text(s), _int(2))), _int(3))
        return _Operand(_STRING_VALUES, index, s)
    if val.constant is not None:
        return _Operand((_PREDICATE_VALUES[val.constant],), None)
    return _Operand(_PREDICATE_VALUES, val.expr if val.coded else _code_of_boolean(val.expr))


def _table(semantics: Semantics, operands: Sequence[_Operand], context: Context) -> _Rendered:
    """The node's outcome, presented for ``context``, looked up from its operands' indices."""
    ops = list(operands)
    grid = {
        combo: _present(
            context, _outcome(semantics, [op.values[i] for op, i in zip(ops, combo, strict=True)])
        )
        for combo in itertools.product(*(range(len(op.values)) for op in ops))
    }
    # a string operand whose "true" and "x" rows agree only needs to be tested for NULL: drop the
    # "true" rows and renumber the "x" ones
    for k, op in enumerate(ops):
        if op.string is None:
            continue
        if all(v == grid[(*c[:k], 2, *c[k + 1 :])] for c, v in grid.items() if c[k] == 1):
            renumbered = {0: 0, 2: 1}
            grid = {(*c[:k], renumbered[c[k]], *c[k + 1 :]): v for c, v in grid.items() if c[k] != 1}
            ops[k] = _Operand((None, "x"), _Case(((_IsNull(op.string), _int(1)),), _int(2)))
    outcomes = set(grid.values())
    if len(outcomes) == 1:
        return _constant(outcomes.pop())
    coded = _E in outcomes

    def cell(outcome: int) -> _Lit:
        return _int(outcome + 1) if coded else _boolean_of(outcome)

    indexed = [k for k, op in enumerate(ops) if op.index is not None]

    def build(level: int, fixed: tuple[int, ...]) -> _X:
        k = indexed[level]
        rows: list[_X] = []
        for i in range(len(ops[k].values)):
            combo = (*fixed[:k], i, *fixed[k + 1 :])
            rows.append(cell(grid[combo]) if level + 1 == len(indexed) else build(level + 1, combo))
        return _Call("array", tuple(rows))

    expr = build(0, (0,) * len(ops))
    for k in indexed:
        index = ops[k].index
        assert index is not None
        expr = _Call("element_at", (expr, index))
    return _Rendered(expr, coded)


def _node(
    semantics: Semantics,
    operands: Sequence[_Val],
    native: Callable[[list[_X]], _X] | None = None,
) -> _Val:
    """A node over arbitrary operands: folded when constant, else a lookup table (or ``native``, a
    plain Spark expression over the operands, when they are all plain booleans)."""
    if all(isinstance(op, _Const) for op in operands):
        return _fold(semantics, [op.value for op in operands if isinstance(op, _Const)])
    domains = tuple(_domain(op) for op in operands)

    def render(context: Context) -> _Rendered:
        parts: list[_Str | _Const | _Rendered] = []
        for i, op in enumerate(operands):
            if isinstance(op, _Pred):
                parts.append(op.render(_child_context(semantics, domains, i, context)))
            else:
                parts.append(op)
        if native is not None and all(
            isinstance(p, _Rendered) and not p.coded and p.constant is None for p in parts
        ):
            return _Rendered(native([p.expr for p in parts if isinstance(p, _Rendered)]), False)
        return _table(semantics, [_operand(p) for p in parts], context)

    return _Pred(render)


def _leaf(branches: Sequence[tuple[_X, int | _X]], otherwise: int | _X, lax: _X | None = None) -> _Pred:
    """A predicate over properties and constants only: the first branch whose condition holds gives
    the outcome, either fixed or a boolean (non-null where it is reached). ``lax`` is an equivalent
    three-valued expression for when every fixed outcome is shown as NULL."""

    def render(context: Context) -> _Rendered:
        def show(outcome: int | _X) -> int | _X:
            return _present(context, outcome) if isinstance(outcome, int) else outcome

        shown = [(cond, show(out)) for cond, out in branches]
        last = show(otherwise)
        fixed = [o for o in [*(out for _, out in shown), last] if isinstance(o, int)]
        if isinstance(last, int) and len(fixed) == len(shown) + 1 and len(set(fixed)) == 1:
            return _constant(last)
        if lax is not None and all(o == _N for o in fixed):
            return _Rendered(lax, False)
        coded = _E in fixed

        def value(outcome: int | _X) -> _X:
            if isinstance(outcome, int):
                return _int(outcome + 1) if coded else _boolean_of(outcome)
            return _Case(((outcome, _int(_T + 1)),), _int(_F + 1)) if coded else outcome

        return _Rendered(_Case(tuple((c, value(o)) for c, o in shown), value(last)), coded)

    return _Pred(render)


def _plain(expr: _X) -> _Pred:
    """A three-valued predicate that never throws."""
    return _Pred(lambda context: _Rendered(expr, False))


# -------------------------------------------------------------------------------------- translator
