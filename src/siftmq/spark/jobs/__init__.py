"""Bulk Spark jobs over a broker's store, reading its CommitLog segment files directly.

* :mod:`~siftmq.spark.jobs.common`: the CommitLog as a DataFrame (a Python data source over the
  byte ranges of :mod:`siftmq.store.bulk`), store checks, progress tracking, error summaries.
* :mod:`~siftmq.spark.jobs.scan`: the messages of a topic matching a TAG or SQL92 filter, to Parquet.
* :mod:`~siftmq.spark.jobs.stats`: per subscription of a topic, what a broker-side filter matches and
  saves, in one pass.

``scan`` and ``stats`` only read: they may run while a broker has the store open, and then see the
records complete when the job planned its ranges. Importing these modules imports pyspark.
"""
