"""LocalEngineBackend on a real vLLM engine (CPU), with tiny random-weight models built locally.

One engine per model, one model per test class (class-scoped fixtures), so at
most one engine-core process runs at a time. `BATCHYARD_TINY_MODELS=DIR`
reuses (or builds once into) DIR instead of a fresh temp dir.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.backends.interface import Backend
from gateway.domain import BatchRequest, Endpoint, Result
from local_engine import EngineStartError, LocalEngineBackend, TinyModels, build_tiny_models
from tests.support.engine_helpers import built_tiny_models

pytestmark = [
    pytest.mark.engine,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (the engine extra) is not installed"),
]

# What this machine kind needs (see DESIGN.md, "Environment facts"); an explicit setting wins.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# bfloat16 (vLLM's CPU default) kills the engine core on the first forward pass of the tiny Llama here.
ENGINE_ARGS: dict[str, Any] = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
MESSAGES = [{"role": "user", "content": "Hello world!"}]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return built_tiny_models(tmp_path_factory)


async def _backend(path: Path, name: str, **kwargs: Any) -> LocalEngineBackend:
    backend = LocalEngineBackend({**ENGINE_ARGS, "model": path, "served_model_name": [name]}, **kwargs)
    await backend.start()
    return backend


async def collect(backend: LocalEngineBackend, requests: Sequence[BatchRequest]) -> dict[str, Result]:
    results = [r async for r in backend.execute(requests)]
    assert sorted(r.custom_id for r in results) == sorted(r.custom_id for r in requests)
    return {r.custom_id: r for r in results}


def chat(line: int, model: str = "tiny-llama", **body: Any) -> BatchRequest:
    return BatchRequest(line, f"chat-{line}", Endpoint.CHAT, {"model": model, "messages": MESSAGES, **body})


def assert_error(result: Result, status: int, type_: str, message: str) -> None:
    assert result.status_code == status, result.body
    assert result.body is not None
    error = result.body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["type"] == type_
    assert message in error["message"]
    assert not result.ok and result.error is None


# -- no engine needed -----------------------------------------------------------------------------------------------


async def test_import_does_not_load_vllm() -> None:
    code = "import sys, local_engine; bad = [m for m in ('vllm', 'torch') if m in sys.modules]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


async def test_tiny_models_are_built_once(tiny_models: TinyModels) -> None:
    assert tiny_models.reranker is not None
    for path in (tiny_models.llama, tiny_models.bert, tiny_models.reranker):
        assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert (tiny_models.llama / "chat_template.jinja").is_file()
    before = (tiny_models.llama / "model.safetensors").stat().st_mtime_ns
    again = build_tiny_models(tiny_models.root)
    assert again == tiny_models
    assert (tiny_models.llama / "model.safetensors").stat().st_mtime_ns == before


async def test_bad_model_path_fails_fast(tmp_path: Path) -> None:
    backend = LocalEngineBackend({**ENGINE_ARGS, "model": tmp_path / "missing"})
    with pytest.raises(EngineStartError, match="does not exist"):
        await asyncio.wait_for(backend.start(), 60)
    assert backend.endpoints == frozenset()
    await backend.aclose()


async def test_folder_without_a_model_fails_fast(tmp_path: Path) -> None:
    backend = LocalEngineBackend({**ENGINE_ARGS, "model": tmp_path})
    with pytest.raises(EngineStartError, match="failed to start"):
        await asyncio.wait_for(backend.start(), 120)
    await backend.aclose()


async def test_unknown_engine_arg_is_rejected(tiny_models: TinyModels) -> None:
    backend = LocalEngineBackend({"model": tiny_models.llama, "max_model_length": 512})
    with pytest.raises(EngineStartError, match="max_model_length"):
        await backend.start()
    await backend.aclose()


async def test_execute_before_start_raises(tiny_models: TinyModels) -> None:
    backend = LocalEngineBackend({"model": tiny_models.llama})
    with pytest.raises(RuntimeError, match="start"):
        await anext(aiter(backend.execute([chat(1)])))


# -- chat + completions (tiny Llama) ---------------------------------------------------------------------------------


class TestGenerate:
    @pytest_asyncio.fixture(scope="class", loop_scope="session")
    async def llama(self, tiny_models: TinyModels) -> AsyncIterator[LocalEngineBackend]:
        backend = await _backend(tiny_models.llama, "tiny-llama", max_in_flight=4)
        yield backend
        await backend.aclose()

    async def test_is_a_backend(self, llama: LocalEngineBackend) -> None:
        assert isinstance(llama, Backend)
        # vLLM serves Anthropic's Messages too (its AnthropicServingMessages)
        assert llama.endpoints == {Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.MESSAGES}
        assert llama.served_model_names == ("tiny-llama",)
        await llama.start()  # idempotent

    async def test_engine_has_the_offline_settings(self, llama: LocalEngineBackend) -> None:
        # Where engine_args are silent: vLLM's offline LLM class's batch sizes (not run_batch's 128 / 2048)
        # and no statistics, as LLM() sets them.
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        engine = llama._engine
        assert engine is not None
        tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
        sched = engine.vllm_config.scheduler_config
        assert sched.max_num_seqs == seqs[UsageContext.LLM_CLASS]
        assert sched.max_num_batched_tokens == tokens[UsageContext.LLM_CLASS]
        assert engine.log_stats is False

    async def test_chat_and_completions(self, llama: LocalEngineBackend) -> None:
        reqs = [
            chat(1, max_completion_tokens=8, ignore_eos=True),
            BatchRequest(2, "cmpl", Endpoint.COMPLETIONS, {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 5}),
        ]
        res = await collect(llama, reqs)
        body = res["chat-1"].body
        assert res["chat-1"].status_code == 200 and body is not None
        assert body["object"] == "chat.completion" and body["model"] == "tiny-llama"
        assert body["id"].startswith("chatcmpl-")
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 8
        assert res["chat-1"].usage.output_tokens == 8 and res["chat-1"].usage.input_tokens > 0
        assert res["chat-1"].request_id.startswith("vllm-batch-") and res["chat-1"].model == "tiny-llama"
        assert res["chat-1"].line == 1
        cmpl = res["cmpl"].body
        assert res["cmpl"].status_code == 200 and cmpl is not None
        assert cmpl["object"] == "text_completion" and isinstance(cmpl["choices"][0]["text"], str)
        assert cmpl["usage"]["completion_tokens"] <= 5

    async def test_errors_keep_vllm_status_and_body(self, llama: LocalEngineBackend) -> None:
        reqs = [
            chat(1, model="no-such-model"),
            chat(2, stream=True),
            chat(3, max_completion_tokens=10_000),
            chat(4, temperature="hot"),
            BatchRequest(5, "emb", Endpoint.EMBEDDINGS, {"model": "tiny-llama", "input": "hi"}),
        ]
        res = await collect(llama, reqs)
        assert_error(res["chat-1"], 404, "NotFoundError", "The model `no-such-model` does not exist.")
        assert res["chat-1"].body["error"]["param"] == "model"  # type: ignore[index]
        assert_error(res["chat-2"], 400, "BadRequestError", "Request must not be sent in stream mode")
        assert_error(res["chat-3"], 400, "BadRequestError", "max_model_len=512")
        assert_error(res["chat-4"], 400, "Bad Request", "validation error")
        assert res["chat-4"].body["error"]["param"] == "body.temperature"  # type: ignore[index]
        assert_error(res["emb"], 400, "BadRequestError", "Model does not support endpoint: /v1/embeddings")

    async def test_in_flight_is_bounded_across_concurrent_executes(self, llama: LocalEngineBackend) -> None:
        assert llama.max_in_flight == 4
        engine = llama._engine
        assert engine is not None
        peak = 0
        stop = asyncio.Event()

        async def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, engine.get_num_unfinished_requests())
                await asyncio.sleep(0.005)

        async def run(prefix: int) -> list[Result]:
            reqs = [chat(prefix + i, max_completion_tokens=16, ignore_eos=True) for i in range(12)]
            return [r async for r in llama.execute(reqs)]

        watcher = asyncio.create_task(watch())
        a, b = await asyncio.gather(run(0), run(100))
        stop.set()
        await watcher
        assert len(a) == len(b) == 12 and all(r.status_code == 200 for r in a + b)
        assert 1 <= peak <= 4

    async def test_closing_the_iterator_aborts_the_rest(self, llama: LocalEngineBackend) -> None:
        engine = llama._engine
        assert engine is not None
        long = [chat(i, max_completion_tokens=400, ignore_eos=True) for i in range(1, 20)]
        reqs = [chat(0, max_completion_tokens=1), *long]
        stream = llama.execute(reqs)
        first = await anext(stream)
        assert first.custom_id == "chat-0" and first.status_code == 200
        assert engine.get_num_unfinished_requests() > 0
        await stream.aclose()  # type: ignore[attr-defined]
        assert not llama._tasks
        for _ in range(100):
            if engine.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.05)
        assert engine.get_num_unfinished_requests() == 0
        res = await collect(llama, [chat(1, max_completion_tokens=2)])  # still serving
        assert res["chat-1"].status_code == 200


# -- embeddings (tiny BERT) -------------------------------------------------------------------------------------------


class TestEmbeddings:
    @pytest_asyncio.fixture(scope="class", loop_scope="session")
    async def bert(self, tiny_models: TinyModels) -> AsyncIterator[LocalEngineBackend]:
        backend = await _backend(tiny_models.bert, "tiny-bert")
        yield backend
        await backend.aclose()

    async def test_embeddings(self, bert: LocalEngineBackend) -> None:
        assert Endpoint.EMBEDDINGS in bert.endpoints and Endpoint.CHAT not in bert.endpoints
        assert bert._serving is not None and bert.max_in_flight == 2 * bert._serving.max_num_seqs
        reqs = [
            BatchRequest(1, "one", Endpoint.EMBEDDINGS, {"model": "tiny-bert", "input": "Hello world"}),
            BatchRequest(2, "two", Endpoint.EMBEDDINGS, {"model": "tiny-bert", "input": ["a", "b c"]}),
            BatchRequest(3, "unknown", Endpoint.EMBEDDINGS, {"model": "nope", "input": "x"}),
            BatchRequest(4, "chat", Endpoint.CHAT, {"model": "tiny-bert", "messages": MESSAGES}),
        ]
        res = await collect(bert, reqs)
        one, two = res["one"].body, res["two"].body
        assert res["one"].status_code == 200 and one is not None and two is not None
        assert one["object"] == "list" and one["model"] == "tiny-bert" and one["id"].startswith("embd-")
        vector = one["data"][0]["embedding"]
        assert len(vector) == 64 and abs(sum(x * x for x in vector) - 1) < 1e-3  # mean pooling, normalised
        assert [d["index"] for d in two["data"]] == [0, 1]
        assert one["usage"]["prompt_tokens"] > 0 and res["one"].usage.input_tokens == one["usage"]["prompt_tokens"]
        assert_error(res["unknown"], 404, "NotFoundError", "The model `nope` does not exist.")
        assert_error(res["chat"], 400, "BadRequestError", "Model does not support endpoint: /v1/chat/completions")


# -- score + rerank (tiny cross-encoder) ------------------------------------------------------------------------------


class TestScoreRerank:
    @pytest_asyncio.fixture(scope="class", loop_scope="session")
    async def reranker(self, tiny_models: TinyModels) -> AsyncIterator[LocalEngineBackend]:
        assert tiny_models.reranker is not None
        backend = await _backend(tiny_models.reranker, "tiny-reranker")
        yield backend
        await backend.aclose()

    async def test_score_and_rerank(self, reranker: LocalEngineBackend) -> None:
        assert reranker.endpoints == {Endpoint.SCORE, Endpoint.RERANK}
        docs = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]
        query = "Capital of France?"
        reqs = [
            BatchRequest(1, "score", Endpoint.SCORE, {"model": "tiny-reranker", "text_1": query, "text_2": docs}),
            BatchRequest(2, "rerank", Endpoint.RERANK, {"model": "tiny-reranker", "query": query, "documents": docs}),
            BatchRequest(3, "unknown", Endpoint.RERANK, {"model": "nope", "query": "q", "documents": ["d"]}),
        ]
        res = await collect(reranker, reqs)
        score, rerank = res["score"].body, res["rerank"].body
        assert res["score"].status_code == 200 and score is not None
        assert score["object"] == "list" and [d["object"] for d in score["data"]] == ["score", "score"]
        assert all(0.0 <= d["score"] <= 1.0 for d in score["data"])
        assert res["rerank"].status_code == 200 and rerank is not None
        assert sorted(r["index"] for r in rerank["results"]) == [0, 1]
        assert all("relevance_score" in r for r in rerank["results"])
        assert_error(res["unknown"], 404, "NotFoundError", "The model `nope` does not exist.")
