"""One place that builds a SparkSession the way siftmq needs it.

The settings are the ones that start and run fastest on a small machine (2 cores, local mode):
no UI, two shuffle partitions, the serial GC, Python filter pushdown on, the workers running this
interpreter, Spark's scratch space and warehouse under ``work_dir`` instead of the current directory.
The ``siftmq`` data source is registered on the session.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from siftmq.errors import ConfigError

DEFAULT_MASTER = "local[*]"


def _check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if home and not (Path(home) / "bin" / "java").exists():
        raise ConfigError(f"JAVA_HOME={home} has no bin/java; unset it or point it at a Java 17+ install")


def prepare_environment() -> None:
    """Environment a local Spark needs before its JVM starts (idempotent, keeps what the user set)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def build_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "siftmq",
    work_dir: Path | None = None,
    driver_memory: str = "1g",
    fast_start: bool = False,
    log_level: str = "ERROR",
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession for ``master`` with the ``siftmq`` data source registered.

    ``fast_start`` adds ``-XX:TieredStopAtLevel=1`` (C1 JIT only): about a second faster to start,
    slower on heavy jobs, so tests use it and benchmarks do not.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("PySpark is not installed: pip install 'siftmq[spark]'") from exc
    _check_java()
    prepare_environment()
    base = work_dir or Path(tempfile.gettempdir()) / "siftmq-spark"
    base.mkdir(parents=True, exist_ok=True)
    java_opts = "-XX:+UseSerialGC" + (" -XX:TieredStopAtLevel=1" if fast_start else "")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": java_opts,
        "spark.local.dir": str(base / "local"),
        "spark.sql.warehouse.dir": str(base / "warehouse"),
        "spark.sql.python.filterPushdown.enabled": "true",
        **(conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    register(session)
    return session


def register(session: Any) -> None:
    """Register the ``siftmq`` data source on ``session`` (a no-op until the source module exists)."""
    import importlib

    try:
        source = importlib.import_module("siftmq.spark.source")
    except ModuleNotFoundError:
        return
    session.dataSource.register(source.SiftmqDataSource)
