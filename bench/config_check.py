"""Benchmark: `batchyard config check` on each YAML config the pinned LiteLLM ships in its wheel.

    .venv/bin/python bench/config_check.py [--repeat 1]

Each config of the population (tests/servers/test_litellm_population.py: every proxy config under
`litellm/proxy/`, read as shipped) is checked by a whole `batchyard config check` process, imports included,
as a user runs it; its `os.environ/` variables are set (base URLs at an address nothing listens on: the
check makes no call). Prints each file's wall time, its CPU seconds (user + sys of the process: on a loaded
machine the wall time is mostly waiting) and exit status, then the median and the slowest of each. The load
average is printed at both ends. Not a test: numbers on a shared machine are noisy. `--only` times the files
whose name holds one of its words.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.servers.test_litellm_population import POPULATION, PROXY  # noqa: E402  # the one list of configs


def _env() -> dict[str, str]:
    import re

    names: set[str] = set()
    for name in POPULATION:
        names |= set(re.findall(r"os\.environ/([A-Za-z_][A-Za-z0-9_]*)", (PROXY / name).read_text()))
    values = {name: "http://127.0.0.1:9/v1" if re.search(r"BASE|URL", name) else "sk-bench" for name in names}
    return {**os.environ, **values, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per file; its median is the file's time")
    parser.add_argument("--only", nargs="*", default=[], help="time only the files whose name holds one of these")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    env = _env()
    times: dict[str, float] = {}
    cpus: dict[str, float] = {}
    for name in sorted(n for n in POPULATION if not args.only or any(word in n for word in args.only)):
        runs, cpu = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "gateway.cli", "config", "check", str(PROXY / name)],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
            runs.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        times[name], cpus[name] = statistics.median(runs), statistics.median(cpu)
        print(f"{times[name]:6.2f} s  cpu {cpus[name]:5.2f} s  rc {proc.returncode}  {name}", flush=True)
    for label, values in (("wall", times), ("cpu", cpus)):
        slowest = max(values, key=values.__getitem__)
        print(f"{len(values)} configs, {label}: median {statistics.median(values.values()):.2f} s, slowest "
              f"{values[slowest]:.2f} s ({slowest})")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
