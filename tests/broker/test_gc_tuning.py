"""siftmq's own server processes (the broker, its front-ends) collect garbage less often; an embedded
broker leaves the host's GC alone."""

from __future__ import annotations

import subprocess
import sys


def test_a_server_process_raises_the_young_threshold_and_freezes_startup_objects() -> None:
    code = (
        "import gc; from siftmq.process_tuning import tune_gc; before = gc.get_threshold(); tune_gc(); "
        "after = gc.get_threshold(); "
        "print(before[0], after[0], after[1:] == before[1:], gc.get_freeze_count() > 0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["700", "20000", "True", "True"]


def test_serving_in_process_does_not_touch_the_gc() -> None:
    code = (
        "import asyncio, gc, tempfile, pathlib\n"
        "from siftmq.broker.config import BrokerConfig\n"
        "from siftmq.server import app\n"
        "before = gc.get_threshold()\n"
        "data = pathlib.Path(tempfile.mkdtemp())\n"
        "cfg = BrokerConfig(data_dir=data, listen='127.0.0.1:0', admin_listen='')\n"
        "async def main():\n"
        "    task = asyncio.create_task(app.serve(cfg, ready=lambda host, port: task.cancel()))\n"
        "    try:\n"
        "        await task\n"
        "    except asyncio.CancelledError:\n"
        "        pass\n"
        "asyncio.run(main())\n"
        "print(gc.get_threshold() == before, gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split()[-2:] == ["True", "0"]
