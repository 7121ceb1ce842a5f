"""How a local engine on CPU uses the machine's cores (`local_engine.cpu_threads`).

With no choice made by the user, the engine core runs the model in its own
process (vLLM's uniproc executor) with the OpenMP set-up vLLM gives its CPU
worker: one thread per core it binds, a core left for the front end. The user's
choices win: `VLLM_ENABLE_V1_MULTIPROCESSING`, `distributed_executor_backend`,
`VLLM_CPU_OMP_THREADS_BIND=nobind`.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import AsyncIterator

import psutil
import pytest
import pytest_asyncio

from gateway.domain import BatchRequest, Endpoint
from local_engine import LocalEngineBackend, TinyModels
from local_engine.cpu_threads import MULTIPROCESSING_ENV, uniproc_by_default
from tests.support.engine_helpers import ENGINE_MARKS, built_tiny_models

pytestmark = [*ENGINE_MARKS, pytest.mark.asyncio(loop_scope="module")]

Engine = tuple[psutil.Process, dict[str, str | None], LocalEngineBackend]
OMP_NAMES = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return built_tiny_models(tmp_path_factory)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engine(tiny_models: TinyModels) -> AsyncIterator[Engine]:
    """An engine started as a user's `batchyard run` starts it: none of the settings in the environment.

    Yields its engine-core process, the front end's environment once it started, and the backend.
    """
    saved = {name: os.environ.pop(name, None)
             for name in (MULTIPROCESSING_ENV, "VLLM_CPU_OMP_THREADS_BIND", *OMP_NAMES)}
    args = {"model": tiny_models.llama, "served_model_name": ["tiny"], "max_model_len": 256, "dtype": "float32",
            "enforce_eager": True, "max_num_seqs": 16}
    backend = LocalEngineBackend(args)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        await backend.start()
        after = {name: os.environ.get(name) for name in (MULTIPROCESSING_ENV, *OMP_NAMES)}
        cores = [p for p in psutil.Process().children(recursive=True)
                 if p.pid not in before and "EngineCore" in p.name()]
        assert len(cores) == 1, cores
        yield cores[0], after, backend
    finally:
        await backend.aclose()
        for name, value in saved.items():
            if value is not None:
                os.environ[name] = value


async def test_the_engine_core_runs_the_model_itself_bound_to_all_cores_but_one(engine: Engine) -> None:
    core, _, backend = engine
    assert backend._engine is not None
    assert backend._engine.vllm_config.parallel_config.distributed_executor_backend == "uni"
    # vLLM's binding for its CPU worker (one OpenMP thread per bound core); its process title overwrites
    # /proc/PID/environ, so the binding itself is what can be checked. Where there are two or more cores,
    # one is left to the front end.
    bound, usable = set(core.cpu_affinity()), os.sched_getaffinity(0)
    assert bound and bound <= usable
    assert len(bound) < len(usable) or len(usable) == 1


async def test_the_front_ends_environment_is_left_as_it_was(engine: Engine) -> None:
    _, after, _ = engine
    assert after == dict.fromkeys(after)


async def test_it_answers(engine: Engine) -> None:
    _, _, backend = engine
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]}
    results = [r async for r in backend.execute([BatchRequest(1, "a", Endpoint.CHAT, body)])]
    assert [r.status_code for r in results] == [200]


# -- the user's choice wins (no engine needed) ---------------------------------------------------------------------

def _chosen(args: Namespace) -> str | None:
    with uniproc_by_default(args):
        return os.environ.get(MULTIPROCESSING_ENV)


@pytest.mark.parametrize("args", [
    Namespace(distributed_executor_backend="mp", tensor_parallel_size=1),
    Namespace(distributed_executor_backend=None, tensor_parallel_size=2),
    Namespace(distributed_executor_backend=None, data_parallel_size=2),
])
def test_an_executor_or_parallelism_the_user_set_is_kept(args: Namespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROCESSING_ENV, raising=False)
    assert _chosen(args) is None


@pytest.mark.parametrize("value", ["0", "1"])
def test_vllms_own_switch_is_kept(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROCESSING_ENV, value)
    assert _chosen(Namespace(distributed_executor_backend=None)) == value
    assert os.environ[MULTIPROCESSING_ENV] == value


def test_otherwise_uniproc_while_the_config_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROCESSING_ENV, raising=False)
    assert _chosen(Namespace(distributed_executor_backend=None, tensor_parallel_size=1)) == "0"
    assert MULTIPROCESSING_ENV not in os.environ
