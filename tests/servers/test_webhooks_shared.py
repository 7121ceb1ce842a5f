"""Webhooks in the shared mode: deliveries recorded in a real redis-server, sent by whichever
runtime holds the `webhooks` lease, and a delivery pending when one runtime goes is sent by the next
(verified by a receiver with the `openai` SDK). The embedded mode's end to end: tests/servers/test_webhooks.py."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gateway.config.schema import Config, parse_config
from gateway.domain import BatchStatus
from gateway.runtime.runtime import open_shared
from gateway.store.records import BatchRecord
from gateway.store.webhook_deliveries import DELIVERED, PENDING
from tests.fakes.webhook_receiver import Receiver
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer
from tests.support.waiting import eventually_async

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

SECRET = "whsec_" + base64.b64encode(b"shared-mode-secret-of-32-bytes!!").decode()


@pytest.fixture()
def redis_url() -> Iterator[str]:
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.close()


def _config(receiver: Receiver) -> Config:
    return parse_config({
        "model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "sk-x",
                                                               "api_base": "http://127.0.0.1:9/v1"}}],
        "batch_settings": {
            "teams": [{"team_id": "t", "api_keys": ["sk-t-0123456789"], "webhook_url": receiver.url,
                       "webhook_secret": "os.environ/SHARED_WEBHOOK_SECRET"},
                      {"team_id": "u", "api_keys": ["sk-u-0123456789"]}],
            "webhooks": {"retry_delays_seconds": [0.2], "give_up_after_seconds": 600, "timeout_seconds": 2},
        },
    })


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 20) -> None:
    await eventually_async(check, timeout, "the delivery", interval=0.1)


async def test_a_pending_delivery_in_redis_is_sent_by_the_next_runtime(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARED_WEBHOOK_SECRET", SECRET)
    receiver = Receiver(SECRET)  # down at first
    config = _config(receiver)
    now = int(time.time())
    batch = BatchRecord(id="batch_shared1", owner="t", endpoint="/v1/chat/completions", input_file_id="file-in",
                        completion_window="24h", status=BatchStatus.FINALIZING, created_at=now, expires_at=now + 60)
    first = await open_shared(config, redis_url, tmp_path / "blobs", routes=())
    try:
        await first.store.batches.put(batch)
        await first.webhooks.announce("t", batch.id, BatchStatus.COMPLETED)  # recorded before the status is set
        await first.webhooks.announce("u", "batch_other", BatchStatus.COMPLETED)  # team u has no webhook
        await first.webhooks.pass_once()
        await asyncio.sleep(0.5)
        [waiting] = await first.store.webhooks.recent(None, 10)
        assert (waiting.state, waiting.attempts) == (PENDING, 0)  # the batch is not finished yet: not sent
        await first.store.batches.update(batch.id, {"status": BatchStatus.COMPLETED, "completed_at": now})

        async def attempted() -> bool:
            await first.webhooks.pass_once()
            [d] = await first.store.webhooks.recent("t", 1)
            return d.attempts >= 1

        await _until(attempted)
        [failed_once] = await first.store.webhooks.recent("t", 1)
        assert failed_once.state == PENDING and failed_once.last_status is None and failed_once.last_error
    finally:
        await first.aclose()

    receiver.start()
    again = await open_shared(config, redis_url, tmp_path / "blobs", routes=())
    try:
        async def delivered() -> bool:
            await again.webhooks.pass_once()
            [d] = await again.store.webhooks.recent("t", 1)
            return d.state == DELIVERED

        await _until(delivered)
        assert [(e.type, e.data.id) for e in receiver.events] == [("batch.completed", batch.id)]
        assert await again.store.webhooks.recent("u", 10) == []
    finally:
        await again.aclose()
        receiver.stop()
