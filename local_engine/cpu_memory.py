"""The KV cache of an engine on a CPU-only machine, sized from the model and the memory that is free.

Left alone, vLLM's CPU worker reserves `gpu_memory_utilization` (0.9) of the machine's total memory and
refuses to start when less than that is free, so a tiny model on a laptop (or a 2-core CI box with 23 GiB,
a browser and other processes open) fails with "Available memory ... is less than desired CPU memory
utilization". vLLM's remedy is `VLLM_CPU_KVCACHE_SPACE` (GiB) or `kv_cache_memory_bytes`; we choose one
when the operator chose nothing:

    the KV cache the engine can use at once (`max_num_seqs` sequences of `max_model_len` tokens),
    at most a quarter of the memory available now, and at least one whole sequence (vLLM's own floor).

"Chose nothing" means no `VLLM_CPU_KVCACHE_SPACE` in the environment, and neither `kv_cache_memory_bytes`
nor `gpu_memory_utilization` in `engine_args`: any of them is the operator's word and wins. On a GPU
nothing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

log = logging.getLogger(__name__)

MIB = 1024 * 1024
AVAILABLE_SHARE = 4  # at most 1/4 of the memory available when the engine starts
# When the model's shape cannot be read (a hybrid or unusual architecture): this much, within the same bounds
FALLBACK_BYTES = 1024 * MIB
OPERATOR_ARGS = frozenset({"kv_cache_memory_bytes", "gpu_memory_utilization"})


def kv_cache_bytes(per_token: int | None, max_model_len: int, max_num_seqs: int, block_size: int,
                   available: int) -> int:
    """The rule (module docs): what the engine can use, within a quarter of `available`, at least one sequence.
    `per_token`: the model's KV bytes per token (None: unknown, `FALLBACK_BYTES` is the want)."""
    want = FALLBACK_BYTES if per_token is None else per_token * max_model_len * max_num_seqs
    floor = 0 if per_token is None else per_token * (max_model_len + block_size)
    size = max(floor, min(want, available // AVAILABLE_SHARE))
    return -(-size // MIB) * MIB  # whole MiB


def per_token_bytes(vllm_config: Any) -> int | None:
    """Key and value bytes per token over every attention layer, or None when the shape cannot be read."""
    try:
        from vllm.utils.torch_utils import get_kv_cache_torch_dtype

        model, parallel = vllm_config.model_config, vllm_config.parallel_config
        dtype = get_kv_cache_torch_dtype(vllm_config.cache_config.cache_dtype, model.dtype)
        layers, heads, head_size = model.get_num_layers(parallel), model.get_num_kv_heads(parallel), \
            model.get_head_size()
        size = 2 * int(layers) * int(heads) * int(head_size) * dtype.itemsize
    except Exception as exc:  # an architecture these getters do not cover: the fallback size, said once
        log.info("the model's KV cache shape could not be read (%s); sizing it by the fallback", exc)
        return None
    return size if size > 0 else None


def size_cpu_kv_cache(vllm_config: Any, engine_arg_names: Collection[str]) -> int | None:
    """On a CPU, set `cache_config.kv_cache_memory_bytes` by the rule unless the operator chose; the bytes set,
    or None when nothing was changed. Call after the config is built, before the engine starts."""
    from vllm.platforms import current_platform

    cache = vllm_config.cache_config
    if not current_platform.is_cpu() or cache.kv_cache_memory_bytes is not None:
        return None  # a GPU, or VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes already applied by vLLM
    if OPERATOR_ARGS & {name.replace("-", "_") for name in engine_arg_names}:
        return None
    import psutil

    available = int(psutil.virtual_memory().available)
    size = kv_cache_bytes(per_token_bytes(vllm_config), vllm_config.model_config.max_model_len,
                          vllm_config.scheduler_config.max_num_seqs, cache.block_size or 16, available)
    cache.kv_cache_memory_bytes = size
    log.info("CPU KV cache for %s: %d MiB (%d MiB available; set VLLM_CPU_KVCACHE_SPACE or engine_args."
             "kv_cache_memory_bytes to choose)", vllm_config.model_config.model, size // MIB, available // MIB)
    return size


__all__ = ["kv_cache_bytes", "per_token_bytes", "size_cpu_kv_cache"]
