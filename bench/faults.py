"""Benchmark: faults of the machine injected into a running batch, on real processes; and a soak.

    python bench/faults.py [--only NAME] [--repeat N]
    python bench/faults.py --soak 30m [--soak-lines 20] [--soak-every 2]

Each fault runs on a fresh gateway (embedded or shared, as the fault needs), a loopback upstream that counts
its calls, and a batch of `--lines` lines that is running when the fault starts. One row per fault:
- downtime: how long the fault lasted (injected to cleared);
- recover: from the fault's clearing until lines complete again at the rate before it;
- lost: custom_ids missing from (or repeated in) the merged output and error files (aim 0);
- failed: lines failed because of the fault (aim 0; the hung-upstream fault's own hung lines fail with
  `upstream_timeout` by design and are not counted);
- extra calls: upstream calls beyond one per line (retries after the fault);
- another team's `GET /v1/batches` p50/p99 during the fault (aim p99 <= 50 ms).
`--repeat N` prints the median of N runs. The load average and the git commit are printed at the top.

`--soak DURATION` (30m, 2m, 90s): see bench/_faults_soak.py. Not a test: a shared machine is noisy.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench._faults_setup import git_commit  # noqa: E402
from bench._faults_soak import parse_duration, soak  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="run one fault by name (default: every fault)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per fault; the row is their median (default 1)")
    parser.add_argument("--lines", type=int, default=2_000, help="lines of the batch running at the fault")
    parser.add_argument("--soak", default=None, metavar="DURATION",
                        help="instead of the faults: a steady load for DURATION (e.g. 30m) in both modes")
    parser.add_argument("--soak-lines", type=int, default=20, help="lines per soak batch (default 20)")
    parser.add_argument("--soak-every", type=float, default=2.0, help="seconds between soak batches per mode")
    args = parser.parse_args()
    one, five, fifteen = os.getloadavg()
    print(f"commit {git_commit()}   load average {one:.2f} {five:.2f} {fifteen:.2f}   cpus {os.cpu_count()}",
          flush=True)
    if args.soak is not None:
        soak(parse_duration(args.soak), args.soak_lines, args.soak_every)
        return
    from bench._faults_cases import run_faults

    run_faults(args.only, args.repeat, args.lines)


if __name__ == "__main__":
    main()
