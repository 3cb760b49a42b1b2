"""Start a throw-away ``siftmq broker`` subprocess for a demo (port 0, temporary data directory)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def embedded_broker(settings: dict[str, object] | None = None) -> Iterator[str]:
    """Yield the endpoint of a fresh broker; it is stopped (SIGTERM) and its data removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="siftmq-demo-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "siftmq",
            "broker",
            "--data-dir",
            str(Path(tmp) / "data"),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "",
        ]
        if settings:
            config = Path(tmp) / "siftmq.toml"
            config.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in settings.items()))
            cmd += ["--config", str(config)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            endpoint = ""
            for line in proc.stdout:
                if "ready on" in line:
                    endpoint = line.split("ready on ", 1)[1].split()[0]
                    break
            if not endpoint:
                raise RuntimeError("the embedded broker did not start")
            yield endpoint
        finally:
            proc.terminate()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()


def toml_value(value: object) -> str:
    """A Python value as a TOML value (bool, str, number, list)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)
