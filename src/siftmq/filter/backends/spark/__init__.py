"""Spark backend: a compiled TAG or SQL92 filter as one Spark SQL boolean expression.

:func:`to_spark_column` gives a :class:`pyspark.sql.Column`, :func:`to_spark_sql` the same predicate
as Spark SQL text. Messages are rows; their properties are a ``map<string,string>`` column (the tag
is its ``TAGS`` key), and ``columns`` can name top-level string columns that hold some properties
instead. The predicate is TRUE exactly where :meth:`CompiledFilter.matches` is True and FALSE on
every other row: never NULL, and never an error under Spark's ANSI mode, whatever the values.

**Values.** Every property is a string or missing, so each sub-expression's kind is known before a
row is read: a property is a nullable string column, a sub-tree without properties is a constant
(folded here with RocketMQ's semantics), and everything else is a predicate.

**Errors.** Where RocketMQ throws (``a > 3`` with a="x"), the exception propagates: AND skips its
right side after FALSE, OR after TRUE, ``>`` skips its right side after a NULL left, and nothing
else catches. An error is not NULL — ``NOT (a > 3 AND b = 'y')`` with a="x", b="z" is an error,
though ``NOT (NULL AND FALSE)`` is TRUE — so a predicate has four outcomes, FALSE, NULL, TRUE and
ERROR. Spark has three, so the translation reasons about each predicate's *context*: which of its
outcomes its ancestors can still tell apart on the way to the only question that matters at the
top (TRUE or not). Where ERROR and NULL cannot be told apart (``a > 3`` at the top, or as any
operand of a top-level AND), the predicate is plain three-valued Spark SQL and a parse failure is
NULL. Elsewhere it is an integer code (1 FALSE, 2 NULL, 3 TRUE, 4 ERROR) and its parent looks the
result up in a small table (``element_at(array(...), code)``) computed here by running RocketMQ's
semantics on one representative value per outcome, so every operand is referenced once and the
expression grows linearly with the filter.

**Conversions.** A string meets a number as RocketMQ converts it, never with Spark's casts alone:
``Integer.valueOf``/``Long.valueOf`` is a regex (sign and decimal digits, any Unicode decimal digit
of the BMP, no whitespace) then ``try_cast`` (out of range is NULL, hence an error); ``Double.valueOf``
trims characters up to U+0020, checks Java's grammar (``NaN``, ``Infinity``, ``1.5d``, hex floats;
not ``inf``) and then ``try_cast``. Doubles compare as ``Double.compare``: Spark already orders NaN
above everything and equal to itself; -0.0 < 0.0 is decided from the sign of the text.

**Text.** Identifiers are quoted with backticks (doubled inside); string literals are quoted plainly
only when they hold no quote, backslash or non-printable character, and otherwise written as
``decode(X'<utf-8 hex>', 'UTF-8')`` — whatever a user's literal holds, it cannot change the structure
of the query, and the text does not depend on ``spark.sql.parser.escapedStringLiterals``.

Refused with :class:`~siftmq.errors.UnsupportedFilterError`: a string literal or tag holding a lone
surrogate (no Spark string can hold one), and a filter whose translation nests deeper than Spark's
parser and analyzer go (``MAX_NESTING`` levels, about 60 levels of NOT and AND over comparisons
that can fail; RocketMQ allows 512).

**Modules.** :mod:`.expressions` (the expression tree), :mod:`.render` (SQL text and Columns),
:mod:`.conversions` (Java conversions as Spark expressions), :mod:`.outcomes` (semantics, contexts
and lookup tables), :mod:`.translator` (the visitor and the entry points re-exported here).
"""

from siftmq.filter.backends.spark.expressions import MAX_NESTING
from siftmq.filter.backends.spark.translator import SparkSqlTranslator, to_spark_column, to_spark_sql

__all__ = ["MAX_NESTING", "SparkSqlTranslator", "to_spark_column", "to_spark_sql"]
