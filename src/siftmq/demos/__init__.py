"""Runnable demos of the seeds' scenarios (``siftmq demo ...``), built on ``siftmq.client``."""
