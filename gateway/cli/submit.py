"""`batchyard submit`: one batch file through a shared gateway (or any OpenAI-compatible Batch API), end to end.

Through the `openai` SDK (its own retry rules for transport errors; the key from OPENAI_API_KEY, the URL
from --base-url or OPENAI_BASE_URL, one of them required: never the SDK's default host, where the team's
key would go otherwise): upload the file and create the batch, each with
an `Idempotency-Key` derived from the input's sha256 (and the endpoint, window and metadata), so a rerun
after a dropped connection or a kill finds the same file and batch and never makes a second (a file over
200 MB, or any with `--chunked`, goes through the Uploads API instead, resumable part by part:
`gateway.cli.chunked`); follow the
batch's live request_counts; write its results as they arrive (`GET /v1/batches/{id}/results`, by cursor,
resumable: `gateway.cli.follow`); when it ends, leave the complete output (and error) file in input order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from gateway import tracing
from gateway.cli.chunked import CHUNKED_OVER, drop_upload_state, part_size, upload_in_parts, upload_state_path
from gateway.cli.console import say
from gateway.cli.follow import Arrivals, State, load_state, save_state, state_path, write_final

if TYPE_CHECKING:  # the SDK is imported when a batch is submitted: every other command parses without it
    import openai
    from openai import OpenAI

EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_DELIVERY, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
FINISHED = ("completed", "failed", "expired", "cancelled")
_KEY_PREFIX = "batchyard-submit-"

EPILOG = """\
examples:
  export OPENAI_API_KEY=sk-team-key
  batchyard submit -i batch.jsonl -o results.jsonl --base-url http://gateway:4000/v1
  batchyard submit -i batch.jsonl -o results.jsonl --error-file errors.jsonl --detach
  batchyard submit -i big.jsonl -o results.jsonl --chunked --part-size 32M

A file over 200 MB (or any, with --chunked) goes through the Uploads API in parts of up to 64 MB, a
progress line per part; the parts sent are noted beside the output, so a rerun sends only the missing ones.
Run the same command again after a kill, a dropped connection or --detach: it finds the same file and
batch (idempotency keys from the input's sha256) and goes on writing where it stopped. Ctrl-C asks
whether to cancel the batch (without a terminal: leaves it running).

exit status: 0 done (per-line errors are in the output), 1 the file is invalid or the gateway refused it,
2 bad usage or a key the gateway refuses, 3 the gateway could not be reached or the output not written,
130 interrupted.
"""


def _pair(text: str) -> str:
    if "=" not in text or not text.partition("=")[0]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return text


def _part_size(text: str) -> int:
    try:
        return part_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "submit", help="submit one batch file to a gateway, follow it, write the merged output",
        description="Upload a batch file to a batchyard gateway (or any OpenAI Batch API), create the batch, "
        "write its results as they arrive and leave the merged output when it ends. The key is read from "
        "OPENAI_API_KEY, as the openai SDK reads it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-i", "--input-file", required=True, help="batch file (a local path)")
    p.add_argument("-o", "--output-file", required=True,
                   help="output file (a local path): results appended as they arrive, replaced by the batch's "
                   "merged output in input order when it ends; its state is kept beside it while it runs")
    p.add_argument("--error-file", help="write failed requests here instead of inline in the output (like OpenAI)")
    p.add_argument("--base-url", help="the gateway's API root, e.g. http://gateway:4000/v1 (default: "
                   "$OPENAI_BASE_URL; one of the two is required: the team key never goes to a default host)")
    p.add_argument("--endpoint", help="the batch's endpoint (default: the url of the file's first line)")
    p.add_argument("--completion-window", default="24h", help="the batch's completion window (default: 24h)")
    p.add_argument("--metadata", action="append", metavar="KEY=VALUE", type=_pair,
                   help="a metadata pair of the batch; repeat for more (default: none)")
    p.add_argument("--detach", action="store_true",
                   help="print the batch id and return once it is created (the same command without it follows it)")
    p.add_argument("--chunked", action="store_true",
                   help="send the file through the Uploads API in parts, resumable (default: only a file over "
                   "200 MB, which POST /files would refuse)")
    # a str default goes through `type` as a typed value would: the help and the default say the same
    p.add_argument("--part-size", type=_part_size, default="64M", metavar="SIZE",
                   help="bytes per part of a chunked upload, or with K or M (default: 64M, OpenAI's most)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at a running batch (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")


def submit_command(args: argparse.Namespace) -> int:
    import openai
    from openai import OpenAI

    metadata = dict(pair.partition("=")[::2] for pair in args.metadata or [])
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if not base_url:  # the SDK would fall back to api.openai.com, and send the team's key there
        say("no gateway to send to: pass --base-url (e.g. http://gateway:4000/v1) or set OPENAI_BASE_URL")
        return EXIT_USAGE
    try:
        client = OpenAI(base_url=base_url)  # OPENAI_API_KEY, as the SDK reads it
        sha, md5, first_url = _inspect(args.input_file)
    except openai.OpenAIError as exc:
        say(f"{exc}")
        return EXIT_USAGE
    except OSError as exc:
        say(f"cannot read {args.input_file}: {exc.strerror or exc}")
        return EXIT_INPUT
    tracing.start_process("submit")
    try:
        with tracing.client_span("batchyard.submit"):  # the gateway's spans join this trace (traceparent)
            traced = client.with_options(default_headers=tracing.headers()) if tracing.enabled() else client
            return _submit(traced, args, (sha, md5), args.endpoint or first_url, metadata)
    except openai.AuthenticationError as exc:
        say(f"the gateway refused the key (401): set OPENAI_API_KEY to a key of your team ({_message(exc)})")
        return EXIT_USAGE
    except openai.PermissionDeniedError as exc:
        say(f"the key may not do this (403): {_message(exc)}")
        return EXIT_USAGE
    except openai.APIStatusError as exc:
        say(f"the gateway refused the request ({exc.status_code}): {_message(exc)}")
        if upload_state_path(args.output_file).exists():
            say("the parts sent so far are kept: the same command sends the rest")
        return EXIT_INPUT
    except openai.APIConnectionError as exc:
        say(f"could not reach the gateway at {client.base_url} ({exc}); the same command goes on where it stopped")
        return EXIT_DELIVERY


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    return str(body.get("message") or exc.message)


def _inspect(path: str) -> tuple[str, str, str]:
    """The file's sha256, its md5 (a chunked upload's check) and its first line's url (the batch's endpoint
    unless --endpoint), streamed."""
    digest, md5, first_url = hashlib.sha256(), hashlib.md5(usedforsecurity=False), ""
    with open(path, "rb") as source:
        for raw in source:
            digest.update(raw)
            md5.update(raw)
            if not first_url and raw.strip():
                try:
                    first_url = str(json.loads(raw).get("url") or "")
                except (ValueError, AttributeError):
                    first_url = "/v1/chat/completions"  # the gateway's validation will name the bad line
    url = "/" + (first_url or "/v1/chat/completions").lstrip("/")
    return digest.hexdigest(), md5.hexdigest(), url if url.startswith("/v1/") else "/v1" + url


def _key(*parts: object) -> str:
    return _KEY_PREFIX + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _submit(client: OpenAI, args: argparse.Namespace, sums: tuple[str, str], endpoint: str,
            metadata: dict[str, str]) -> int:
    sha, md5 = sums
    state = load_state(args.output_file, sha)
    if state is None:
        size = os.path.getsize(args.input_file)
        if args.chunked or size > CHUNKED_OVER:
            file_id = upload_in_parts(client, args.input_file, sha=sha, md5=md5, size=size,
                                      part_bytes=args.part_size, output=args.output_file,
                                      progress=not args.no_progress)
            batch_key = _key("batch", file_id, endpoint, args.completion_window, metadata)
        else:
            file_key = _key("file", sha)
            with open(args.input_file, "rb") as source:
                file_id = client.files.create(file=(_name(args.input_file), source), purpose="batch",
                                              extra_headers={"Idempotency-Key": file_key}).id
            batch_key = _key("batch", file_key, endpoint, args.completion_window, metadata)
        batch = client.batches.create(
            input_file_id=file_id, endpoint=endpoint, completion_window=args.completion_window,
            metadata=metadata or None, extra_headers={"Idempotency-Key": batch_key},
        )
        state = State(input_sha256=sha, batch_id=batch.id)
        save_state(args.output_file, state)
        drop_upload_state(args.output_file)  # the batch's state says it all from here
        say(f"created batch {batch.id} from {file_id}")
    else:
        say(f"resuming batch {state.batch_id} (state in {state_path(args.output_file)})")
    if args.detach:
        print(state.batch_id, flush=True)
        say("detached: the same command without --detach follows the batch and writes its output")
        return EXIT_OK
    return _follow(client, args, state)


def _name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] or "batch.jsonl"


def _follow(client: OpenAI, args: argparse.Namespace, state: State) -> int:
    arrivals = Arrivals(state, args.output_file, args.error_file)
    progress = _Progress(enabled=not args.no_progress)
    interrupted = False
    try:
        while True:
            try:
                more, status = arrivals.page(client)
                if more:
                    continue
                batch = client.batches.retrieve(state.batch_id)
                progress.show(batch)
                if status in FINISHED and batch.status in FINISHED:
                    break
                time.sleep(args.poll)
            except KeyboardInterrupt:
                if interrupted or not _cancel_asked(state.batch_id):
                    progress.close()
                    say(f"left running: batch {state.batch_id}; the same command goes on where it stopped")
                    return EXIT_INTERRUPTED
                interrupted = True
                client.batches.cancel(state.batch_id)
                say(f"cancelling batch {state.batch_id}; waiting for it to end (Ctrl-C again: leave it)")
    finally:
        progress.close()
        arrivals.close()
    return _finish(client, args, batch, interrupted)


def _cancel_asked(batch_id: str) -> bool:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    try:
        answer = input(f"\ncancel batch {batch_id}? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        return False
    return answer.strip().lower() in ("y", "yes")


def _finish(client: OpenAI, args: argparse.Namespace, batch: Any, interrupted: bool) -> int:
    if batch.status == "failed":
        errors = batch.errors.data if batch.errors and batch.errors.data else []
        say(f"batch {batch.id} failed: the input file is invalid; nothing was sent ({len(errors)} problem(s)):")
        for err in errors[:20]:
            where = f"line {err.line}" if err.line is not None else "file"
            say(f"  {where}: {err.code}: {err.message}")
        state_path(args.output_file).unlink(missing_ok=True)
        return EXIT_INPUT
    try:
        n_out, n_err = write_final(client, batch, args.input_file, args.output_file, args.error_file)
    except OSError as exc:
        say(f"could not write the output: {exc}; the same command tries again")
        return EXIT_DELIVERY
    state_path(args.output_file).unlink(missing_ok=True)
    counts = batch.request_counts
    say(f"batch {batch.id} {batch.status}: {counts.total if counts else n_out + n_err} requests, "
        f"{counts.completed if counts else n_out} succeeded, {counts.failed if counts else n_err} failed; "
        f"output in {args.output_file}" + (f", errors in {args.error_file}" if args.error_file else ""))
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


class _Progress:
    """A tqdm bar on a terminal; plain lines on stderr otherwise (when the counts change, at most every 2 s)."""

    def __init__(self, enabled: bool):
        self.enabled, self.last, self.said_at = enabled, (-1, -1), 0.0
        self.bar: Any = None
        self.tty = sys.stderr.isatty()

    def show(self, batch: Any) -> None:
        counts = batch.request_counts
        if not self.enabled or counts is None or not counts.total:
            return
        done = counts.completed + counts.failed
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=counts.total, unit="req", desc=batch.id[-12:], file=sys.stderr)
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(f"{batch.status}, {counts.failed} failed", refresh=False)
        elif (done, counts.total) != self.last and time.monotonic() - self.said_at >= 2:
            self.last, self.said_at = (done, counts.total), time.monotonic()
            say(f"batch {batch.id} {batch.status}: {done}/{counts.total} answered ({counts.failed} failed)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


__all__ = ["add_parser", "submit_command"]
