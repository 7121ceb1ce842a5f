"""Every door holds the same line (issue 34: Must 1, 2 and 6), against a real `batchyard serve` with the
loopback upstream, the memory of the API process (and of the validation process that reads a create's body)
read with psutil:

- a Message Batch create is bounded before it is parsed: a 14 MB request of 5,000,000 `{}` is refused
  (400) with the API's memory, and the reading process's, within twice the body + 50 MB, and so is an
  accepted body of the same shape spread over many requests; another team's `GET /v1/models` stays quick
  meanwhile;
- so is a create of one long string of escapes (read by a streaming tokenizer, not regexes), and every
  other JSON body the API parses, whatever its content;
- a Message Batch's input counts against its team's own storage, refused in Anthropic's shape (429
  `rate_limit_error`) when over, before the body is read where its length says so; a retry's input and
  every batch's output and error files count too, one account per team;
- a team runs at most `max_estimates_per_team` cost estimates at once (429 `too_many_estimates`);
- the pass-through reads at most `max_passthrough_reply_bytes` of an upstream reply (the line fails);
- `/results` pages are bounded by bytes as well as lines;
- `batchyard submit` refuses to run without a gateway URL (exit 2), never sending the key to a default host.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import REPO_ROOT, Gateway, chat_line, gateway_config, jsonl, start_gateway, wait_batch
from tests.support.waiting import eventually

ALPHA, BETA, GAMMA = "sk-alpha-0123456789", "sk-beta-0123456789", "sk-gamma-0123456789"
MODEL = "gpt-mini"
QUOTA = 200_000  # alpha's and gamma's max_file_storage_bytes
REPLY_CAP = 4096  # max_passthrough_reply_bytes: a short echo fits, a 6,000-character one does not
PAGE_BYTES = 2000  # max_results_page_bytes
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    teams = [{"team_id": "alpha", "api_keys": [ALPHA], "max_file_storage_bytes": QUOTA},
             {"team_id": "beta", "api_keys": [BETA]},
             {"team_id": "gamma", "api_keys": [GAMMA], "max_file_storage_bytes": QUOTA}]
    config = gateway_config(upstream, teams=teams, models=[MODEL], max_estimates_per_team=1,
                            max_passthrough_reply_bytes=REPLY_CAP, max_results_page_bytes=PAGE_BYTES)
    with start_gateway(config, tmp_path_factory.mktemp("doors") / "data") as server:
        yield server


def _message_request(custom_id: str, text: str = "hi", **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": {"model": MODEL, "max_tokens": 8,
                                               "messages": [{"role": "user", "content": text}], **params}}


def _create(gw: Gateway, key: str, content: Any) -> httpx.Response:
    return httpx.post(gw.url + "/v1/messages/batches", content=content, timeout=120,
                      headers={"x-api-key": key, "content-type": "application/json"})


def _anthropic_error(reply: httpx.Response, status: int, type_: str) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == type_, body
    return str(body["error"]["message"])


class _Watch:
    """The API process's peak RSS, and another team's `GET /v1/models` latencies, while something runs."""

    def __init__(self, gw: Gateway) -> None:
        self._gw, self._process = gw, psutil.Process(gw.process.pid)
        self.idle = self.peak = self._process.memory_info().rss
        # The validation processes, where a create's body is read: their growth is held to the same bound.
        self._children = {p: p.memory_info().rss for p in self._process.children()
                          if any("spawn_main" in part for part in p.cmdline())}
        self._child_peaks = dict(self._children)
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample), threading.Thread(target=self._get)]

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            for child in self._children:
                with contextlib.suppress(psutil.Error):
                    self._child_peaks[child] = max(self._child_peaks[child], child.memory_info().rss)
            time.sleep(0.005)

    def child_growth(self) -> int:
        """The most one validation process grew (the one that read the body); the processes must exist."""
        assert self._children, "no validation process to watch"
        return max(self._child_peaks[c] - self._children[c] for c in self._children)

    def _get(self) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {ALPHA}"}, timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get(self._gw.url + "/v1/models").status_code == 200
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.01)

    def __enter__(self) -> _Watch:
        for thread in self._threads:
            thread.start()
        time.sleep(0.1)
        return self

    def __exit__(self, *_: object) -> None:
        time.sleep(0.1)
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def test_a_pathological_create_is_refused_within_the_memory_bound(gateway: Gateway) -> None:
    """One request of 5,000,000 `{}` (14 MB) once took the API from 100 MB to 837 MB and stalled every
    team for a second: now it is refused once the request passes its bound on values, its text never
    turned into objects whole, and another team's GETs stay quick."""
    body = b'{"requests": [{"custom_id": "a", "params": {"model": "gpt-mini", "pad": [' \
        + b",".join([b"{}"] * 5_000_000) + b"]}}]}"
    with _Watch(gateway) as watch:
        reply = _create(gateway, BETA, body)
    assert "more than 100000 values" in _anthropic_error(reply, 400, "invalid_request_error")
    grown = watch.peak - watch.idle

    assert grown <= 2 * len(body) + 50 * MIB, (grown, len(body))
    assert watch.child_growth() <= 2 * len(body) + 50 * MIB, (watch.child_growth(), len(body))
    assert watch.latencies and watch.p99() < 0.5, watch.latencies


def test_an_accepted_body_of_many_objects_stays_within_the_memory_bound(gateway: Gateway) -> None:
    """The same shape spread over 4,000 requests (within the bound each): accepted, read request by
    request, the API's memory within twice the body + 50 MB."""
    pad = [{}] * 600
    requests = [_message_request(f"r{i}", pad=pad) for i in range(4000)]
    body = json.dumps({"requests": requests}).encode()
    with _Watch(gateway) as watch:
        reply = _create(gateway, BETA, body)
    assert reply.status_code == 200, reply.text
    grown = watch.peak - watch.idle

    assert grown <= 2 * len(body) + 50 * MIB, (grown, len(body))
    assert watch.child_growth() <= 2 * len(body) + 50 * MIB, (watch.child_growth(), len(body))
    assert watch.latencies and watch.p99() < 0.5, watch.latencies
    created = reply.json()
    assert created["request_counts"]["processing"] == 4000
    httpx.post(f"{gateway.url}/v1/messages/batches/{created['id']}/cancel", headers={"x-api-key": BETA}, timeout=30)


def test_a_create_of_escapes_is_read_within_the_memory_bound(gateway: Gateway) -> None:
    """One request of one 11.4 MB string of `\\ud83d\\ude00` escapes once took the reading process up by
    244 MB (the splitter's regexes kept stack per escape): read by the streaming tokenizer, the create is
    accepted with both processes within twice the body + 50 MB, and the request reads back as the emoji."""
    text = b"\\ud83d\\ude00" * 1_000_000
    body = b'{"requests": [{"custom_id": "e", "params": {"model": "gpt-mini", "max_tokens": 8, "messages": ' \
        b'[{"role": "user", "content": "' + text + b'"}]}}]}'
    with _Watch(gateway) as watch:
        reply = _create(gateway, BETA, body)
    assert reply.status_code == 200, reply.text
    grown = watch.peak - watch.idle

    assert grown <= 2 * len(body) + 50 * MIB, (grown, len(body))
    assert watch.child_growth() <= 2 * len(body) + 50 * MIB, (watch.child_growth(), len(body))
    assert watch.latencies and watch.p99() < 0.5, watch.latencies
    httpx.post(f"{gateway.url}/v1/messages/batches/{reply.json()['id']}/cancel", headers={"x-api-key": BETA},
               timeout=30)


@pytest.mark.parametrize("shape", ["escapes", "empty objects"])
def test_every_other_json_body_is_bounded_whatever_its_content(gateway: Gateway, shape: str) -> None:
    """`POST /v1/batches`, the other JSON body the API parses (its `Idempotency-Key` is read from it too), is
    cut at 1 MB as it streams and parsed by orjson within 32 levels: a body of escapes or of `{}`s just
    under the cap is refused in OpenAI's shape with the API within twice the body + 50 MB."""
    fill = b"\\ud83d\\ude00" * 87_000 if shape == "escapes" else \
        b'", "pad": [' + b",".join([b"{}"] * 340_000) + b'], "x": "'
    body = b'{"input_file_id": "file-nothere", "endpoint": "/v1/chat/completions", "completion_window": "24h", ' \
        b'"metadata": {"note": "' + fill + b'"}}'
    assert len(body) < MIB
    with _Watch(gateway) as watch:
        reply = httpx.post(gateway.url + "/v1/batches", content=body, timeout=60,
                           headers={"Authorization": f"Bearer {BETA}", "content-type": "application/json"})
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["error"]["message"], reply.text
    assert watch.peak - watch.idle <= 2 * len(body) + 50 * MIB, (watch.peak - watch.idle, len(body))


def test_a_message_batch_over_the_teams_storage_is_a_429_in_anthropics_shape(gateway: Gateway) -> None:
    """Refused before the body is read when its length says it cannot fit; streamed without a length, as
    the bytes pass the room; either way nothing is stored."""
    big = json.dumps({"requests": [_message_request(f"r{i}", "x" * 5000) for i in range(50)]}).encode()
    assert len(big) > QUOTA
    message = _anthropic_error(_create(gateway, ALPHA, big), 429, "rate_limit_error")
    assert "storage" in message.lower()
    streamed = _create(gateway, ALPHA, iter([big[i:i + 65536] for i in range(0, len(big), 65536)]))
    _anthropic_error(streamed, 429, "rate_limit_error")
    roomy = gateway.http("POST", "/v1/files", ALPHA, files={"file": ("a.jsonl", b"x" * (QUOTA - 1000))},
                         data={"purpose": "batch"})
    assert roomy.status_code == 200, roomy.text  # nothing of the refused bodies was kept
    assert gateway.http("DELETE", f"/v1/files/{roomy.json()['id']}", ALPHA).status_code == 200


def test_a_message_batchs_input_counts_against_the_teams_own_storage(gateway: Gateway) -> None:
    """One account per team whatever the door: a stored Message Batch leaves no room for an upload that
    would fit without it, its files stay out of the team's files list, and deleting it frees the room."""
    body = json.dumps({"requests": [_message_request(f"r{i}", "#sleep:20000 " + "y" * 4000)
                                    for i in range(30)]}).encode()
    created = _create(gateway, ALPHA, body)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    upload = b"z" * (QUOTA - len(body) // 2)  # fits an empty quota, not beside the batch's input
    refused = gateway.http("POST", "/v1/files", ALPHA, files={"file": ("a.jsonl", upload)}, data={"purpose": "batch"})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "storage_quota_exceeded", refused.text
    assert gateway.http("GET", "/v1/files", ALPHA).json()["data"] == []  # hidden, as before
    headers = {"x-api-key": ALPHA}
    httpx.post(f"{gateway.url}/v1/messages/batches/{batch_id}/cancel", headers=headers, timeout=30)
    eventually(lambda: httpx.get(f"{gateway.url}/v1/messages/batches/{batch_id}", headers=headers, timeout=30)
               .json()["processing_status"] == "ended", 60, "the batch to end")
    assert httpx.delete(f"{gateway.url}/v1/messages/batches/{batch_id}", headers=headers, timeout=30).status_code == 200
    fits = gateway.http("POST", "/v1/files", ALPHA, files={"file": ("a.jsonl", upload)}, data={"purpose": "batch"})
    assert fits.status_code == 200, fits.text
    assert gateway.http("DELETE", f"/v1/files/{fits.json()['id']}", ALPHA).status_code == 200


def test_a_retrys_input_and_every_output_count_against_the_team(gateway: Gateway) -> None:
    """After a batch and its retry, the team's room is its quota less every file it holds (inputs, the
    outputs and error files the gateway wrote, the retry's input): an upload one byte past it is refused."""
    client = gateway.client(GAMMA)
    lines = [chat_line("ok", MODEL, "fine"), chat_line("bad", MODEL, "#fail:400 no")]
    source = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_batch(client, batch.id).status == "completed"
    retried = gateway.http("POST", f"/v1/batches/{batch.id}/retry", GAMMA)
    assert retried.status_code == 200, retried.text
    wait_batch(client, retried.json()["id"])
    held = client.files.list().data
    assert len(held) >= 5  # two inputs, two outputs, an error file at least
    room = QUOTA - sum(f.bytes for f in held)
    over = gateway.http("POST", "/v1/files", GAMMA, files={"file": ("a.jsonl", b"x" * (room + 1))},
                        data={"purpose": "batch"})
    assert over.status_code == 429 and over.json()["error"]["code"] == "storage_quota_exceeded", over.text
    exact = gateway.http("POST", "/v1/files", GAMMA, files={"file": ("a.jsonl", b"x" * room)},
                         data={"purpose": "batch"})
    assert exact.status_code == 200, exact.text
    for held_file in [*held, client.files.retrieve(exact.json()["id"])]:
        client.files.delete(held_file.id)


def test_a_team_runs_a_bounded_number_of_estimates_at_once(gateway: Gateway) -> None:
    """Past `max_estimates_per_team` (1 here) a team's estimate is a 429 with its own code; another team's
    estimate at the same moment is not refused."""
    lines = [chat_line(f"c{i}", MODEL, "some words to count") for i in range(2_000)]
    mine = gateway.client(BETA).files.create(file=("big.jsonl", jsonl(lines)), purpose="batch")
    theirs = gateway.client(GAMMA).files.create(file=("small.jsonl", jsonl(lines[:10])), purpose="batch")

    def estimate(key: str, file_id: str) -> httpx.Response:  # the first may start a validation process
        return httpx.get(f"{gateway.url}/v1/files/{file_id}/cost_estimate", timeout=120,
                         headers={"Authorization": f"Bearer {key}"})

    with ThreadPoolExecutor(6) as pool:
        many = [pool.submit(estimate, BETA, mine.id) for _ in range(4)]
        other = pool.submit(estimate, GAMMA, theirs.id)
        replies = [f.result() for f in many]
        assert other.result().status_code == 200, other.result().text
    codes = sorted(r.status_code for r in replies)
    assert codes[0] == 200 and codes[-1] == 429, [r.text for r in replies]
    refused = next(r for r in replies if r.status_code == 429).json()["error"]
    assert refused["code"] == "too_many_estimates" and refused["type"] == "rate_limit_error"
    gateway.client(GAMMA).files.delete(theirs.id)


def test_the_pass_through_reads_a_bounded_reply_and_results_pages_are_bounded_by_bytes(gateway: Gateway) -> None:
    """A reply past `max_passthrough_reply_bytes` fails its line (a clear error, the rest unharmed); the
    results come in pages of at most `max_results_page_bytes` (past their first line), all of them."""
    client = gateway.client(BETA)
    lines = [chat_line(f"s{i}", MODEL, f"short {i}") for i in range(8)] + [chat_line("long", MODEL, "w " * 3000)]
    source = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = wait_batch(client, client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)
    assert batch.request_counts is not None and (batch.request_counts.completed, batch.request_counts.failed) == (8, 1)
    assert batch.error_file_id is not None
    failed = json.loads(client.files.content(batch.error_file_id).content)
    assert failed["custom_id"] == "long" and failed["error"]["code"] == "upstream_reply_too_large", failed
    seen: list[str] = []
    after = ""
    while True:
        page = gateway.http("GET", f"/v1/batches/{batch.id}/results?limit=100&after={after}", BETA)
        assert page.status_code == 200, page.text
        rows = page.content.splitlines()
        assert len(rows) == 1 or len(page.content) <= PAGE_BYTES, len(page.content)
        seen += [json.loads(row)["custom_id"] for row in rows]
        after = page.headers["x-next-cursor"]
        if page.headers["x-has-more"] != "true":
            break
    assert sorted(seen) == sorted(line["custom_id"] for line in lines) and len(seen) == 9


def test_submit_without_a_gateway_url_refuses_to_run(tmp_path: Path) -> None:
    """Without --base-url or OPENAI_BASE_URL the SDK would send the team's key to api.openai.com."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([chat_line("a", MODEL, "hi")]))
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_BASE")}
    env["OPENAI_API_KEY"] = "sk-team-key"
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "submit", "-i", str(source), "-o",
                           str(tmp_path / "out.jsonl")], cwd=REPO_ROOT, env=env, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 2, done
    assert b"--base-url" in done.stderr + done.stdout and b"OPENAI_BASE_URL" in done.stderr + done.stdout
    assert not (tmp_path / "out.jsonl").exists()
