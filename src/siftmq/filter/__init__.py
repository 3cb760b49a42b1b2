"""siftmq's filter engine: RocketMQ-exact TAG and SQL92 filters, bloom filter, vectorized evaluation.

Pure: importing it pulls in no asyncio, grpc, pyarrow or pyspark. The vectorized backend
(:mod:`siftmq.filter.backends.arrow`) loads pyarrow on first use.
"""

from siftmq.errors import (
    FilterError,
    FilterEvaluationError,
    FilterLimitError,
    FilterSyntaxError,
    FilterTypeError,
    UnsupportedFilterError,
)
from siftmq.filter.bloom import BloomFilter
from siftmq.filter.compiler import CompiledFilter, FilterKind, compile_filter
from siftmq.filter.tags import TagFilter, java_string_hash

__all__ = [
    "BloomFilter",
    "CompiledFilter",
    "FilterError",
    "FilterEvaluationError",
    "FilterKind",
    "FilterLimitError",
    "FilterSyntaxError",
    "FilterTypeError",
    "TagFilter",
    "UnsupportedFilterError",
    "compile_filter",
    "java_string_hash",
]
