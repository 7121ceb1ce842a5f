"""Benchmark: does sending lines that share a system prompt together pay, on vLLM's prefix cache?

    .venv/bin/python bench/prefix_order.py [--lines 1000] [--prompts 24] [--words 60] [--blocks 64]

One in-process engine (tiny random-weight Llama, CPU) with a KV cache cut down to `--blocks` blocks, so
the shared prompts do not all stay cached (as on a GPU whose cache a big model fills). The same shard of
`--lines` chat lines, whose system messages are `--prompts` long prompts scattered through the file, runs
twice through `LocalEngineBackend.execute`: in file order and grouped by system prompt
(`local_engine.ordering`), with the prefix cache emptied before each. Printed per order: wall, prompt
tokens, and the prompt tokens vLLM read from its prefix cache (`usage.prompt_tokens_details.cached_tokens`,
exact, not a timing) - fewer tokens computed is the gain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from gateway.domain import BatchRequest, Endpoint  # noqa: E402
from local_engine import LocalEngineBackend, build_tiny_models  # noqa: E402

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo")


def requests(lines: int, prompts: int, words: int) -> list[BatchRequest]:
    rnd = random.Random(7)
    systems = [f"Rule set {k}: " + " ".join(rnd.choice(WORDS) for _ in range(words)) for k in range(prompts)]
    return [BatchRequest(i + 1, f"r{i}", Endpoint.CHAT, {
        "model": "tiny", "max_tokens": 8, "ignore_eos": True,
        "messages": [{"role": "system", "content": systems[(i * 7919) % prompts]},
                     {"role": "user", "content": f"Question {i}?"}]}) for i in range(lines)]


async def run(args: argparse.Namespace) -> None:
    model = build_tiny_models(Path(args.models)).llama
    engine_args = {"model": str(model), "served_model_name": ["tiny"], "dtype": "float32", "enforce_eager": True,
                   "max_model_len": 512, "enable_prompt_tokens_details": True,
                   "num_gpu_blocks_override": args.blocks}
    reqs = requests(args.lines, args.prompts, args.words)
    backend = LocalEngineBackend(engine_args)
    await backend.start()
    try:
        engine = backend._engine
        assert engine is not None
        print(f"{args.lines} lines, {args.prompts} system prompts of {args.words} words, KV cache {args.blocks} "
              f"blocks of {engine.vllm_config.cache_config.block_size} tokens")
        for grouped in (False, True, False, True):
            backend.group_prefixes = grouped
            await engine.reset_prefix_cache()
            started = time.perf_counter()
            results = [r async for r in backend.execute(reqs)]
            wall = time.perf_counter() - started
            assert all(r.status_code == 200 for r in results), [r.body for r in results if r.status_code != 200][:1]
            prompt = sum(r.usage.input_tokens for r in results)
            cached = sum(((r.body or {}).get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens")
                         or 0 for r in results)
            print(f"  {'grouped   ' if grouped else 'file order'}  wall {wall:6.1f} s  prompt tokens {prompt}  "
                  f"from the prefix cache {cached} ({cached / prompt:.0%})  computed {prompt - cached}", flush=True)
    finally:
        await backend.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=str(REPO / ".batchyard" / "models"), help="tiny models (built if absent)")
    parser.add_argument("--lines", type=int, default=1000, help="lines in the shard (default 1000)")
    parser.add_argument("--prompts", type=int, default=24, help="distinct long system prompts (default 24)")
    parser.add_argument("--words", type=int, default=60, help="words per system prompt (default 60)")
    parser.add_argument("--blocks", type=int, default=64, help="KV cache blocks (default 64: a cache under pressure)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
