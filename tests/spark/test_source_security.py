"""The Spark source and sink against a broker with authentication on: they sign with the
``accessKey``/``secretKey`` options, and without them the broker's refusal reaches the user."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from siftmq.client import Producer

SECRET = "Sp4rk-s3cret"


@pytest.fixture
def secured(start_broker: Any, tmp_path: Path) -> Any:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"users": [{"username": "etl", "password": SECRET, "userType": "Super"}]}))
    return start_broker("data", config={"authentication_enabled": True, "auth_file": str(auth)})


def test_read_and_write_sign_their_calls(spark: Any, secured: Any) -> None:
    async def produce() -> None:
        async with Producer(secured.endpoint, access_key="etl", secret_key=SECRET) as producer:
            await producer.send_many(
                [producer.message("Secured", f"m{i}".encode(), tag="t") for i in range(30)]
            )

    asyncio.run(produce())

    def reader(**extra: str) -> Any:
        r = spark.read.format("siftmq").option("endpoints", secured.endpoint).option("topic", "Secured")
        for key, value in extra.items():
            r = r.option(key, value)
        return r.load()

    assert reader(accessKey="etl", secretKey=SECRET).count() == 30
    with pytest.raises(Exception, match="UNAUTHORIZED"):
        reader().count()
    with pytest.raises(Exception, match="accessKey and secretKey go together"):
        reader(accessKey="etl").count()
    rows = spark.createDataFrame([(b"from spark",)], "body binary")
    rows.write.format("siftmq").option("endpoints", secured.endpoint).option("topic", "Written").option(
        "accessKey", "etl"
    ).option("secretKey", SECRET).mode("append").save()
    written = (
        spark.read.format("siftmq")
        .options(endpoints=secured.endpoint, topic="Written", accessKey="etl", secretKey=SECRET)
        .load()
    )
    assert [r.body for r in written.collect()] == [b"from spark"]
    assert SECRET not in secured.log()
