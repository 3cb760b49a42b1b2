"""Regenerate the protobuf modules of ``siftmq.protocol`` from its ``.proto`` files.

Run ``python -m siftmq.protocol.generate`` (needs the dev extra: grpcio-tools). The generated
``*_pb2.py`` and ``.pyi`` modules are committed, so running the broker never needs grpcio-tools;
a test checks that the committed files match a fresh generation.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTOS = ("siftmq/protocol/rocketmq_v2.proto", "siftmq/protocol/siftmq_batch.proto")


def source_root() -> Path:
    """The directory that holds the ``siftmq`` package (the proto include root)."""
    return Path(__file__).resolve().parents[2]


def generate(out_dir: Path) -> None:
    """Write ``siftmq/protocol/<name>_pb2.py(i)`` for every proto under ``out_dir``."""
    from grpc_tools import protoc  # dev-only dependency

    root = source_root()
    args = [
        "protoc",
        f"-I{root}",
        f"-I{_well_known_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(root / proto) for proto in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(PROTOS)}")


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def main() -> int:
    generate(source_root())
    print(f"generated from {', '.join(PROTOS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
