"""``python -m siftmq`` is the ``siftmq`` command."""

from siftmq.cli import main

main()
