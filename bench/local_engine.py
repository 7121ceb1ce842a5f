"""Benchmark: `batchyard run --model` against vLLM's own `run_batch` and a direct `LLM.chat`.

    .venv/bin/python bench/local_engine.py [--models .batchyard/models] [--sizes 1000,7000] [--small 1] [--repeat 3]
                                           [--tools batchyard,run_batch,LLM.chat]

Each tool runs as a whole process (engine start-up included) on chat files of
two sizes (max_tokens 32, ignore_eos) and on a small file, each at its own
engine defaults (the same dtype, max length and eager mode for all;
`--engine-flags` adds more to batchyard and run_batch), interleaved,
`--repeat` times. Printed, with ratios against
run_batch and `LLM.chat`:
- marginal throughput: (big - small size) / (wall(big) - wall(small)), the
  per-request speed with start-up cancelled out (aim: >= 1.2x run_batch,
  >= 1.0x LLM.chat). Keep the sizes far apart: at 200/1,000 the gap is a
  few seconds of work beside ~25 s of start-up, and run_batch's marginal
  there came out at 105 req/s against 342-487 at 1,000/7,000 (batchyard's
  stayed at 257-404): that, not a change in batchyard, is why 200/1,000 once
  read 2.68x where 1,000/7,000 read 0.75-0.83x;
- small-file wall: the fixed cost a user pays on a short file (aim <= 1.0x run_batch);
- peak RSS (process tree) at the big size.
Not a test: numbers on a shared 2-core machine are noisy; read the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
# What the tiny model needs, the same for every tool; batch sizes and executor are each tool's own defaults
# (add `--engine-flags "--max-num-seqs 128"` to pin them, as this script did before).
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager"]
# No LITELLM_LOCAL_MODEL_COST_MAP here: batchyard must be offline and quiet on its own. The caller's
# environment passes through (VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_OMP_THREADS_BIND, ...).
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", **os.environ, "PYTHONPATH": str(REPO)}

_DIRECT = """
import json, sys, time
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, src = sys.argv[1], sys.argv[2]
    convs = [json.loads(x)["body"]["messages"] for x in open(src)]
    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    started = time.perf_counter()
    llm.chat(convs, params, use_tqdm=False)
    print(f"GENERATION {time.perf_counter() - started:.3f}")
"""


def _write(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            body = {"model": "tiny", "max_tokens": 32, "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"Tell me about batch number {i}."}]}
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def _measure(cmd: list[str]) -> tuple[float, int, str]:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True)))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{err[-3000:]}")
    return wall, peak, out + err


def _tools(model: str, tmp: Path, extra: list[str]) -> dict[str, Callable[[Path], list[str]]]:
    flags = [*ENGINE_FLAGS, *extra]
    return {
        "batchyard": lambda src: [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o",
                                  str(tmp / "ours.jsonl"), "--model", model, "--served-model-name", "tiny",
                                  *flags, "--no-progress"],
        "run_batch": lambda src: [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(src),
                                  "-o", str(tmp / "theirs.jsonl"), "--model", model, "--served-model-name", "tiny",
                                  *flags],
        "LLM.chat": lambda src: [sys.executable, str(tmp / "direct.py"), model, str(src)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=str(REPO / ".batchyard" / "models"))
    parser.add_argument("--sizes", nargs="+", default=["1000,7000"], metavar="N",
                        help="the two file sizes of the marginal throughput: '1000,7000' or '1000 7000' "
                             "(default 1000,7000)")
    parser.add_argument("--tools", default="batchyard,run_batch,LLM.chat",
                        help="which tools to run, comma-separated (default batchyard,run_batch,LLM.chat; "
                             "batchyard and run_batch are needed for the ratios)")
    parser.add_argument("--small", type=int, default=1, help="lines of the small file (fixed cost)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and size; medians are printed (default 3)")
    parser.add_argument("--engine-flags", default="",
                        help="more engine flags for batchyard and run_batch, one string, e.g. "
                             "'--scheduling-policy fcfs' (default none)")
    args = parser.parse_args()
    args.sizes = sorted(int(x) for part in args.sizes for x in part.split(",") if x)
    if len(args.sizes) != 2 or args.sizes[0] == args.sizes[1]:
        parser.error("--sizes needs two different sizes, e.g. 1000,7000")
    wanted = [t for t in args.tools.split(",") if t]
    sys.path.insert(0, str(REPO))
    from local_engine import build_tiny_models

    model = str(build_tiny_models(Path(args.models)).llama)
    sizes = sorted({args.small, *args.sizes})
    walls: dict[tuple[str, int], list[float]] = {}
    rss: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "direct.py").write_text(_DIRECT)
        files = {n: tmp / f"chat-{n}.jsonl" for n in sizes}
        for n, path in files.items():
            _write(path, n)
        tools = {name: cmd for name, cmd in _tools(model, tmp, args.engine_flags.split()).items() if name in wanted}
        if {"batchyard", "run_batch"} - set(tools):
            parser.error("--tools must include batchyard and run_batch")
        for i in range(args.repeat):
            for n in sizes:
                for name, cmd in tools.items():  # interleaved, so drift on a shared machine hits every tool
                    wall, peak, _ = _measure(cmd(files[n]))
                    walls.setdefault((name, n), []).append(wall)
                    if n == max(sizes):
                        rss[name] = max(rss.get(name, 0), peak)
                    print(f"  run {i + 1}: {name:10} {n:6} lines {wall:7.1f} s", flush=True)

    med = statistics.median
    lo, hi = args.sizes
    # A big file that ran no slower than the small one: the sizes are too close for this machine's noise.
    marginal = {t: (hi - lo) / d if (d := med(walls[(t, hi)]) - med(walls[(t, lo)])) > 0 else float("nan")
                for t in tools}
    small = {t: med(walls[(t, args.small)]) for t in tools}
    print(f"\nlocal engine: chat requests (max_tokens 32, tiny random-weight Llama, CPU), whole processes, "
          f"median of {args.repeat}")
    print(f"  {'':12}{'marginal req/s':>16}{f'wall {lo}':>12}{f'wall {hi}':>12}{f'wall {args.small}':>12}"
          f"{'peak RSS MiB':>14}")
    for t in tools:
        print(f"  {t:12}{marginal[t]:16.0f}{med(walls[(t, lo)]):12.1f}{med(walls[(t, hi)]):12.1f}"
              f"{small[t]:12.1f}{rss[t] / 2**20:14.0f}")
    versus_llm = (f", batchyard/LLM.chat {marginal['batchyard'] / marginal['LLM.chat']:.2f}x (aim >= 1.0)"
                  if "LLM.chat" in tools else "")
    print(f"  marginal throughput: batchyard/run_batch {marginal['batchyard'] / marginal['run_batch']:.2f}x "
          f"(aim >= 1.2){versus_llm}")
    print(f"  {args.small}-line wall: batchyard/run_batch {small['batchyard'] / small['run_batch']:.2f}x "
          f"(aim <= 1.0); {lo}-line wall: {med(walls[('batchyard', lo)]) / med(walls[('run_batch', lo)]):.2f}x "
          f"(aim <= 1.0)")
    print(f"  load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
