"""Fair share inside a local engine: vLLM's priority scheduling orders its waiting queue by the fair-share rule.

- The number (`gateway.scheduling.engine_priority`): a team with less of the engine in use per weight goes first, then
  the sooner batch deadline, then the line's own `priority`, which can never lift a line past the first two.
- On a real engine (tiny Llama, CPU, in-process): a newcomer team's requests run before the ones another team
  already has waiting inside vLLM; a team alone fills the whole window; a line's own priority still works.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gateway.domain import BatchRequest, Endpoint, Result
from gateway.scheduling.engine_priority import engine_priority, with_priority
from gateway.scheduling.fairness import Share, running_for
from local_engine import LocalEngineBackend, TinyModels
from tests.support.engine_helpers import built_tiny_models

A = Share("alpha", "batch_a", deadline=1_900_000_000)
B = Share("beta", "batch_b", deadline=1_900_086_400)  # submitted later: a later deadline than alpha's


# -- the number -------------------------------------------------------------------------------------------------------


def test_a_team_with_less_in_use_goes_first_whatever_its_deadline() -> None:
    assert engine_priority(B, in_use=1) < engine_priority(A, in_use=30)
    assert engine_priority(A, in_use=30) < engine_priority(B, in_use=31)


def test_weight_divides_the_use() -> None:
    heavy = Share("gamma", "batch_g", deadline=B.deadline, weight=2)
    assert engine_priority(heavy, in_use=40) < engine_priority(A, in_use=30)  # 20 per weight against 30
    assert engine_priority(heavy, in_use=80) > engine_priority(A, in_use=30)


def test_at_equal_use_the_sooner_deadline_goes_first() -> None:
    sooner = Share("alpha", "batch_urgent", deadline=A.deadline - 3600)
    assert engine_priority(sooner, in_use=8) < engine_priority(A, in_use=8)


def test_a_lines_own_priority_orders_only_within_its_share_and_deadline() -> None:
    assert engine_priority(A, 8, line_priority=-5) < engine_priority(A, 8) < engine_priority(A, 8, line_priority=5)
    # however low, a line's priority never beats a team with less in use, nor a sooner deadline
    assert engine_priority(A, 8, line_priority=-(2**62)) > engine_priority(B, 7, line_priority=2**62)
    sooner = Share("alpha", "batch_urgent", deadline=A.deadline - 1)
    assert engine_priority(A, 8, line_priority=-(2**62)) > engine_priority(sooner, 8, line_priority=2**62)


def test_the_number_fits_vllms_int64_field() -> None:
    worst = engine_priority(Share("t", "b", deadline=2**40, weight=1e-9), in_use=10**9, line_priority=2**70)
    assert 0 <= engine_priority(Share(), 0) < worst < 2**63


def test_with_priority_copies_the_body_and_leaves_a_bad_priority_to_vllm() -> None:
    body = {"model": "m", "priority": 3}
    out = with_priority(body, A, 2)
    assert out["priority"] == engine_priority(A, 2, 3) and body == {"model": "m", "priority": 3}
    bad = {"model": "m", "priority": "high"}
    assert with_priority(bad, A, 2) is bad  # vLLM answers the line with its own 400


# -- a real engine ----------------------------------------------------------------------------------------------------

_ENGINE_MARKS = (
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (the engine extra) is not installed"),
    pytest.mark.asyncio(loop_scope="module"),
)


def on_engine(test: Any) -> Any:
    for mark in _ENGINE_MARKS:
        test = mark(test)
    return test


os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
RUNNING = 2  # max_num_seqs: what vLLM runs at once
WINDOW = 12  # what we hand it at once (the submission window): most of it waits in vLLM's queue


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return built_tiny_models(tmp_path_factory)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_models: TinyModels) -> AsyncIterator[LocalEngineBackend]:
    args = {"model": tiny_models.llama, "served_model_name": ["tiny"], "max_model_len": 256, "dtype": "float32",
            "enforce_eager": True, "max_num_seqs": RUNNING}
    backend = LocalEngineBackend(args, max_in_flight=WINDOW)  # no scheduling_policy: the default
    await backend.start()
    yield backend
    await backend.aclose()


def _chat(tag: str, i: int, **body: Any) -> BatchRequest:
    return BatchRequest(i + 1, f"{tag}-{i}", Endpoint.CHAT, {"model": "tiny", "max_tokens": 8, "ignore_eos": True,
                                                            "messages": [{"role": "user", "content": f"{tag} {i}"}],
                                                            **body})


async def _run(backend: LocalEngineBackend, share: Share, requests: list[BatchRequest],
               order: list[str]) -> list[Result]:
    async def consume() -> list[Result]:
        results = []
        async for result in backend.execute(requests):
            order.append(result.custom_id)
            results.append(result)
        return results

    with running_for(share):  # the task copies the context: the engine's window sees whose requests these are
        task = asyncio.create_task(consume())
    return await task


async def _until(what: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@on_engine
async def test_the_engine_schedules_by_priority_by_default(engine: LocalEngineBackend) -> None:
    assert engine._engine is not None and engine._engine.vllm_config.scheduler_config.policy == "priority"


@on_engine
async def test_a_newcomers_requests_run_before_those_another_team_has_waiting(engine: LocalEngineBackend) -> None:
    order: list[str] = []
    big = asyncio.create_task(_run(engine, A, [_chat("a", i) for i in range(2 * WINDOW)], order))
    await _until(lambda: engine._slots is not None and engine._slots.in_use("alpha") == WINDOW)
    small = await _run(engine, B, [_chat("b", i) for i in range(3)], order)  # enters as alpha's requests finish
    assert all(r.status_code == 200 for r in small)
    # First come, first served, beta's last request would finish after the whole window alpha had in vLLM
    # when beta came (12 requests, 10 of them waiting); by priority each of beta's goes next.
    a_before_b = sum(1 for x in order[: order.index(small[-1].custom_id) + 1] if x.startswith("a-"))
    assert a_before_b <= WINDOW - 4, order
    assert all(r.status_code == 200 for r in await big)


@on_engine
async def test_a_team_alone_fills_the_whole_window(engine: LocalEngineBackend) -> None:
    order: list[str] = []
    slots = engine._slots
    assert slots is not None
    seen = 0

    async def watch() -> None:
        nonlocal seen
        while True:
            seen = max(seen, slots.in_use("alpha"))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        results = await _run(engine, A, [_chat("alone", i) for i in range(WINDOW + 4)], order)
    finally:
        watcher.cancel()
    assert all(r.status_code == 200 for r in results) and len(order) == WINDOW + 4
    assert seen == WINDOW  # nothing kept back for teams with no work


@on_engine
async def test_a_lines_own_priority_orders_its_batch(engine: LocalEngineBackend) -> None:
    order: list[str] = []
    # all 12 enter the window at once, at one share level and deadline: the line's own priority decides
    requests = [_chat("p", i, priority=-i) for i in range(WINDOW)]
    await _run(engine, A, requests, order)
    lowest = {f"p-{i}" for i in range(WINDOW - 4, WINDOW)}  # first come, first served: the last four to run
    assert lowest <= set(order[:8]), order
