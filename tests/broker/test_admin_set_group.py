"""``PATCH /groups/{g}`` and ``siftmq admin set-group`` on a real broker: a change of nothing is
refused, and only a mode set on purpose creates a group.

Before, ``siftmq admin set-group NAME`` without options sent ``{"mode": null, "consistency": null}``,
which created and persisted the group, and exited 0.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration


def _set_group(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "siftmq", "admin", "set-group", *args, "--url", url]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)


def test_a_change_of_nothing_is_refused_and_creates_no_group(start_broker: Any) -> None:
    broker = start_broker()
    url = broker.admin_url
    with httpx.Client(base_url=url, timeout=10) as api:
        empty = api.patch("/groups/ghost", json={})
        assert empty.status_code == 400 and "nothing to change" in empty.json()["message"]
        nulls = api.patch("/groups/ghost", json={"mode": None, "consistency": None})
        assert nulls.status_code == 400
        unknown = api.patch("/groups/ghost", json={"consistency": "compat"})
        assert unknown.status_code == 404 and "unknown" in unknown.json()["message"]
        assert api.get("/groups/ghost").status_code == 404
        assert "ghost" not in [g["group"] for g in api.get("/groups").json()]

        cli = _set_group(url, "ghost")
        assert cli.returncode == 2 and "--mode" in cli.stderr + cli.stdout
        assert api.get("/groups/ghost").status_code == 404

        # a mode set on purpose makes the group (its members find it so); then a policy may change
        assert api.patch("/groups/planned", json={"mode": "broadcasting"}).status_code == 200
        assert _set_group(url, "planned", "--consistency", "compat").returncode == 0
        assert api.get("/groups/planned").json()["consistency"] == "compat"
    assert broker.stop() == 0
    assert "ghost" not in (broker.data_dir / "config" / "groups.json").read_text()
