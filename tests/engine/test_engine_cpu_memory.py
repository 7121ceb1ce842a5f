"""The CPU engine starts with the defaults (`local_engine.cpu_memory`), and one that cannot start says vLLM's
own reason (`local_engine.root_cause`), not "See root cause above".

Both engines here start as a user's command starts them: no `VLLM_CPU_KVCACHE_SPACE`, no
`VLLM_ENABLE_V1_MULTIPROCESSING` (the engine core in its own, forked, process)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psutil
import pytest

from gateway.domain import BatchRequest, Endpoint
from local_engine import LocalEngineBackend, TinyModels
from local_engine.backend import EngineStartError
from local_engine.cpu_memory import AVAILABLE_SHARE, MIB, kv_cache_bytes, per_token_bytes
from local_engine.cpu_threads import MULTIPROCESSING_ENV
from tests.support.engine_helpers import ENGINE_MARKS, built_tiny_models

pytestmark = ENGINE_MARKS
ASYNC = pytest.mark.asyncio(loop_scope="module")

ARGS = {"served_model_name": ["tiny"], "max_model_len": 256, "dtype": "float32", "enforce_eager": True,
        "max_num_seqs": 16}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return built_tiny_models(tmp_path_factory)


@pytest.fixture
def defaults() -> Iterator[None]:
    """The environment of a user who set none of vLLM's CPU variables."""
    saved = {name: os.environ.pop(name, None) for name in ("VLLM_CPU_KVCACHE_SPACE", MULTIPROCESSING_ENV)}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is not None:
                os.environ[name] = value


def test_the_rule() -> None:
    gib = 1024 * MIB
    assert kv_cache_bytes(2048, 512, 64, 16, 16 * gib) == 64 * MIB  # all the engine can use: well within 4 GiB
    assert kv_cache_bytes(128 * 1024, 8192, 256, 16, 16 * gib) == 4 * gib  # a quarter of what is available
    assert kv_cache_bytes(128 * 1024, 8192, 256, 16, 1 * gib) == (8192 + 16) * 128 * 1024  # one sequence at least
    assert kv_cache_bytes(None, 512, 64, 16, 16 * gib) == 1024 * MIB  # an unknown shape: the fallback
    assert kv_cache_bytes(None, 512, 64, 16, 2 * gib) == 512 * MIB


@ASYNC
async def test_a_tiny_model_starts_with_no_setting_and_its_cache_follows_the_rule(
        tiny_models: TinyModels, defaults: None) -> None:
    backend = LocalEngineBackend({"model": tiny_models.llama, **ARGS})
    try:
        await backend.start()
        assert backend._engine is not None
        config = backend._engine.vllm_config
        per_token = per_token_bytes(config)
        assert per_token is not None and per_token > 0
        size = config.cache_config.kv_cache_memory_bytes
        bound = psutil.virtual_memory().total // AVAILABLE_SHARE
        assert size is not None and per_token * (256 + 16) <= size <= max(per_token * 256 * 16, MIB) + MIB
        assert size <= bound
        req = BatchRequest(line=1, custom_id="a", url=Endpoint.CHAT,
                           body={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        results = [r async for r in backend.execute([req])]
        assert [r.status_code for r in results] == [200]
    finally:
        await backend.aclose()


@ASYNC
@pytest.mark.parametrize("vllm_logging", ["1", "0"])  # "0": as `batchyard run` sets it, records to our root logger
async def test_an_engine_that_cannot_start_says_vllms_reason(tiny_models: TinyModels, defaults: None,
                                                              vllm_logging: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", vllm_logging)
    too_much = 64 * psutil.virtual_memory().total  # the operator's own size, more than the machine has
    backend = LocalEngineBackend({"model": tiny_models.llama, **ARGS, "kv_cache_memory_bytes": too_much})
    try:
        with pytest.raises(EngineStartError) as failed:
            await backend.start()
    finally:
        await backend.aclose()
    said = str(failed.value)
    assert "root cause above" not in said, said
    assert "ValueError" in said and "Available memory" in said and "kv" in said, said
