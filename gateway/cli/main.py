"""The `batchyard` command: `run` (offline, a drop-in for vLLM's run_batch), `serve`, `worker`, `submit` (a
client of a gateway)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from gateway import tracing
from gateway.cli import console
from gateway.cli.config_check import check_router, check_router_apart
from gateway.cli.flags import ENGINE_OPTIONS, count, port, positive_int, positive_seconds, refused_flag, reruns
from gateway.cli.heap import StartupHeap
from gateway.config.litellm.notices import notice_text
from gateway.config.schema import Config, load_config, local_model_config
from gateway.errors import ConfigError, GatewayError
from gateway.log_safe import escape_every_handler
from gateway.runtime.loop import loop_factory

EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_DELIVERY, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
REDIS_URL_ENV = "BATCHYARD_REDIS_URL"  # serve's and worker's --redis-url, where a flag would show its password
STRICT_HELP = ("refuse to start (exit status 2) when the config holds LiteLLM settings batchyard does not apply, "
               "instead of naming them once at start (as batch_settings.strict_config: true; default: off)")

_RUN_EPILOG = """\
examples:
  batchyard run -i batch.jsonl -o results.jsonl --config config/team.yaml
  batchyard run -i batch.jsonl -o results.jsonl --model meta-llama/Meta-Llama-3-8B-Instruct
  batchyard run -i https://bucket/in.jsonl?sig=… -o https://bucket/out.jsonl?sig=… --config team.yaml

Lines whose model is unknown, whose url is unsupported, or that ask for
stream=true are answered in place with 404/400 error lines, as run_batch does.
Lines that are not JSON, lack custom_id/method/url/body, or repeat a
custom_id make the whole file invalid: every such line is listed with its
1-based number, nothing is sent, and the exit status is 1.

With --model (vLLM run_batch's mode) a repeated custom_id is not an error: each
line is answered in its own input position and one warning is printed; an
empty input file gives an empty output and exit status 0. With --config the
file follows OpenAI's rules (duplicate_custom_id, empty_file), as the server does.

Any other --flag [VALUE] is passed to the local vLLM engine as an engine argument,
as run_batch takes it (e.g. --gpu-memory-utilization 0.8 --max-num-seqs 64
--enable-prefix-caching); a flag without a value means true. Engine flags apply
with --model only: with --config they are refused (exit status 2), since the
config's engines take theirs from model_list[].engine_args.

Quiet and offline by default: vLLM, torch and LiteLLM output goes to a log file
named in the summary (-v: to stderr instead); LiteLLM's bundled price map is used
(LITELLM_LOCAL_MODEL_COST_MAP=True), vLLM usage stats are off, and a model that
is a local directory is loaded with HF_HUB_OFFLINE=1 (set these to override).

exit status: 0 done (per-line errors are in the output), 1 bad input,
2 bad usage or config, 3 output could not be delivered (kept locally), 130 interrupted.
"""


def _run_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run", help="run one batch file offline and write one merged output file",
        description="Run an OpenAI-format batch file: every line routed by its model, one merged output "
        "file in input order.",
        epilog=_RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-i", "--input-file", required=True, help="batch file: a path, - for stdin, or an http(s) URL")
    p.add_argument("-o", "--output-file", required=True,
                   help="output file: a path, - for stdout, or an http(s) URL to PUT to (e.g. presigned S3)")
    p.add_argument("--config", help="LiteLLM-style YAML with model_list (see config/)")
    p.add_argument("--strict-config", action="store_true", help=STRICT_HELP)
    p.add_argument("--error-file", help="write failed requests here instead of inline in the output (like OpenAI)")
    p.add_argument("--data-dir", help="keep the run's state here instead of a temporary directory; the same "
                   "command run again after a kill or Ctrl-C continues where it stopped (finished requests are "
                   "not sent again)")
    p.add_argument("--retry-failed", action="store_true",
                   help="with --data-dir: run the lines of the finished run in it that have no 2xx reply again "
                   "(failed, expired, cancelled), then rewrite the output (and error) file with every line once, in "
                   "input order, the new results in place (same input and --error-file as the run)")
    p.add_argument("--output-reruns", type=reruns, default=None, metavar="N",
                   help="run a line whose reply does not match the schema its request asked for (response_format, "
                   "strict tools, text.format) up to N more times, 0 to 10; 0: check only (default: "
                   "batch_settings.output_check.reruns, 2)")
    p.add_argument("--workers", type=count, default=None,
                   help="extra worker processes for the upstream routes, started when the file has at least 2000 "
                   "upstream requests (default: one per free core: the usable cores less one for this process, "
                   "one per local model and those the load average says are busy; 0: none; with --config only)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the file and print what it would cost per model (lines, input tokens, the output-token "
                   "bound, cost low and high) and the errors it would hit; send nothing, start no engine, write no "
                   "output (exit status 1 when the file would fail)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="library and engine output on stderr instead of the log file")
    p.add_argument("--log-file", help="where library and engine output goes (default: a new file in the temp "
                   "directory, named in the summary; removed when nothing was written)")
    engine = p.add_argument_group("local engine (vLLM run_batch compatible, used with --model)")
    engine.add_argument("--model", help="run every line on a local vLLM engine for this model (path or hub id)")
    engine.add_argument("--served-model-name", nargs="+", help="model names the lines may use (default: --model)")
    engine.add_argument("--dtype", help="weights and activations dtype (auto, float16, bfloat16, float32)")
    engine.add_argument("--max-model-len", type=positive_int, help="context length")
    engine.add_argument("--enforce-eager", action="store_true", default=None, help="disable CUDA graphs")
    engine.add_argument("--output-tmp-dir", help="directory for the output while it is written (run_batch's flag)")
    engine.add_argument("--trust-remote-code", action="store_true", default=None,
                        help="allow the model's own code from its folder or the hub")
    engine.add_argument("--chat-template", help="chat template: a file path or the template itself")
    engine.add_argument("--response-role", help="role of the generated message when add_generation_prompt is "
                        "true (default: assistant)")
    engine.add_argument("--enable-auto-tool-choice", action="store_true", default=None,
                        help="let the model call tools on its own (needs --tool-call-parser)")
    engine.add_argument("--tool-call-parser", help="parser of the model's tool calls (e.g. hermes, llama3_json)")
    engine.add_argument("--reasoning-parser", help="parser that splits reasoning from content (e.g. qwen3, "
                        "deepseek_r1)")
    return p


DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 4000
DEFAULT_DATA_DIR, DEFAULT_BLOBS = ".batchyard/data", ".batchyard/blobs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchyard",
        description="A batch gateway for LLM work: OpenAI batch files in, one merged output out, routed to a "
        "local vLLM engine or to upstream providers through LiteLLM.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log more: library output on stderr (run), the server's debug log (serve), INFO logs "
                        "(worker); also accepted after the command (default: off)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(sub)
    _serve_parser(sub)
    _worker_parser(sub)
    from gateway.cli.submit import add_parser as _submit_parser  # its own module: the client side

    _submit_parser(sub)
    from gateway.cli.spend import add_parser as _spend_parser

    _spend_parser(sub)
    from gateway.cli.config_check import add_parser as _config_parser

    _config_parser(sub)
    return parser


def _serve_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve", help="serve the OpenAI Files + Batches API",
        description="Serve the OpenAI Files + Batches API (also Azure and LiteLLM routes). Embedded mode (the "
        "default): records, queue and files in --data-dir on this machine, shards run by --workers processes. "
        "Shared mode (--redis-url): records and the queue in Redis, files in --blobs; run as many replicas "
        "and `batchyard worker`s as you like. A flag of the other mode is refused.",
    )
    serve.add_argument("--config", required=True, help="LiteLLM-style YAML config (see config/ and the README)")
    serve.add_argument("--strict-config", action="store_true", help=STRICT_HELP)
    serve.add_argument("--host", default=DEFAULT_HOST,
                       help=f"address to listen on (default: {DEFAULT_HOST}; 0.0.0.0: every interface)")
    serve.add_argument("--port", type=port, default=DEFAULT_PORT, help=f"port to listen on (default: {DEFAULT_PORT})")
    serve.add_argument("--data-dir", help=f"embedded mode: records and files live here (default: {DEFAULT_DATA_DIR}); "
                       "a restart over the same directory resumes unfinished batches")
    serve.add_argument("--workers", type=count, default=None,
                       help="embedded mode: worker processes that run shards (default: one per free core: the "
                       "usable cores less one for the API process and one per local model, at least one; one when "
                       "the config has no upstream route; the load average is never read; 0: run them in the API "
                       "process). Local vLLM engines load in the first worker only")
    serve.add_argument("--forwarded-allow-ips", default=None, metavar="IPS",
                       help="addresses (comma-separated; * for any) of the proxies whose X-Forwarded-Proto and "
                       "X-Forwarded-For this server believes, as uvicorn's flag of that name (default: uvicorn's: "
                       "$FORWARDED_ALLOW_IPS, else 127.0.0.1). Behind a TLS proxy, list it: the dashboard's "
                       "cookie is then Secure and its login checks the https origin")
    _shared_args(serve)
    serve.add_argument("--with-worker", action="store_true",
                       help="shared mode: also run shards, for every route, in this API process (default: off)")
    _verbose(serve)


def _worker_parser(sub: Any) -> None:
    worker = sub.add_parser("worker", help="run shards for the models hosted here (shared or embedded mode)",
                            description="A worker: runs the shards of its routes. Shared mode (--redis-url): from "
                            "Redis Streams, results in Redis, files in the shared blob store. Embedded mode "
                            "(--data-dir): over the data directory of a `batchyard serve` on this machine, which "
                            "starts its own workers (--workers) so you rarely start one by hand.")
    worker.add_argument("--config", required=True, help="LiteLLM-style YAML config (the API replicas' one)")
    worker.add_argument("--strict-config", action="store_true", help=STRICT_HELP)
    _shared_args(worker)
    worker.add_argument("--data-dir", help="embedded mode: the data directory of the serve process on this machine "
                        "(no default: give --redis-url or --data-dir)")
    worker.add_argument("--models", help="comma-separated local models this worker hosts (default: every local "
                        "model of the config); upstream models are always served")
    worker.add_argument("--upstream-only", action="store_true",
                        help="host no local model, only the upstream routes (default: off; not with --models)")
    worker.add_argument("--parent-pid", type=positive_int, help=argparse.SUPPRESS)  # set by the process that starts it
    worker.add_argument("--metrics-port", type=port,
                        help="serve this worker's own Prometheus /metrics on this port (default: none; for a worker "
                        "that shares no PROMETHEUS_MULTIPROC_DIR with an API process; batch_settings.metrics "
                        "applies)")
    worker.add_argument("--metrics-host", default="127.0.0.1",
                        help="address of --metrics-port (default: 127.0.0.1; 0.0.0.0: every interface)")
    _verbose(worker)


def _verbose(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: given before the command (batchyard -v serve) or after it (batchyard serve -v), it counts
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log more (as batchyard -v; default: off)")


def _shared_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", help="shared mode: records and the shard queue in this Redis or Redis Cluster "
                   "(redis://[user:password@]host:port/0, rediss:// for TLS; default: $BATCHYARD_REDIS_URL, where a "
                   "password stays out of `ps`; neither: embedded mode)")
    p.add_argument("--redis-ca-file", help="shared mode: the CA certificate(s) that signed a rediss:// Redis's "
                   "certificate (default: the system's CAs, or the URL's ssl_ca_certs=)")
    p.add_argument("--allow-evicting-redis", action="store_true",
                   help="shared mode: run on a Redis whose maxmemory-policy is not noeviction, which may drop "
                   "batches under memory pressure (default: off: such a Redis is refused at start)")
    # "storage" is the teams' byte ledger (quota), so the flag is named for what it sets: where the Blobs live.
    # --storage, its earlier name, is still taken, so existing deployments keep working.
    p.add_argument("--blobs", "--storage", dest="blobs", metavar="LOCATION",
                   help="shared mode: where file bytes live: s3://bucket/prefix (endpoint: $BATCHYARD_S3_ENDPOINT_URL "
                   "or $AWS_ENDPOINT_URL_S3) or a directory every process reaches (default: "
                   f"{DEFAULT_BLOBS}; --storage is its earlier name)")
    p.add_argument("--claim-idle", type=positive_seconds, default=None,
                   help="shared mode: seconds a dead worker's shard waits before another worker takes it over "
                   "(default: 30)")





def _engine_args(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """run_batch's engine flags, plus any other --flag value pairs, as vLLM engine args."""
    engine: dict[str, Any] = {}
    for name in ENGINE_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            engine[name] = value
    i = 0
    while i < len(extra):
        flag = extra[i]
        if not flag.startswith("--"):
            raise ConfigError("command line", flag, "unexpected argument")
        name, _, inline = flag[2:].partition("=")
        key = name.replace("-", "_")
        if inline:
            engine[key] = _parse_value(inline)
        elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            engine[key] = _parse_value(extra[i + 1])
            i += 1
        else:
            engine[key] = True
        i += 1
    return engine


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _load(args: argparse.Namespace, extra: list[str]) -> Config:
    if args.config and args.model:
        raise ConfigError("command line", "--model", "use either --config or --model, not both")
    if args.config:
        config = load_config(args.config, strict=args.strict_config)  # engine flags beside it were refused
        if config.notices:  # once, at start
            console.say(notice_text(config.notices))
        check_router(config)  # what config check builds: a Router LiteLLM refuses is a config error (exit 2)
        return config
    if args.model:
        return local_model_config(args.model, _engine_args(args, extra), args.served_model_name)
    raise ConfigError("command line", "--config/--model", "one of them is required")


def quiet_libraries(verbose: bool) -> None:
    """LiteLLM logs every retry and model-map miss at ERROR through its own handlers; keep them for -v."""
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING if verbose else logging.CRITICAL)
        if not verbose:
            logger.handlers.clear()
            logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    """The command line; `argv` given means called as a function: stdout/stderr descriptors are left alone."""
    code = _main(argv)
    if argv is None and "local_engine.backend" in sys.modules:  # an engine may still be loading in its thread
        from local_engine.backend import exit_while_loading

        tracing.shutdown()  # the spans buffered, sent before the process ends without its own exit
        exit_while_loading(code)
    return code


def _main(argv: list[str] | None) -> int:
    own_process = argv is None
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in ("serve", "worker") and not args.redis_url:
        args.redis_url = os.environ.get(REDIS_URL_ENV) or None  # a secret's URL, out of `ps`
    refused = refused_flag(args, extra)
    if refused is not None:
        parser.error(refused)  # exit status 2, as for any bad usage
    if args.command == "run":
        console.setup(verbose=args.verbose, log_file=args.log_file, own_process=own_process)
    elif args.command == "worker":
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        escape_every_handler()
    quiet_libraries(args.verbose)
    try:
        if args.command == "run":
            return _run_command(args, extra, own_process=own_process)
        if args.command == "worker":
            from gateway.cli.worker import run_worker_command

            args.blobs = args.blobs or DEFAULT_BLOBS
            return run_worker_command(args)
        if args.command == "serve":
            return _serve_command(args)
        if args.command == "config":
            from gateway.cli.config_check import check_command

            return check_command(args)
        if args.command == "submit":
            from gateway.cli.submit import submit_command

            return submit_command(args)
        if args.command == "spend":
            from gateway.cli.spend import spend_command

            return spend_command(args)
    except ConfigError as exc:
        console.say(f"config error: {exc}")
        return EXIT_USAGE
    except GatewayError as exc:
        console.say(exc.message)
        return EXIT_INPUT
    except KeyboardInterrupt:
        console.say("interrupted")
        return EXIT_INTERRUPTED
    return EXIT_USAGE


def _serve_command(args: argparse.Namespace) -> int:
    config = load_config(args.config, strict=args.strict_config)  # a bad config fails here
    if args.redis_url and not args.with_worker:  # no process of this serve builds LiteLLM's Router: a child does
        check_router_apart(config)
    log_level = "debug" if args.verbose else "info"  # the server's log (uvicorn's included)
    if args.redis_url:
        from gateway.cli.serve import serve_shared

        serve_shared(args.config, args.host, args.port, redis_url=args.redis_url,
                     blobs=args.blobs or DEFAULT_BLOBS, with_worker=args.with_worker,
                     claim_idle=args.claim_idle, log_level=log_level, redis_ca_file=args.redis_ca_file,
                     allow_evicting_redis=args.allow_evicting_redis, forwarded_allow_ips=args.forwarded_allow_ips)
    else:
        from gateway.cli.serve import serve

        serve(args.config, args.host, args.port, Path(args.data_dir or DEFAULT_DATA_DIR), workers=args.workers,
              log_level=log_level, forwarded_allow_ips=args.forwarded_allow_ips)
    return EXIT_OK


def _run_command(args: argparse.Namespace, extra: list[str], *, own_process: bool = False) -> int:
    heap = StartupHeap()
    if own_process:  # a frozen heap is never collected: only where the process ends with the run
        heap.pause()
    try:
        return _run_file(args, extra, heap if own_process else None)
    finally:
        heap.resume()


def _run_file(args: argparse.Namespace, extra: list[str], heap: StartupHeap | None) -> int:
    config = _load(args, extra)
    tracing.start_process("run", config.batch.tracing)
    from gateway.cli.offline import RunOptions, run_batch_file

    opts = RunOptions(
        input=args.input_file, output=args.output_file, error_file=args.error_file,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        output_tmp_dir=Path(args.output_tmp_dir) if args.output_tmp_dir else None,
        progress=not (args.no_progress or args.quiet), summary=not args.quiet,
        run_batch_errors=bool(args.model),  # the drop-in writes errors as run_batch does
        config_path=args.config, workers=args.workers, verbose=args.verbose, dry_run=args.dry_run,
        output_reruns=args.output_reruns,
        on_started=heap.freeze if heap is not None else None,
    )
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            if args.retry_failed:
                from gateway.cli.rerun import retry_failed_run

                return runner.run(retry_failed_run(config, opts))
            return runner.run(run_batch_file(config, opts))
    except (ConfigError, GatewayError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the traceback goes to the log; the terminal gets one line
        logging.getLogger("batchyard").exception("run failed")
        where = console.log_path()
        console.say(f"failed: {type(exc).__name__}: {exc}" + (f" (details in {where})" if where else ""))
        return EXIT_INPUT


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
