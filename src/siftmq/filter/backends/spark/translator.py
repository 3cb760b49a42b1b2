"""The SQL92 tree → Spark expression translator, and the backend's entry points.

Owns :class:`SparkSqlTranslator` (one visitor method per node kind, string/constant fast paths
for equality and comparisons), TAG filters, property columns (the ``map`` column or named
top-level columns), :func:`to_spark_column` and :func:`to_spark_sql`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from pyspark.sql import Column

from siftmq.errors import UnsupportedFilterError
from siftmq.filter import javalang
from siftmq.filter.ast import (
    And,
    BoolCast,
    CmpOp,
    Compare,
    Equal,
    In,
    IsNull,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Property,
    StringMatch,
)
from siftmq.filter.backends.spark.conversions import (
    _FALSE,
    _SQL_OP,
    _TRUE,
    _double_against,
    _double_between,
    _int,
    _is_true_text,
    _number,
    _parse_double,
    _parse_integral,
    _string,
    _user_string,
)
from siftmq.filter.backends.spark.expressions import (
    _X,
    BACKEND,
    MAX_NESTING,
    _Binary,
    _Call,
    _In,
    _IsNull,
    _Item,
    _Junction,
    _Not,
    _Ref,
    _walk,
)
from siftmq.filter.backends.spark.outcomes import (
    _E,
    _F,
    _N,
    _PREDICATE_VALUES,
    _ROOT,
    _T,
    Context,
    Semantics,
    _child_context,
    _Const,
    _constant,
    _fold,
    _leaf,
    _node,
    _operand,
    _plain,
    _Pred,
    _present,
    _Rendered,
    _sem_and,
    _sem_compare,
    _sem_equal,
    _sem_is_null,
    _sem_match,
    _sem_negate,
    _sem_not,
    _sem_or,
    _Str,
    _table,
    _Val,
)
from siftmq.filter.backends.spark.render import _column_tree, _depth, _sql_node
from siftmq.filter.bind import BoundTree, Shape
from siftmq.filter.javalang import JType
from siftmq.filter.spec import TAGS_PROPERTY, FilterSpec
from siftmq.filter.visitor import ExprVisitor, visit


class SparkSqlTranslator(ExprVisitor[_Val]):
    """Translates a bound SQL92 tree; ``property_column(name)`` is where a property is read."""

    def __init__(self, property_column: Callable[[str], _X], bound: BoundTree) -> None:
        self.property_column = property_column
        self.bound = bound

    def translate(self, tree: Node) -> _X:
        """The whole filter as a Spark boolean that is never NULL."""
        return self.top(visit(tree, self))

    def top(self, val: _Val) -> _X:
        if isinstance(val, _Const):
            return _TRUE if val.value is True else _FALSE
        if isinstance(val, _Str):  # cannot happen: the parser makes a bare property a BoolCast
            raise UnsupportedFilterError("a filter must be a condition", backend=BACKEND)
        rendered = val.render(_ROOT)
        if rendered.constant is not None:
            return _TRUE if rendered.constant == _T else _FALSE
        if rendered.coded:
            return _Binary("=", rendered.expr, _int(_T + 1))
        expr = rendered.expr
        if isinstance(expr, _Call) and expr.name == "coalesce" and expr.args[-1] == _FALSE:
            return expr  # already never NULL
        return _Call("coalesce", (expr, _FALSE))

    # ------------------------------------------------------------------------------ leaves

    def visit_literal(self, node: Literal) -> _Val:
        if isinstance(node.value, str):
            _user_string(node.value, "string literal")
        return _Const(node.value)

    def visit_property(self, node: Property) -> _Val:
        return _Str(self.property_column(node.name))

    # -------------------------------------------------------------------------- operators

    def visit_negate(self, node: Negate, operand: _Val) -> _Val:
        if isinstance(operand, _Str):
            return _Const(None)  # a String negates to NULL
        return _node(_sem_negate, [operand])

    def visit_not(self, node: Not, operand: _Val) -> _Val:
        return _node(_sem_not, [operand], lambda parts: _Not(parts[0]))

    def visit_bool_cast(self, node: BoolCast, operand: _Val) -> _Val:
        # a String is never a java.lang.Boolean: FALSE when present, NULL when missing
        assert isinstance(operand, _Str)
        return _leaf([(_IsNull(operand.expr), _N)], _F)

    def visit_and(self, node: And, operands: list[_Val]) -> _Val:
        return _junction("AND", _sem_and, operands)

    def visit_or(self, node: Or, operands: list[_Val]) -> _Val:
        return _junction("OR", _sem_or, operands)

    def visit_is_null(self, node: IsNull, operand: _Val) -> _Val:
        if isinstance(operand, _Str):
            return _plain(_IsNull(operand.expr))
        return _node(_sem_is_null, [operand], lambda parts: _IsNull(parts[0]))

    def visit_in(self, node: In, operand: _Val) -> _Val:
        assert isinstance(operand, _Str)
        values = tuple(sorted({_user_string(v, "IN item") for v in node.items}))
        hit: _X = _In(operand.expr, values)
        return _plain(_Not(hit) if node.negated else hit)

    def visit_string_match(self, node: StringMatch, operand: _Val) -> _Val:
        pattern = _user_string(node.pattern, f"{node.op.value} pattern")
        semantics = _sem_match(node.op, pattern, node.negated)
        if not pattern:
            return _Const(False)  # RocketMQ answers FALSE without evaluating the operand
        if isinstance(operand, _Str):
            hit: _X = _Call(node.op.value.lower(), (operand.expr, _string(pattern)))
            # a missing value is FALSE for the NOT forms too
            return _plain(_Call("coalesce", (_Not(hit) if node.negated else hit, _FALSE)))
        return _node(semantics, [operand])

    # ---------------------------------------------------------------------------- comparisons

    def visit_equal(self, node: Equal, left: _Val, right: _Val) -> _Val:
        c = self.bound.comparison(node)
        if c.shape is Shape.SAME_PROPERTY:
            return _Const(True)  # both NULL is TRUE, else the same text
        if c.shape is Shape.PROPERTIES:
            return _equal_strings(_expr(left), _expr(right))
        if c.shape is Shape.PROPERTY_CONSTANT:
            return _equal_string_constant(_expr(left), c.constant)
        if c.shape is Shape.CONSTANT_PROPERTY:
            return _equal_constant_string(c.constant, _expr(right))
        return _node(_sem_equal, [left, right])

    def visit_compare(self, node: Compare, left: _Val, right: _Val) -> _Val:
        op = node.op
        c = self.bound.comparison(node)
        if c.shape is Shape.SAME_PROPERTY or c.shape is Shape.PROPERTIES:
            return _compare_strings(op, _expr(left), _expr(right))
        if c.shape is Shape.PROPERTY_CONSTANT:
            return _compare_string_constant(op, _expr(left), c.constant)
        if c.shape is Shape.CONSTANT_PROPERTY:
            if c.constant is None:
                return _Const(None)  # NULL on the left: the right side is not even evaluated
            return _compare_string_constant(op.mirrored, _expr(right), c.constant)
        return _node(_sem_compare(op), [left, right])


def _expr(val: _Val) -> _X:
    """The Spark expression of a property operand (the binding says it is one)."""
    assert isinstance(val, _Str)
    return val.expr


def _junction(op: str, semantics: Semantics, operands: list[_Val]) -> _Val:
    """n-ary AND/OR, as RocketMQ folds it from the left: ``((o1 op o2) op o3) ...``."""
    if all(isinstance(o, _Const) for o in operands):
        return _fold(semantics, [o.value for o in operands if isinstance(o, _Const)])
    preds = [o if isinstance(o, _Pred) else _constant_pred(o) for o in operands]
    pair = (_PREDICATE_VALUES, _PREDICATE_VALUES)

    def render(context: Context) -> _Rendered:
        n = len(preds)
        acc_context: list[Context] = [context] * n  # acc_context[k]: of the fold of operands 0..k
        own_context: list[Context] = [context] * n
        for k in range(n - 1, 0, -1):
            own_context[k] = _child_context(semantics, pair, 1, acc_context[k])
            acc_context[k - 1] = _child_context(semantics, pair, 0, acc_context[k])
        own_context[0] = acc_context[0]
        acc = preds[0].render(own_context[0])
        for k in range(1, n):
            right = preds[k].render(own_context[k])
            if acc.coded or right.coded:
                acc = _table(semantics, [_operand(acc), _operand(right)], acc_context[k])
            elif isinstance(acc.expr, _Junction) and acc.expr.op == op:
                acc = _Rendered(_Junction(op, (*acc.expr.items, right.expr)), False)
            else:
                acc = _Rendered(_Junction(op, (acc.expr, right.expr)), False)
        return acc

    return _Pred(render)


def _constant_pred(val: _Val) -> _Pred:
    assert isinstance(val, _Const)
    if val.value is None:
        return _Pred(lambda context: _constant(_present(context, _N)))
    return _Pred(lambda context: _constant(_present(context, _T if val.value is True else _F)))


def _equal_strings(left: _X, right: _X) -> _Val:
    return _leaf(
        [
            (_Junction("AND", (_IsNull(left), _IsNull(right))), _T),
            (_IsNull(left), _N),
            (_IsNull(right), _F),
        ],
        _Binary("=", left, right),
    )


def _equal_string_constant(s: _X, const: object) -> _Val:
    """``property = constant`` (a NULL property gives NULL)."""
    if const is None:
        return _plain(_IsNull(s))  # both NULL is TRUE; a value against NULL is FALSE
    jtype = javalang.java_type(const)
    if jtype is JType.STRING:
        assert isinstance(const, str)
        return _plain(_Binary("=", s, _string(const)))
    if jtype is JType.BOOLEAN:
        is_true = _is_true_text(s)
        return _plain(is_true if const else _Not(is_true))
    test, failed = _numeric_equal(s, const, jtype)
    return _leaf([(_IsNull(s), _N), (failed, _E)], test, test)


def _equal_constant_string(const: object, s: _X) -> _Val:
    """``constant = property`` (a NULL property gives FALSE)."""
    if const is None:
        return _leaf([(_IsNull(s), _T)], _N)
    jtype = javalang.java_type(const)
    if jtype is JType.STRING:
        assert isinstance(const, str)
        test: _X = _Binary("=", s, _string(const))
        return _leaf([(_IsNull(s), _F)], test, test)
    if jtype is JType.BOOLEAN:
        return _leaf([(_IsNull(s), _F)], _E)  # Boolean against String: ClassCastException
    test, failed = _numeric_equal(s, const, jtype)
    return _leaf([(_IsNull(s), _F), (failed, _E)], test, test)


def _numeric_equal(s: _X, const: object, jtype: JType) -> tuple[_X, _X]:
    """(``s`` converted for ``const`` equals it, the conversion failed) for a non-null ``s``."""
    if jtype is JType.DOUBLE:
        assert isinstance(const, float)
        x, negative = _parse_double(s)
        return _double_against(None, x, negative, const), _IsNull(x)
    v = _parse_integral(s, jtype)
    return _Binary("=", v, _number(const)), _IsNull(v)


def _compare_string_constant(op: CmpOp, s: _X, const: object) -> _Val:
    """``property <op> constant``."""
    if const is None:
        return _Const(None)  # NULL whether or not the property is
    jtype = javalang.java_type(const)
    if jtype is JType.DOUBLE:
        assert isinstance(const, float)
        x, negative = _parse_double(s)
        test = _double_against(op, x, negative, const)
        failed: _X = _IsNull(x)
    elif jtype in (JType.INTEGER, JType.LONG):
        v = _parse_integral(s, jtype)
        test = _Binary(_SQL_OP[op], v, _number(const))
        failed = _IsNull(v)
    else:  # the parser only lets numbers be ordered
        raise UnsupportedFilterError(f"ordering a property against {const!r}", backend=BACKEND)
    return _leaf([(_IsNull(s), _N), (failed, _E)], test, test)


def _compare_strings(op: CmpOp, left: _X, right: _X) -> _Val:
    """``property <op> property``: both parsed as doubles, either failing throws."""
    lx, l_negative = _parse_double(left)
    rx, r_negative = _parse_double(right)
    test = _double_between(op, lx, l_negative, rx, r_negative)
    return _leaf(
        [
            (_Junction("OR", (_IsNull(left), _IsNull(right))), _N),
            (_Junction("OR", (_IsNull(lx), _IsNull(rx))), _E),
        ],
        test,
        test,
    )


# ------------------------------------------------------------------------------------- entry points


def _property_columns(properties: object, columns: Mapping[str, object] | None) -> Callable[[str], _X]:
    base = _Ref(properties)
    overrides = {}
    for name, column in (columns or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"columns keys are property names (str), got {type(name).__name__}")
        overrides[name] = _Ref(column)

    def property_column(name: str) -> _X:
        override = overrides.get(name)
        return override if override is not None else _Item(base, name)

    return property_column


def _translate(compiled: FilterSpec, property_column: Callable[[str], _X]) -> _X:
    if compiled.tree is None:
        tag_filter = compiled.tag_filter
        assert tag_filter is not None
        if tag_filter.sub_all:
            return _TRUE
        tags = tuple(sorted(_user_string(t, "tag") for t in tag_filter.tags))
        if not tags:
            return _FALSE
        return _Call("coalesce", (_In(property_column(TAGS_PROPERTY), tags), _FALSE))
    # the context of every level is worked out recursively
    needed = compiled.tree.depth * 8 + 1000
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)
    assert compiled.bound is not None
    expr = SparkSqlTranslator(property_column, compiled.bound).translate(compiled.tree)
    depth = _depth(expr)
    if depth > MAX_NESTING:
        raise UnsupportedFilterError(
            f"the Spark expression of this filter nests {depth} levels deep, more than Spark handles "
            f"({MAX_NESTING}; its parser and analyzer overflow their stacks)",
            backend=BACKEND,
        )
    return expr


def to_spark_column(
    compiled: FilterSpec,
    properties: str | Column = "properties",
    *,
    columns: Mapping[str, str | Column] | None = None,
) -> Column:
    """The filter as a boolean Column: TRUE exactly where ``compiled.matches`` is True, else FALSE.

    ``properties`` is the ``map<string,string>`` column of message properties (a name or a Column);
    ``columns`` maps property names to top-level string columns that hold them instead (e.g.
    ``{"TAGS": "tag"}``). Raises :class:`~siftmq.errors.UnsupportedFilterError` for a filter that
    cannot be expressed exactly, or nests deeper than ``MAX_NESTING``.
    """
    return _column_tree(_translate(compiled, _property_columns(properties, columns)))


def to_spark_sql(
    compiled: FilterSpec,
    properties: str = "properties",
    *,
    columns: Mapping[str, str] | None = None,
) -> str:
    """:func:`to_spark_column` as Spark SQL text (for ``DataFrame.filter`` or ``selectExpr``).

    Column names are quoted as single identifiers, string literals so that no text in them can
    change the structure of the query.
    """
    if not isinstance(properties, str):
        raise TypeError(f"properties must be a column name, got {type(properties).__name__}")
    for name, column in (columns or {}).items():
        if not isinstance(column, str):
            raise TypeError(f"columns[{name!r}] must be a column name, got {type(column).__name__}")
    return _walk(_translate(compiled, _property_columns(properties, columns)), _sql_node)
