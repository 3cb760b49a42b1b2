"""``python -m siftmq.cli`` is the ``siftmq`` command."""

from siftmq.cli import main

main()
