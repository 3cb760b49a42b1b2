"""Regenerate the protobuf modules of ``siftmq.protocol`` from ``rocketmq_v2.proto``.

Run ``python -m siftmq.protocol.generate`` (needs the dev extra: grpcio-tools). The generated
``rocketmq_v2_pb2.py`` and ``.pyi`` are committed, so running the broker never needs grpcio-tools;
a test checks that the committed files match a fresh generation.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO = "siftmq/protocol/rocketmq_v2.proto"


def source_root() -> Path:
    """The directory that holds the ``siftmq`` package (the proto include root)."""
    return Path(__file__).resolve().parents[2]


def generate(out_dir: Path) -> None:
    """Write ``siftmq/protocol/rocketmq_v2_pb2.py(i)`` under ``out_dir``."""
    from grpc_tools import protoc  # dev-only dependency

    root = source_root()
    args = [
        "protoc",
        f"-I{root}",
        f"-I{_well_known_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(root / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def main() -> int:
    generate(source_root())
    print(f"generated from {PROTO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
