"""Benchmark on a GPU: `batchyard run --model` against vLLM's `run_batch` and a plain `LLM.chat`, in one run.

    python bench/gpu_engine.py [--size 1b|tiny] [-n 5000] [--max-tokens 128] [--tools llm,batchyard,runbatch]
    python bench/gpu_engine.py --cpu            # the same steps on CPU with the tiny model (a check, not a figure)
    bash bench/gpu_engine.sh ...                # on the recipe's GPU machine: its environment first, then this

It builds a random-weight Llama and a batch file of chat requests with `bench/gpu_model.py` (no download:
the model folder is reused when it has a config.json), then runs each tool as a whole process, one after
the other, on the same file with the same engine flags (`--engine-args`, default none: vLLM's defaults),
while it samples `nvidia-smi` (every 500 ms) and the CPU of busy processes (every second). Per tool it prints:

    RESULT <tool> rc ok/N  wall  start-up  batch  req/s  out tok/s | GPU mem peak, busy % (batch phase) | CPU

- batch phase: `LLM.chat`'s own call (timed in its process); run_batch from its first "Running batch:"
  progress line to its "100% Completed" line; batchyard's summary ("N requests in T s" minus "local
  engines ready in X s"); start-up is the wall before it (imports and engine load included).
- GPU memory is mostly vLLM's own reservation (`gpu_memory_utilization`), not what the run needed;
  GPU busy is nvidia-smi's utilization.gpu (share of time a kernel ran), mean and median.
Logs, samples and one JSON line per tool go to --out (default $OUT, else /tmp/gpu-bench-out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("llm", "batchyard", "runbatch")
# On CPU: float32 (bfloat16 kills the tiny model's engine core on CPU), no compile, a short context.
CPU_ENGINE_ARGS = "--dtype float32 --enforce-eager --max-model-len 1024"

_LLM = """
import json, shlex, sys, time
t0 = time.time()
from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

model, batch, flags = sys.argv[1], sys.argv[2], sys.argv[3]
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
ns = parser.parse_args(["--model", model, *shlex.split(flags)])
defaults = vars(parser.parse_args(["--model", model]))
kwargs = {k: v for k, v in vars(ns).items() if v != defaults.get(k) or k == "model"}
llm = LLM(**kwargs)
t_ready = time.time()
bodies = [json.loads(line)["body"] for line in open(batch) if line.strip()]
b = bodies[0]
sp = SamplingParams(max_tokens=b.get("max_tokens", 128), ignore_eos=b.get("ignore_eos", False),
                    temperature=b.get("temperature", 1.0), top_p=b.get("top_p", 1.0))
t_start = time.time()
outs = llm.chat([x["messages"] for x in bodies], sp, use_tqdm=False)
t_end = time.time()
sched = llm.llm_engine.vllm_config.scheduler_config
print("BENCH " + json.dumps({"n": len(outs), "ok": len(outs), "startup_s": t_start - t0, "ready_s": t_ready - t0,
                             "batch_s": t_end - t_start, "max_num_seqs": sched.max_num_seqs,
                             "max_num_batched_tokens": sched.max_num_batched_tokens,
                             "out_tok": sum(len(o.outputs[0].token_ids) for o in outs)}), flush=True)
"""


@dataclass
class Samples:
    """nvidia-smi and per-process CPU samples, taken in the background for the whole benchmark."""

    smi: list[tuple[float, float, float]] = field(default_factory=list)  # (time, MiB used, % busy)
    cpu: list[tuple[float, int, str, float]] = field(default_factory=list)  # (time, pid, name, % of a core)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._cpu, daemon=True)]
        if shutil.which("nvidia-smi"):
            threads.append(threading.Thread(target=self._smi, daemon=True))
        for t in threads:
            t.start()
        return threads

    def _smi(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=timestamp,memory.used,utilization.gpu", "--format=csv,noheader,nounits",
               "-lms", "500"]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                if self.stop.is_set():
                    proc.terminate()
                    break
                parts = [x.strip() for x in line.split(",")]
                with contextlib.suppress(ValueError, IndexError):
                    t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                    self.smi.append((t, float(parts[1]), float(parts[2])))

    def _cpu(self) -> None:
        import psutil

        procs: dict[int, Any] = {}
        while not self.stop.wait(1.0):
            now = time.time()
            for p in psutil.process_iter(["name"]):
                if p.pid not in procs:
                    procs[p.pid] = p
                    with contextlib.suppress(psutil.Error):
                        p.cpu_percent(None)
                    continue
                with contextlib.suppress(psutil.Error):
                    c = procs[p.pid].cpu_percent(None)
                    if c >= 5.0:
                        self.cpu.append((now, p.pid, p.name(), c))


def _engine_flags(args: argparse.Namespace) -> str:
    return " ".join(x for x in (CPU_ENGINE_ARGS if args.cpu else "", args.engine_args) if x)


def _command(tool: str, args: argparse.Namespace, model: Path, batch: Path, out: Path) -> list[str]:
    flags = _engine_flags(args).split()
    if tool == "llm":
        script = args.work / "bench_llm.py"
        script.write_text(_LLM)
        return [sys.executable, str(script), str(model), str(batch), _engine_flags(args)]
    if tool == "batchyard":
        return [sys.executable, "-m", "gateway.cli", "run", "-i", str(batch), "-o", str(out), "--model", str(model),
                "--no-progress", "-v", *flags, *args.batchyard_args.split()]
    return [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(batch), "-o", str(out),
            "--model", str(model), *flags, *args.runbatch_args.split()]


Lines = list[tuple[float, str]]


def _run_tool(tool: str, cmd: list[str], log: Path, timeout: float) -> tuple[int, float, float, Lines]:
    """Run `cmd`; every output line stamped with seconds since its start. (rc, start, end, lines)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x),
           "PYTHONUNBUFFERED": "1"}
    lines: list[tuple[float, str]] = []
    start = time.time()
    with log.open("w") as f, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True,
                                              errors="replace") as proc:
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for raw in proc.stdout:
                t = time.time() - start
                for text in raw.rstrip("\n").split("\r"):  # tqdm's redraws (text mode makes most of them lines)
                    lines.append((t, text))
                    f.write(f"[{t:8.2f}] {text}\n")
            rc = proc.wait()
        finally:
            timer.cancel()
    return rc, start, time.time(), lines


def _batch_phase(tool: str, lines: list[tuple[float, str]]) -> tuple[float | None, float | None, dict[str, Any]]:
    """(end of the batch phase, its length) in seconds since the tool's start, from its own output."""
    if tool == "llm":
        for t, text in lines:
            if text.startswith("BENCH "):
                info = json.loads(text[6:])
                return t, info["batch_s"], info
    elif tool == "runbatch":
        prog = [(t, text) for t, text in lines if "Running batch:" in text]
        done = [t for t, text in prog if "100%" in text]
        if prog and done:
            return done[-1], done[-1] - prog[0][0], {}
    else:
        ready = run = end = None
        for t, text in lines:
            if m := re.search(r"(\d+) requests in ([\d.]+)s", text):
                run, end = float(m.group(2)), t
            if m := re.search(r"local engines ready in ([\d.]+)s", text):
                ready = float(m.group(1))
        if run is not None and ready is not None:
            return end, run - ready, {}
    return None, None, {}


def _read_output(path: Path) -> tuple[int, int]:
    ok = tokens = 0
    with contextlib.suppress(FileNotFoundError):
        for line in path.open():
            if line.strip():
                response = json.loads(line).get("response") or {}
                ok += response.get("status_code") == 200
                tokens += ((response.get("body") or {}).get("usage") or {}).get("completion_tokens") or 0
    return ok, tokens


def summarise(tool: str, n: int, rc: int, start: float, end: float, lines: list[tuple[float, str]],
              out: Path | None, samples: Samples) -> dict[str, Any]:
    wall = end - start
    batch_end, batch, info = _batch_phase(tool, lines)
    note = ""
    if batch_end is None or batch is None or batch <= 0:
        batch_end, batch, note = wall, wall, " (no batch-phase markers in the log: figures over the whole wall)"
    ok, out_tok = (info["ok"], info["out_tok"]) if info else _read_output(out) if out else (0, 0)
    startup = batch_end - batch
    b0, b1 = start + startup, start + batch_end
    mem = [m for t, m, _ in samples.smi if start <= t <= end]
    busy = [u for t, _, u in samples.smi if b0 <= t <= b1]
    per_proc: dict[tuple[str, int], list[float]] = {}
    for t, pid, name, c in samples.cpu:
        if b0 <= t <= b1:
            per_proc.setdefault((name, pid), []).append(c)
    count = max((len(v) for v in per_proc.values()), default=0)
    top = sorted(((sum(v) / count, name) for (name, _), v in per_proc.items()), reverse=True)[:3] if count else []
    res = {"tool": tool, "rc": rc, "n": n, "ok": ok, "wall_s": round(wall, 1), "startup_s": round(startup, 1),
           "batch_s": round(batch, 2), "batch_req_s": round(n / batch, 1), "batch_out_tok_s": round(out_tok / batch),
           "out_tok": out_tok, "gpu_mem_peak_mib": int(max(mem)) if mem else None,
           "gpu_busy_mean_pct": round(statistics.mean(busy)) if busy else None,
           "gpu_busy_median_pct": round(statistics.median(busy)) if busy else None,
           "cpu_top_pct": [(name, round(c)) for c, name in top], **{k: v for k, v in info.items() if "max_" in k}}
    cpu_text = ", ".join(f"{name} {c:.0f}%" for c, name in top) or "n/a"
    gpu_text = (f"GPU mem peak {res['gpu_mem_peak_mib']} MiB, busy {res['gpu_busy_mean_pct']}% mean "
                f"{res['gpu_busy_median_pct']}% median (batch phase)") if mem else "GPU n/a (no nvidia-smi)"
    print(f"RESULT {tool:9s} rc={rc} ok={ok}/{n}  wall {wall:6.1f}s  start-up {startup:5.1f}s  batch {batch:6.2f}s  "
          f"{res['batch_req_s']} req/s  {res['batch_out_tok_s']} out tok/s | {gpu_text} | CPU (batch phase): "
          f"{cpu_text}{note}", flush=True)
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["1b", "tiny"], default=None,
                        help="model size for bench/gpu_model.py (default: 1b, or tiny with --cpu)")
    parser.add_argument("-n", type=int, default=None, help="requests in the batch file (default 5000; 200 with --cpu)")
    parser.add_argument("--max-tokens", type=int, default=None, help="max_tokens per request (default 128; 16 --cpu)")
    parser.add_argument("--system-prompts", type=int, default=0,
                        help="lines share this many long system prompts (prefix-cache case; default 0: none)")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, run in this order (default {','.join(TOOLS)})")
    parser.add_argument("--engine-args", default="",
                        help="vLLM engine flags given to all three tools, e.g. '--max-num-seqs 1024' (default none)")
    parser.add_argument("--batchyard-args", default="", help="extra flags for batchyard run only (default none)")
    parser.add_argument("--runbatch-args", default="", help="extra flags for run_batch only (default none)")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("WORK", "/tmp/gpu-bench")),
                        help="model, batch file and outputs (default $WORK or /tmp/gpu-bench)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-bench-out")),
                        help="logs and summary.jsonl (default $OUT or /tmp/gpu-bench-out)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per tool before it is killed (default 300)")
    parser.add_argument("--cpu", action="store_true",
                        help=f"check the steps on CPU: tiny model, 200 requests, engine flags '{CPU_ENGINE_ARGS}'")
    args = parser.parse_args()
    size = args.size or ("tiny" if args.cpu else "1b")
    n = args.n or (200 if args.cpu else 5000)
    max_tokens = args.max_tokens or (16 if args.cpu else 128)
    tools = [t for t in args.tools.split(",") if t]
    if unknown := [t for t in tools if t not in TOOLS]:
        parser.error(f"unknown tool(s) {unknown}; choose from {', '.join(TOOLS)}")
    if args.cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.work / f"model-{size}"
    batch = args.work / f"batch-{size}-{n}-{max_tokens}-{args.system_prompts}.jsonl"
    started = time.time()
    subprocess.run([sys.executable, str(REPO / "bench" / "gpu_model.py"), "--model", str(model), "--size", size,
                    "--batch", str(batch), "-n", str(n), "--max-tokens", str(max_tokens),
                    "--system-prompts", str(args.system_prompts)], check=True)
    cache = os.environ.get("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "vllm"))
    print(f"== model and batch ready in {time.time() - started:.1f}s; vLLM compile cache: {cache}; "
          f"engine flags: {_engine_flags(args) or '(vLLM defaults)'}", flush=True)

    samples = Samples()
    threads = samples.start()
    results = []
    try:
        for tool in tools:
            out = args.work / f"out-{tool}.jsonl"
            out.unlink(missing_ok=True)
            cmd = _command(tool, args, model, batch, out)
            print(f"== {tool}: {' '.join(cmd)}", flush=True)
            rc, start, end, lines = _run_tool(tool, cmd, args.out / f"{tool}.log", args.timeout)
            if rc != 0:
                print("\n".join(text[:300] for _, text in lines[-15:]))
            time.sleep(1.0)  # a last sample of this run
            results.append(summarise(tool, n, rc, start, end, lines, None if tool == "llm" else out, samples))
    finally:
        samples.stop.set()
        for t in threads:
            t.join(timeout=3)
    with (args.out / "summary.jsonl").open("a") as f:
        for res in results:
            f.write(json.dumps({**res, "size": size, "max_tokens": max_tokens, "cpu": args.cpu,
                                "system_prompts": args.system_prompts, "engine_args": _engine_flags(args)}) + "\n")
    print(f"== done in {time.time() - started:.1f}s; logs and summary.jsonl in {args.out}")
    return 0 if all(r["rc"] == 0 and r["ok"] == n for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
