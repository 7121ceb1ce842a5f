"""The batch that scripts/compose_e2e.sh runs against the compose stack, from the host, with the `openai` SDK.

A mixed batch (upstream lines answered by the OpenAI stand-in after a delay, local lines on the tiny
Llama) is uploaded and created; once some lines are done and a worker container holds shards in
flight (read from Redis: the queue's consumers), that container is SIGKILLed. The batch must still
complete, its output checked line by line: every custom_id exactly once, each line answered by the
route its model names, no error file. The file and the output must be objects in the S3 stand-in.

    python scripts/e2e_batch.py --base-url http://127.0.0.1:4000/v1 --key sk-master \\
        --redis-url redis://127.0.0.1:6379/0 --s3-endpoint http://127.0.0.1:9000 \\
        --workers project_worker_1,project_worker_2

Exits non-zero, with the reason, on the first check that fails.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from typing import Any, NoReturn

import boto3
import redis
from openai import OpenAI

from gateway.store.redis.keys import GROUP, Keys

UPSTREAM, LOCAL = "gpt-4o-mini", "tiny-llama"  # docker/e2e/team.yaml's two routes
UPSTREAM_DELAY_MS = 6000  # each upstream line waits this long (the stand-in's #sleep): shards stay in flight


def batch_lines(n_upstream: int, n_local: int) -> list[dict[str, Any]]:
    """Upstream and local lines interleaved, so that shards of both routes are open at once."""
    lines = []
    for i in range(max(n_upstream, n_local)):
        if i < n_upstream:
            lines.append({"custom_id": f"up-{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": UPSTREAM, "messages": [
                              {"role": "user", "content": f"upstream line {i} #sleep:{UPSTREAM_DELAY_MS}"}]}})
        if i < n_local:
            lines.append({"custom_id": f"local-{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": LOCAL, "max_tokens": 8, "temperature": 0,
                                   "messages": [{"role": "user", "content": f"local line {i}"}]}})
    return lines


def fail(message: str) -> NoReturn:
    raise SystemExit(f"e2e_batch: FAILED: {message}")


def holders(r: redis.Redis, workers: list[str], podman: str) -> dict[str, int]:
    """Worker container -> shards it holds in flight (its consumers' pending entries, over every stream)."""
    hostnames = {}
    for name in workers:
        out = subprocess.run([podman, "inspect", "--format", "{{.Config.Hostname}}", name],
                             capture_output=True, text=True, check=False)
        if out.returncode == 0:
            hostnames[out.stdout.strip()] = name
    held: dict[str, int] = {}
    keys = Keys()
    queues = [keys.streams(route, team) for route in (UPSTREAM, LOCAL) for team in r.hkeys(keys.teams(route))]
    for stream in (s for queue in queues for s in r.smembers(queue)):
        for consumer in r.xinfo_consumers(stream, GROUP):
            # A worker's consumer name starts with its host name (gateway.runtime.runtime.worker_name: host:pid).
            for host, container in hostnames.items():
                if str(consumer["name"]).startswith(host) and int(consumer["pending"]) > 0:
                    held[container] = held.get(container, 0) + int(consumer["pending"])
    return held


def check_output(lines: list[dict[str, Any]], text: str) -> None:
    sent = {line["custom_id"]: line for line in lines}
    results = [json.loads(row) for row in text.splitlines() if row.strip()]
    ids = [row["custom_id"] for row in results]
    if len(ids) != len(set(ids)):
        fail(f"custom_ids more than once: {sorted({i for i in ids if ids.count(i) > 1})}")
    if set(ids) != set(sent):
        fail(f"output lacks {sorted(set(sent) - set(ids))[:5]}, has extra {sorted(set(ids) - set(sent))[:5]}")
    for row in results:
        line, response = sent[row["custom_id"]], row.get("response") or {}
        where = f"output line for {row['custom_id']}"
        if row.get("error") is not None or response.get("status_code") != 200:
            fail(f"{where}: not a 200: {json.dumps(row)[:300]}")
        body = response["body"]
        message = body["choices"][0]["message"]
        if line["body"]["model"] == UPSTREAM:
            want = "echo: " + line["body"]["messages"][-1]["content"]
            if message["content"] != want:
                fail(f"{where}: content {message['content']!r}, want {want!r} (the upstream stand-in's echo)")
        else:
            if body["model"] != LOCAL or message["role"] != "assistant":
                fail(f"{where}: model {body['model']!r}, role {message['role']!r}")
            if not 1 <= body["usage"]["completion_tokens"] <= 8:
                fail(f"{where}: {body['usage']['completion_tokens']} completion tokens for max_tokens 8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the gateway's /v1 URL")
    parser.add_argument("--key", required=True, help="an API key of the gateway (its master key)")
    parser.add_argument("--redis-url", required=True, help="the stack's Redis, as the host reaches it")
    parser.add_argument("--s3-endpoint", required=True, help="the S3 stand-in, as the host reaches it")
    parser.add_argument("--bucket", default="batchyard", help="the stack's bucket (default batchyard)")
    parser.add_argument("--workers", required=True, help="comma-separated worker container names")
    parser.add_argument("--podman", default="podman", help="the podman binary (default: podman on PATH)")
    parser.add_argument("--upstream-lines", type=int, default=48, help="lines for the upstream route (default 48)")
    parser.add_argument("--local-lines", type=int, default=24, help="lines for the local route (default 24)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds the batch may take (default 300)")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.key, max_retries=5)
    r = redis.Redis.from_url(args.redis_url, decode_responses=True)
    workers = args.workers.split(",")
    lines = batch_lines(args.upstream_lines, args.local_lines)
    payload = "".join(json.dumps(line) + "\n" for line in lines).encode()
    started = time.monotonic()
    upload = client.files.create(file=("e2e.jsonl", io.BytesIO(payload)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    print(f"e2e_batch: {batch.id}: {len(lines)} lines ({args.upstream_lines} upstream, {args.local_lines} local)")

    killed, held_at_kill = None, 0
    deadline = started + args.timeout
    while True:
        batch = client.batches.retrieve(batch.id)
        done = batch.request_counts.completed if batch.request_counts else 0
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            break
        if killed is None and batch.status == "in_progress":
            held = holders(r, workers, args.podman)
            print(f"e2e_batch: {time.monotonic() - started:5.1f}s {batch.status}: {done}/{len(lines)} done, "
                  f"in flight: {held or 'none'}", flush=True)
            if held and done >= 1:
                killed, held_at_kill = max(held, key=lambda name: held[name]), max(held.values())
                subprocess.run([args.podman, "kill", "--signal", "KILL", killed], check=True, capture_output=True)
                print(f"e2e_batch: killed {killed} at {done}/{len(lines)} lines done, holding {held_at_kill} "
                      f"shard(s) in flight")
        if time.monotonic() > deadline:
            fail(f"batch still {batch.status} after {args.timeout:.0f}s ({done}/{len(lines)} done)")
        time.sleep(0.3)
    took = time.monotonic() - started
    if killed is None:
        fail(f"the batch ended ({batch.status}) before a worker could be killed mid-batch")
    if batch.status != "completed":
        fail(f"batch {batch.status}: {batch.errors}")
    counts = batch.request_counts
    if counts is None or (counts.total, counts.completed, counts.failed) != (len(lines), len(lines), 0):
        fail(f"request_counts {counts}, want {len(lines)} completed of {len(lines)}")
    if batch.output_file_id is None:
        fail("a completed batch without an output file")
    if batch.error_file_id is not None:
        fail(f"an error file: {client.files.content(batch.error_file_id).text[:300]}")
    running = subprocess.run([args.podman, "inspect", "--format", "{{.State.Running}}", killed],
                             capture_output=True, text=True, check=True).stdout.strip()
    if running != "false":
        fail(f"{killed} is running again: the other worker did not have to take its shards over")
    check_output(lines, client.files.content(batch.output_file_id).text)

    s3 = boto3.client("s3", endpoint_url=args.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="batchyard", aws_secret_access_key="batchyard-secret")
    objects = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=args.bucket)
               for o in page.get("Contents", [])]
    for file_id in (upload.id, batch.output_file_id):
        if not any(file_id in key for key in objects):
            fail(f"no object for {file_id} in s3://{args.bucket} ({len(objects)} objects)")
    print(f"e2e_batch: ok: {batch.id} completed in {took:.1f}s, {len(lines)} lines each once and as routed, "
          f"with {killed} killed mid-batch; {len(objects)} objects in s3://{args.bucket}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
