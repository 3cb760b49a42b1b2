"""SQL92 filter lexer: RocketMQ's token rules, lexed lazily.

RocketMQ's JavaCC token manager produces tokens on demand, so a character that cannot start a
token is only an error when the parser asks for it. :class:`Lexer` keeps that behaviour: it hands
out one token at a time, and an unlexable position becomes an ``ERROR`` token that the parser turns
into a :class:`~siftmq.errors.FilterSyntaxError` when it looks at it.

Rules (RocketMQ 5's ``SelectorParser`` grammar, as its JavaCC token manager lexes):

* whitespace is space, tab, LF, CR, FF; ``/* ... */`` is skipped; ``-- ...`` is a comment only when
  a CR or LF ends it (otherwise it lexes as two minus signs);
* keywords are case-insensitive whole words; identifiers are ``[A-Za-z_$][A-Za-z0-9_$]*``;
* strings are single-quoted with ``''`` for a quote and no backslash escapes;
* integers are ``0`` or ``[1-9][0-9]*`` with an optional ``l``/``L``; floats are
  ``d+.d*[e..]``, ``.d+[e..]`` or ``d+e[+-]d+``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final


class TokenType(enum.Enum):
    IDENTIFIER = "identifier"
    STRING = "string literal"
    INTEGER = "integer literal"
    FLOAT = "float literal"
    # keywords
    NOT = "NOT"
    AND = "AND"
    OR = "OR"
    BETWEEN = "BETWEEN"
    IN = "IN"
    TRUE = "TRUE"
    FALSE = "FALSE"
    NULL = "NULL"
    IS = "IS"
    CONTAINS = "CONTAINS"
    STARTSWITH = "STARTSWITH"
    ENDSWITH = "ENDSWITH"
    # punctuation
    EQ = "="
    NE = "<>"
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    LPAREN = "("
    RPAREN = ")"
    COMMA = ","
    PLUS = "+"
    MINUS = "-"
    EOF = "end of input"
    ERROR = "lexical error"


KEYWORDS: Final[dict[str, TokenType]] = {
    t.value: t
    for t in (
        TokenType.NOT,
        TokenType.AND,
        TokenType.OR,
        TokenType.BETWEEN,
        TokenType.IN,
        TokenType.TRUE,
        TokenType.FALSE,
        TokenType.NULL,
        TokenType.IS,
        TokenType.CONTAINS,
        TokenType.STARTSWITH,
        TokenType.ENDSWITH,
    )
}

_PUNCTUATION: Final[dict[str, TokenType]] = {
    "=": TokenType.EQ,
    "<>": TokenType.NE,
    ">": TokenType.GT,
    ">=": TokenType.GE,
    "<": TokenType.LT,
    "<=": TokenType.LE,
    "(": TokenType.LPAREN,
    ")": TokenType.RPAREN,
    ",": TokenType.COMMA,
    "+": TokenType.PLUS,
    "-": TokenType.MINUS,
}


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its type, its exact text and its [start, end) character offsets."""

    type: TokenType
    text: str
    start: int
    end: int
    error: str | None = None  # the description, for ERROR tokens

    def describe(self) -> str:
        if self.type is TokenType.EOF:
            return "end of input"
        if self.type is TokenType.STRING:
            return "string literal " + _clip(self.text)
        if self.type in (TokenType.IDENTIFIER, TokenType.INTEGER, TokenType.FLOAT):
            return f"{self.type.value} '{_clip(self.text)}'"
        return f"'{self.text}'"


def _clip(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# Skipped input: whitespace, block comments, line comments that a newline ends.
_SKIP: Final = re.compile(r"(?:[ \t\n\r\f]+|/\*.*?\*/|--[^\n\r]*(?:\r\n|\r|\n))+", re.DOTALL)
# One token. Order matters where prefixes overlap: floats before integers, two-char operators first.
_TOKEN: Final = re.compile(
    r"""
    (?P<float>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)
  | (?P<integer>[1-9][0-9]*[lL]?|0)
  | (?P<identifier>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<string>'[^']*(?:''[^']*)*')
  | (?P<punct><>|<=|>=|[=<>(),+\-])
    """,
    re.VERBOSE,
)


class Lexer:
    """Hands out the tokens of ``text`` one at a time (``next_token``)."""

    __slots__ = ("_pos", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._pos = 0

    def next_token(self) -> Token:
        text = self._text
        pos = self._pos
        skip = _SKIP.match(text, pos)
        if skip is not None:
            pos = skip.end()
        if pos >= len(text):
            self._pos = pos
            return Token(TokenType.EOF, "", pos, pos)
        m = _TOKEN.match(text, pos)
        if m is None:
            return self._error(pos)
        kind = m.lastgroup
        end = m.end()
        value = m.group()
        self._pos = end
        if kind == "identifier":
            keyword = KEYWORDS.get(value.upper())
            return Token(keyword or TokenType.IDENTIFIER, value, pos, end)
        if kind == "integer":
            return Token(TokenType.INTEGER, value, pos, end)
        if kind == "float":
            return Token(TokenType.FLOAT, value, pos, end)
        if kind == "string":
            return Token(TokenType.STRING, value, pos, end)
        return Token(_PUNCTUATION[value], value, pos, end)

    def _error(self, pos: int) -> Token:
        text = self._text
        ch = text[pos]
        if text.startswith("/*", pos):
            desc = "unterminated comment '/*'"
            end = len(text)
        elif ch == "'":
            desc = "unterminated string literal"
            end = len(text)
        elif ch == '"':
            desc = "unexpected '\"': string literals use single quotes"
            end = pos + 1
        elif text.startswith("!=", pos):
            desc = "unexpected '!=': use '<>' for not-equal"
            end = pos + 2
        elif text.startswith("&&", pos) or text.startswith("||", pos):
            op = text[pos : pos + 2]
            desc = f"unexpected '{op}': use {'AND' if op == '&&' else 'OR'}"
            end = pos + 2
        elif ch.isspace():
            desc = (
                f"unexpected whitespace character U+{ord(ch):04X}: "
                "only space, tab, CR, LF and FF separate tokens"
            )
            end = pos + 1
        elif ord(ch) > 0x7F and (ch.isalpha() or ch.isdigit()):
            desc = f"unexpected character {ch!r} (U+{ord(ch):04X}): property names are ASCII only"
            end = pos + 1
        else:
            desc = f"unexpected character {ch!r}"
            end = pos + 1
        # an error token does not advance: asking again gives the same error
        return Token(TokenType.ERROR, text[pos:end], pos, end, error=desc)
