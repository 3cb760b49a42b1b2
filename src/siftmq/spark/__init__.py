"""siftmq on Apache Spark: the ``siftmq`` data source and the bulk jobs over the store.

Needs the ``spark`` extra (``pip install 'siftmq[spark]'``) and Java 17+. Importing this package
does not start Spark; :func:`siftmq.spark.session.build_session` does.
"""
