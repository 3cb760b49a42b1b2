"""The ``siftmq`` command line (:mod:`siftmq.cli.app` wires the command families together)."""


def main() -> None:
    """The ``siftmq`` entry point."""
    from siftmq.cli.app import main as run

    run()
