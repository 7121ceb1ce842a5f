"""How the engine core uses the cores of a CPU-only machine.

vLLM on CPU runs the model in a worker process of its own (the multiprocessing
executor) because, its platform code says, "OMP requires the MP executor to
function correctly, UniProc is not supported as it is not possible to set the
OMP environment correctly": vLLM sets the worker's OpenMP threads as it spawns
it (`OMPProcessManager.configure_omp_envs`: one thread per core, bound, one core
left to the scheduler), and a uniproc engine core gets no such set-up, so torch
starts a thread per core and they fight the front end for the same cores.

We start the engine-core process ourselves (`AsyncLLM` spawns it), so we can
give it exactly that OpenMP set-up. With it, the engine core runs the model in
its own process (the uniproc executor): one process and one hop per step
fewer than the worker process, and the same bound threads. Measured with
`bench/local_engine.py` on a 2-core machine (tiny Llama, 7,000 lines): batch
phase 356-385 req/s against 312-315 with vLLM's worker process, and engines
ready 7-9 s sooner (README, "Where the time goes on CPU").

- `uniproc_by_default`: while the engine's config is built, the uniproc
  executor is chosen where the user chose nothing (no
  `VLLM_ENABLE_V1_MULTIPROCESSING` in the environment, no
  `distributed_executor_backend`, one device).
- `engine_core_threads`: while the engine-core process is spawned, the
  environment carries vLLM's own OpenMP settings for its rank 0 worker
  (`VLLM_CPU_OMP_THREADS_BIND` is honoured; `nobind` leaves it alone).

Neither does anything on a GPU.
"""

from __future__ import annotations

import contextlib
import os
import threading
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"

# The environment is process-wide and engines may start side by side (one thread each): the first spawn
# sets it, the last one to finish restores it. Every CPU engine of one process gets the same set-up.
_LOCK = threading.Lock()
_users = 0
_restore = contextlib.ExitStack()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@contextlib.contextmanager
def uniproc_by_default(args: Namespace) -> Iterator[None]:
    """Build the config with the uniproc executor on CPU, unless the user chose (call under the build lock)."""
    chosen = MULTIPROCESSING_ENV in os.environ or getattr(args, "distributed_executor_backend", None) is not None
    parallel = (getattr(args, name, 1) or 1 for name in
                ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
    if chosen or any(size != 1 for size in parallel) or not _on_cpu():
        yield
        return
    os.environ[MULTIPROCESSING_ENV] = "0"  # read by vLLM's CPU platform while it checks the config
    try:
        yield
    finally:
        os.environ.pop(MULTIPROCESSING_ENV, None)


@contextlib.contextmanager
def engine_core_threads(vllm_config: Any) -> Iterator[None]:
    """Spawn a uniproc CPU engine core with vLLM's OpenMP set-up for a CPU worker."""
    global _users
    if vllm_config.parallel_config.distributed_executor_backend != "uni" or not _on_cpu():
        yield
        return
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    with _LOCK:
        if _users == 0:
            _restore.enter_context(OMPProcessManager(vllm_config).configure_omp_envs(rank=0, local_rank=0))
        _users += 1
    try:
        yield
    finally:
        with _LOCK:
            _users -= 1
            if _users == 0:
                _restore.close()
