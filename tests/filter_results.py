"""What every backend decides for one filter text on a set of rows, and (run as a script) the same
computed for each text in a process that has computed nothing else.

Run as ``python filter_results.py < request.json``: the request is ``{"texts": [...], "rows": [...]}``;
the script imports the backends once, then forks a child per text, so each child starts from caches
that hold nothing of another text, and prints one JSON object per text, in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from siftmq.filter import FilterError, FilterEvaluationError, compile_filter

OUTCOME = {True: "T", False: "F", None: "N"}


def results_of(text: str, rows: Sequence[Mapping[str, str | None]], props: Sequence[str]) -> dict[str, Any]:
    """``scalar``: T/F/N/E per row from ``evaluate``; ``arrow``: 1/0 per row from ``matches_batch``;
    ``spark``: a digest of the Spark SQL text (or the error a backend raised)."""
    from siftmq.filter.backends.spark import to_spark_sql

    try:
        compiled = compile_filter("SQL92", text)
    except FilterError as exc:
        return {"compile": f"{type(exc).__name__}: {exc.message}"}
    scalar = []
    for row in rows:
        try:
            scalar.append(OUTCOME[compiled.evaluate(row)])
        except FilterEvaluationError:
            scalar.append("E")
    table = pa.table({p: pa.array([row.get(p) for row in rows], type=pa.string()) for p in props})
    arrow = "".join("1" if hit else "0" for hit in compiled.matches_batch(table))
    try:
        spark = hashlib.sha256(to_spark_sql(compiled, "props").encode("utf-8", "surrogatepass")).hexdigest()
    except FilterError as exc:
        spark = f"{type(exc).__name__}: {exc.message}"
    return {"scalar": "".join(scalar), "arrow": arrow, "spark": spark}


def _fresh(request: dict[str, Any]) -> None:
    # imported before forking, so no child pays for it
    import siftmq.filter.backends.arrow
    import siftmq.filter.backends.spark  # noqa: F401

    rows, props = request["rows"], request["props"]
    for text in request["texts"]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            code = 0
            try:
                os.write(write, json.dumps(results_of(text, rows, props)).encode())
            except BaseException:
                traceback.print_exc()  # the parent stops, naming the text
                code = 1
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"the child computing {text!r} failed (status {status})")
        sys.stdout.write(answer.decode() + "\n")


if __name__ == "__main__":
    _fresh(json.load(sys.stdin))
