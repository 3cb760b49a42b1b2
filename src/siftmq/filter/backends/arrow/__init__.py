"""Vectorized backend: evaluates a compiled filter over a whole batch with pyarrow compute and numpy.

In a batch every property is a string or absent (what a broker sees), so the type of every
sub-expression is known before looking at a row: a property is a String column, a predicate a
boolean column, a literal (or any sub-tree without properties) a constant. The Java coercions of
RocketMQ's evaluator become column kernels:

* ``Integer.valueOf``/``Long.valueOf`` — Arrow's cast when it accepts the whole column (its
  ``0x`` hex, which Java rejects, found by a byte scan and decided exactly), else an ASCII regex
  check plus a cast; rows with non-ASCII text (Unicode digits, which Java accepts) or more than 18
  digits are decided exactly, one by one, by :mod:`siftmq.filter.javalang`;
* ``Double.valueOf`` — Java's trim, its grammar as a regex, a cast (hex floats decided one by one);
  ``Double.compare`` order (NaN above all, -0.0 < 0.0) through total-order integer keys;
* ``Boolean.valueOf`` — ASCII lower-case equals ``true``;
* String equality and ``IN`` with constants — one or two 64-bit word compares per row on Arrow's
  string-view layout (:mod:`._string_views`).

Four-valued logic per row: TRUE, FALSE, NULL, or *error* (RocketMQ threw). Errors propagate exactly
as exceptions do in RocketMQ's evaluator: AND skips its right side after a FALSE, OR after a TRUE,
relational operators skip their right side after a NULL left, IS NULL does not catch. A row matches
only when the result is TRUE with no error.

Work is shared and skipped where the result cannot change:

* each column's parses and string views are computed once per batch, whichever nodes use them;
* sub-trees without properties are evaluated once per filter by the scalar backend;
* a boolean sub-tree that reads a single dictionary-encoded column is evaluated once per distinct
  value and mapped to the rows by the dictionary indices (exact: a row's result depends only on
  its value). A plain column of low cardinality is dictionary-encoded for this when the sub-tree
  is costly or parses the column as numbers (which would encode it anyway).

A filter this backend cannot express exactly (a pattern with a lone surrogate) raises
:class:`~siftmq.errors.UnsupportedFilterError`; ``matches`` then falls back to the scalar evaluator
for that batch.

**Modules.** :mod:`.kernels` (thresholds and the Java conversions as column kernels),
:mod:`._string_views` (word compares on Arrow's string-view layout), :mod:`.columns` (each
column's per-batch cache), :mod:`.plan` (per-row values, the per-filter plan), :mod:`.evaluator`
(the visitor over one batch), :mod:`.batch` (:class:`ArrowEvaluator`, re-exported here).
"""

from siftmq.filter.backends.arrow.batch import ArrowEvaluator
from siftmq.filter.backends.arrow.kernels import (
    DICTIONARY_MAX_RATIO,
    DICTIONARY_MIN_ROWS,
    DICTIONARY_SAMPLE,
    ENCODE_MIN_COST,
    VIEW_IN_MAX,
    Mask,
)

__all__ = [
    "DICTIONARY_MAX_RATIO",
    "DICTIONARY_MIN_ROWS",
    "DICTIONARY_SAMPLE",
    "ENCODE_MIN_COST",
    "VIEW_IN_MAX",
    "ArrowEvaluator",
    "Mask",
]
