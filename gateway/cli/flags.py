"""What a flag of `batchyard` accepts: its value's type, and the modes it applies in.

A flag accepted and then ignored would be a lie, so each refusal here is a usage error (exit status 2)
that names the flag: a number that would mean "nothing" (`--claim-idle 0`, `--workers -1`), a flag the
chosen mode does not use (`serve --redis-url U --workers 4`), an engine flag beside `run --config`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

# The run_batch flags `batchyard run` declares (for --help); any other flag is passed through as it is.
ENGINE_OPTIONS = ("dtype", "max_model_len", "enforce_eager", "trust_remote_code", "chat_template", "response_role",
                  "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser")


def refused_run_flag(args: argparse.Namespace, extra: Sequence[str]) -> str | None:
    """`run --config` takes no engine flag (they configure --model's engine), `run --model` no --workers,
    `run --dry-run` neither --data-dir nor --workers."""
    if args.config:
        declared = [f"--{name.replace('_', '-')}" for name in ("served_model_name", *ENGINE_OPTIONS)
                    if getattr(args, name) is not None]
        given = declared + [flag.partition("=")[0] for flag in extra if flag.startswith("-")]
        if given:
            return (f"{', '.join(given)}: engine flags apply with --model only; with --config, set them in the "
                    "config's model_list[].engine_args (served names: model_list[].model_name)")
        if extra:
            return f"unrecognized arguments: {' '.join(extra)}"
    elif args.model and args.workers is not None:
        return "--workers does not apply with --model (one local engine runs every line; workers run upstream routes)"
    if args.retry_failed and (args.data_dir is None or args.dry_run):
        return "--retry-failed needs --data-dir (the run whose failed lines it retries) and no --dry-run"
    if args.dry_run:
        unused = (("--data-dir", args.data_dir), ("--workers", args.workers))
        kept = [flag for flag, value in unused if value is not None]
        if kept:
            return f"{', '.join(kept)}: does not apply with --dry-run (nothing runs, no state is kept)"
    return None


# Numbers a flag takes: argparse refuses anything else with exit status 2, naming the flag. A value that
# would mean "nothing" (a claim idle for 0 s, -1 workers) is refused rather than read as a default.
def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value


def reruns(text: str) -> int:
    """`--output-reruns`: 0 to 10, as `batch_settings.output_check.reruns`."""
    value = count(text)
    if value > 10:
        raise argparse.ArgumentTypeError(f"{text}: must be at most 10")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: not a TCP port (0 to 65535)")
    return value


def positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:  # NaN too: a claim that goes idle at once (or never) means nothing
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number of seconds")
    return value


def refused_flag(args: argparse.Namespace, extra: Sequence[str] = ()) -> str | None:
    """A flag the chosen command and mode would not use, as the message that refuses it (None: all apply).

    Accepted and then ignored would be a lie: `serve --redis-url U --workers 4` would start no worker, and
    `run --config C --dtype float16` would start C's engines with their own dtype.
    """
    if args.command == "run":
        return refused_run_flag(args, extra)
    if args.command == "serve":
        if args.redis_url:
            mode = "shared mode (serve --redis-url: records and the queue in Redis, files in --blobs)"
            given = {"--data-dir": args.data_dir, "--workers": args.workers}
        else:
            mode = "embedded mode (serve without --redis-url: everything in --data-dir)"
            given = {"--blobs": args.blobs, "--claim-idle": args.claim_idle, "--with-worker": args.with_worker,
                     **_redis_flags(args)}
    elif args.command == "worker":
        if args.upstream_only and args.models:
            return "--models does not apply to a worker with --upstream-only (it hosts no local model)"
        if args.redis_url:
            mode, given = "shared mode (worker --redis-url)", {"--data-dir": args.data_dir}
        elif not args.data_dir:
            return None  # no mode chosen: the worker command says it needs one
        else:
            mode = "embedded mode (worker --data-dir)"
            given = {"--blobs": args.blobs, "--claim-idle": args.claim_idle, **_redis_flags(args)}
    else:
        return None
    wrong = [flag for flag, value in given.items() if value not in (None, False)]
    return f"{wrong[0]} does not apply in {mode}" if wrong else None


def _redis_flags(args: argparse.Namespace) -> dict[str, object]:
    return {"--redis-ca-file": args.redis_ca_file, "--allow-evicting-redis": args.allow_evicting_redis}


__all__ = ["ENGINE_OPTIONS", "count", "port", "positive_int", "positive_seconds", "refused_flag", "refused_run_flag"]
