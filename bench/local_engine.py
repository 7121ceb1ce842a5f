"""Benchmark: `batchyard run --model` against vLLM's own `run_batch` and a direct `LLM.chat`.

    .venv/bin/python bench/local_engine.py [--models .batchyard/models] [--requests 2000] [--big 20000] [--repeat 3]

One chat file (max_tokens 32) through both commands with the same engine
flags, alternating, whole-process wall time and peak RSS (process tree); the
generation time of `LLM.chat` on the same conversations; and both commands'
peak RSS at the big size, to show whose memory grows with the file.
Not a test: numbers on a shared 2-core machine are noisy; read the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--max-num-seqs", "128"]
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "LITELLM_LOCAL_MODEL_COST_MAP": "True", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}

_DIRECT = """
import json, sys, time
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, src = sys.argv[1], sys.argv[2]
    convs = [json.loads(x)["body"]["messages"] for x in open(src)]
    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=128)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=str(REPO / ".batchyard" / "models"))
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--big", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from local_engine import build_tiny_models

    model = str(build_tiny_models(Path(args.models)).llama)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        small, big = tmp / "small.jsonl", tmp / "big.jsonl"
        _write(small, args.requests)
        _write(big, args.big)
        (tmp / "direct.py").write_text(_DIRECT)

        def ours(src: Path) -> list[str]:
            return [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp / "ours.jsonl"),
                    "--model", model, "--served-model-name", "tiny", *ENGINE_FLAGS, "--no-progress"]

        def theirs(src: Path) -> list[str]:
            return [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(src),
                    "-o", str(tmp / "theirs.jsonl"), "--model", model, "--served-model-name", "tiny", *ENGINE_FLAGS]

        walls: dict[str, list[float]] = {"ours": [], "theirs": []}
        rss: dict[str, list[int]] = {"ours": [], "theirs": []}
        gen_ours: list[float] = []
        for i in range(args.repeat):
            w, r, text = _measure(ours(small))
            walls["ours"].append(w)
            rss["ours"].append(r)
            m = re.search(r"local engines ready in ([\d.]+)s", text)
            m2 = re.search(r"requests in ([\d.]+)s", text)
            if m and m2:
                gen_ours.append(float(m2.group(1)) - float(m.group(1)))
            w, r, _ = _measure(theirs(small))
            walls["theirs"].append(w)
            rss["theirs"].append(r)
            print(f"  run {i + 1}: batchyard {walls['ours'][-1]:6.1f}s, run_batch {walls['theirs'][-1]:6.1f}s",
                  flush=True)
        gen_direct = []
        for _ in range(args.repeat):
            _, _, text = _measure([sys.executable, str(tmp / "direct.py"), model, str(small)])
            gen_direct.append(float(re.search(r"GENERATION ([\d.]+)", text).group(1)))  # type: ignore[union-attr]
        _, big_ours, _ = _measure(ours(big))
        _, big_theirs, _ = _measure(theirs(big))

    med = statistics.median
    mib = 1024 * 1024
    print(f"\nlocal engine: {args.requests} chat requests (max_tokens 32, tiny random-weight Llama, CPU), "
          f"median of {args.repeat}, whole processes")
    print(f"  batchyard run --model     {med(walls['ours']):7.1f} s   peak RSS {med(rss['ours']) / mib:6.0f} MiB")
    print(f"  vllm run_batch            {med(walls['theirs']):7.1f} s   peak RSS {med(rss['theirs']) / mib:6.0f} MiB")
    print(f"  wall ratio batchyard/run_batch   {med(walls['ours']) / med(walls['theirs']):5.2f}   (aim <= 1.0)")
    if gen_ours:
        print(f"  generation phase: batchyard {med(gen_ours):6.1f} s, direct LLM.chat {med(gen_direct):6.1f} s, "
              f"overhead {100 * (med(gen_ours) / med(gen_direct) - 1):+.0f}%   (aim <= +10%)")
    print(f"  peak RSS at {args.big} lines: batchyard {big_ours / mib:6.0f} MiB "
          f"({big_ours / med(rss['ours']):.2f}x of {args.requests}), run_batch {big_theirs / mib:6.0f} MiB "
          f"({big_theirs / med(rss['theirs']):.2f}x)")


if __name__ == "__main__":
    main()
