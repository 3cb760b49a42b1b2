"""SQL92 filter parser: RocketMQ's grammar, precedence and compile-time checks.

Precedence climbing over the lazily lexed tokens. From tightest to loosest: unary ``+ - NOT``;
relational and string operators (``> >= < <=``, ``[NOT] BETWEEN``, ``[NOT] IN``,
``[NOT] CONTAINS|STARTSWITH|ENDSWITH``); equality (``= <> IS [NOT] NULL``); ``AND``; ``OR``.
All binary levels are left-associative; the operands of relational operators and of BETWEEN are
unary expressions, as in RocketMQ's JavaCC grammar.

One deliberate difference from RocketMQ: input left over after a complete expression is a syntax
error whose ``start`` is the first ignored token (RocketMQ silently ignores it).

Bounds: the text is at most :data:`MAX_TEXT_LENGTH` characters, parentheses and prefix operators
nest at most :data:`MAX_DEPTH` deep, and the tree is at most :data:`MAX_TREE_DEPTH` levels deep
(room for every tree that nesting allows: each level of nesting may hold an operator node); beyond
that a :class:`~siftmq.errors.FilterLimitError` names the limit. The bound never depends on the
Python call stack: :func:`ensure_stack` raises the interpreter's recursion limit (never lowers it)
to what the deepest allowed tree needs, before any parsing or evaluation, on every path.
"""

from __future__ import annotations

import sys
from typing import Final

from siftmq.errors import FilterLimitError, FilterSyntaxError, FilterTypeError
from siftmq.filter import ast
from siftmq.filter.ast import CmpOp, Literal, MatchOp, Node, Property
from siftmq.filter.javalang import DOUBLE_MAX_VALUE, INT_MAX, LONG_MAX, JType
from siftmq.filter.lexer import Lexer, Token, TokenType

MAX_TEXT_LENGTH: Final = 64 * 1024
MAX_DEPTH: Final = 512
MAX_TREE_DEPTH: Final = 2 * MAX_DEPTH + 16
# Python frames the deepest allowed work takes: a parenthesis level costs about three parser
# frames, a tree level a few evaluator frames; plus the caller's own
STACK_NEEDED: Final = MAX_TREE_DEPTH * 4 + 1000


def ensure_stack() -> None:
    """Let the deepest filter the bounds allow be parsed and evaluated on any thread of this
    process, whatever ran before: a RecursionError must never decide what is accepted."""
    if sys.getrecursionlimit() < STACK_NEEDED:
        sys.setrecursionlimit(STACK_NEEDED)


ensure_stack()  # at import too, so no caller (a test runner among them) sees the limit move later


_T = TokenType
_RELATIONAL: Final = {_T.GT: CmpOp.GT, _T.GE: CmpOp.GE, _T.LT: CmpOp.LT, _T.LE: CmpOp.LE}
_MATCH: Final = {
    _T.CONTAINS: MatchOp.CONTAINS,
    _T.STARTSWITH: MatchOp.STARTSWITH,
    _T.ENDSWITH: MatchOp.ENDSWITH,
}
_NEGATABLE: Final = frozenset({_T.BETWEEN, _T.IN, _T.CONTAINS, _T.STARTSWITH, _T.ENDSWITH})
# binding power of the token that continues an expression after an operand
_PRECEDENCE: Final = {
    _T.OR: 1,
    _T.AND: 2,
    _T.EQ: 3,
    _T.NE: 3,
    _T.IS: 3,
    _T.GT: 4,
    _T.GE: 4,
    _T.LT: 4,
    _T.LE: 4,
    _T.BETWEEN: 4,
    _T.IN: 4,
    _T.CONTAINS: 4,
    _T.STARTSWITH: 4,
    _T.ENDSWITH: 4,
    _T.NOT: 4,
}


def parse(text: str) -> Node:
    """Parse and check ``text``; return the boolean expression tree or raise a ``FilterError``."""
    if not isinstance(text, str):
        raise TypeError(f"filter expression must be str, got {type(text).__name__}")
    if len(text) > MAX_TEXT_LENGTH:
        raise FilterLimitError(
            f"filter expression is {len(text)} characters long; the limit is {MAX_TEXT_LENGTH}",
            expression=text[:200] + "...",
        )
    ensure_stack()
    parser = _Parser(text)
    try:
        return parser.parse_top()
    except FilterTypeError as exc:
        if exc.expression is None:
            raise FilterTypeError(exc.description, expression=text, start=exc.start, end=exc.end) from None
        raise
    except RecursionError:  # a thread with a smaller C stack than the main one: say which limit
        raise FilterLimitError(
            f"filter expression nests too deeply to be parsed here (the limit is {MAX_DEPTH} levels)",
            expression=text[:200],
        ) from None


class _Parser:
    __slots__ = ("_buffer", "_depth", "_lexer", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._lexer = Lexer(text)
        self._buffer: list[Token] = []
        self._depth = 0

    # -------------------------------------------------------------------------------------- tokens

    def _peek(self, ahead: int = 0) -> Token:
        while len(self._buffer) <= ahead:
            self._buffer.append(self._lexer.next_token())
        return self._buffer[ahead]

    def _next(self) -> Token:
        tok = self._peek()
        if tok.type is _T.ERROR:
            raise self._lexical_error(tok)
        del self._buffer[0]
        return tok

    def _expect(self, kind: TokenType, what: str) -> Token:
        tok = self._peek()
        if tok.type is not kind:
            raise self._unexpected(tok, f"expected {what}")
        return self._next()

    def _lexical_error(self, tok: Token) -> FilterSyntaxError:
        return FilterSyntaxError(
            f"lexical error: {tok.error}", expression=self._text, start=tok.start, end=tok.end
        )

    def _unexpected(self, tok: Token, expected: str) -> FilterSyntaxError:
        if tok.type is _T.ERROR:
            return self._lexical_error(tok)
        return FilterSyntaxError(
            f"{expected}, got {tok.describe()}", expression=self._text, start=tok.start, end=tok.end
        )

    def _too_deep(self) -> FilterLimitError:
        return FilterLimitError(
            f"filter expression is nested more than {MAX_DEPTH} levels deep", expression=self._text[:200]
        )

    def _check_depth(self, node: Node) -> Node:
        if node.depth > MAX_TREE_DEPTH:
            raise FilterLimitError(
                f"filter expression tree is more than {MAX_TREE_DEPTH} levels deep",
                expression=self._text[:200],
            )
        return node

    # ------------------------------------------------------------------------------------- grammar

    def parse_top(self) -> Node:
        node = self._parse_expression(1)
        tok = self._peek()
        if tok.type is not _T.EOF:
            if tok.type is _T.ERROR:
                raise self._lexical_error(tok)
            hint = ""
            if tok.type is _T.MINUS and self._peek(1).type is _T.MINUS:
                hint = "; a '--' comment must end with a newline"
            raise FilterSyntaxError(
                f"unexpected {tok.describe()} after a complete expression{hint} "
                "(RocketMQ would silently ignore the rest of the input; siftmq rejects it)",
                expression=self._text,
                start=tok.start,
                end=tok.end,
            )
        return ast.as_boolean(node)

    def _parse_expression(self, min_prec: int) -> Node:
        left = self._parse_unary()
        while True:
            tok = self._peek()
            prec = _PRECEDENCE.get(tok.type)
            if prec is None or prec < min_prec:
                return left
            kind = tok.type
            if kind is _T.OR or kind is _T.AND:
                left = self._parse_chain(left, kind, prec)
                continue
            self._next()
            if kind is _T.EQ:
                left = ast.make_equal(left, self._parse_expression(4))
            elif kind is _T.NE:
                left = ast.make_not_equal(left, self._parse_expression(4))
            elif kind is _T.IS:
                negated = False
                if self._peek().type is _T.NOT:
                    self._next()
                    negated = True
                end = self._expect(_T.NULL, "NULL after IS" + (" NOT" if negated else "")).end
                left = ast.make_is_null(left, end, negated)
            elif kind in _RELATIONAL:
                left = ast.make_compare(_RELATIONAL[kind], left, self._parse_unary())
            else:
                negated = kind is _T.NOT
                if negated:
                    op_tok = self._peek()
                    if op_tok.type not in _NEGATABLE:
                        raise FilterSyntaxError(
                            "NOT after an operand must be followed by BETWEEN, IN, CONTAINS, STARTSWITH "
                            f"or ENDSWITH, got {op_tok.describe()}",
                            expression=self._text,
                            start=tok.start,
                            end=tok.end,
                        )
                    kind = self._next().type
                left = self._parse_negatable(kind, left, negated)
            self._check_depth(left)

    def _parse_chain(self, first: Node, kind: TokenType, prec: int) -> Node:
        operands = [first]
        while self._peek().type is kind:
            self._next()
            operands.append(self._parse_expression(prec + 1))
        node: Node = ast.make_or_n(operands) if kind is _T.OR else ast.make_and_n(operands)
        return self._check_depth(node)

    def _parse_negatable(self, kind: TokenType, left: Node, negated: bool) -> Node:
        if kind is _T.BETWEEN:
            low = self._parse_unary()
            self._expect(_T.AND, "AND between the BETWEEN bounds")
            high = self._parse_unary()
            return ast.make_between(left, low, high, negated)
        if kind is _T.IN:
            self._expect(_T.LPAREN, "'(' after IN")
            items = [self._string_literal("a string literal in the IN list")]
            while self._peek().type is _T.COMMA:
                self._next()
                items.append(self._string_literal("a string literal in the IN list"))
            end = self._expect(_T.RPAREN, "',' or ')' in the IN list").end
            return ast.make_in(left, tuple(items), negated, end)
        op = _MATCH[kind]
        tok = self._peek()
        pattern = self._string_literal(f"a string literal after {op.value}")
        return ast.make_match(op, left, pattern, negated, tok.end)

    def _string_literal(self, what: str) -> str:
        tok = self._peek()
        if tok.type is not _T.STRING:
            raise self._unexpected(tok, f"expected {what}")
        self._next()
        return tok.text[1:-1].replace("''", "'")

    def _parse_unary(self) -> Node:
        prefixes: list[Token] = []
        while self._peek().type in (_T.PLUS, _T.MINUS, _T.NOT):
            prefixes.append(self._next())
            if len(prefixes) + self._depth > MAX_DEPTH:
                raise self._too_deep()
        self._depth += len(prefixes)
        node = self._parse_primary()
        self._depth -= len(prefixes)
        for tok in reversed(prefixes):
            if tok.type is _T.MINUS:
                node = self._check_depth(ast.make_negate(node, tok.start))
            elif tok.type is _T.NOT:
                node = self._check_depth(ast.make_not(node, tok.start))
            # unary plus is a no-op: the operand stays what it is (a literal stays a constant)
        return node

    def _parse_primary(self) -> Node:
        tok = self._peek()
        kind = tok.type
        if kind is _T.LPAREN:
            self._next()
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise self._too_deep()
            node = self._parse_expression(1)
            self._expect(_T.RPAREN, "')'")
            self._depth -= 1
            return node
        if kind is _T.IDENTIFIER:
            self._next()
            return Property(tok.text, start=tok.start, end=tok.end)
        if kind is _T.STRING:
            self._next()
            return Literal(tok.text[1:-1].replace("''", "'"), JType.STRING, start=tok.start, end=tok.end)
        if kind is _T.INTEGER:
            self._next()
            return self._integer(tok)
        if kind is _T.FLOAT:
            self._next()
            return self._float(tok)
        if kind is _T.TRUE or kind is _T.FALSE:
            self._next()
            return Literal(kind is _T.TRUE, JType.BOOLEAN, start=tok.start, end=tok.end)
        if kind is _T.NULL:
            self._next()
            return Literal(None, None, start=tok.start, end=tok.end)
        raise self._unexpected(tok, "expected a property name, a literal or '('")

    def _integer(self, tok: Token) -> Literal:
        digits = tok.text.rstrip("lL")
        # int() refuses 4,300 digits and more: a literal longer than any long is out of range unread
        value = int(digits) if len(digits.lstrip("0")) <= len(str(LONG_MAX)) else LONG_MAX + 1
        if value > LONG_MAX:
            raise FilterSyntaxError(
                f"integer literal {digits} is out of the Long range (max {LONG_MAX})",
                expression=self._text,
                start=tok.start,
                end=tok.end,
            )
        jtype = JType.INTEGER if value <= INT_MAX else JType.LONG
        return Literal(value, jtype, start=tok.start, end=tok.end)

    def _float(self, tok: Token) -> Literal:
        text = tok.text
        value = float(text)
        if value > DOUBLE_MAX_VALUE:
            raise FilterSyntaxError(
                f"float literal {text} is greater than the largest Double {DOUBLE_MAX_VALUE!r}",
                expression=self._text,
                start=tok.start,
                end=tok.end,
            )
        mantissa = text.split("e")[0].split("E")[0]
        if value == 0.0 and mantissa.strip("0.") != "":
            raise FilterSyntaxError(
                f"float literal {text} underflows to zero (the smallest Double is 4.9E-324)",
                expression=self._text,
                start=tok.start,
                end=tok.end,
            )
        return Literal(value, JType.DOUBLE, start=tok.start, end=tok.end)
