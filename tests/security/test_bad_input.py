"""Bad input fails cleanly, in bounded time and memory (issue 25).

Through the real `batchyard serve` process, with the `openai` SDK (or raw HTTP, for bodies the SDK would
never send) as the client:

- A line that is not strict JSON (nested 100,000 levels, nested past the line depth bound, `NaN`,
  `Infinity`, a lone surrogate, bytes that are not UTF-8) is that line's `invalid_json_line`, with its
  1-based number and OpenAI's wording: the batch is `failed` at once, never left `validating`.
- A line over `max_line_bytes` is cut off while it is read: it gets its error with its number, the lines
  after it are still checked, and the read is linear in the line's size.
- A value quoted in an error (custom_id, url, model, method) is cut to a short prefix: a failed batch's
  object stays small however bad its file is.
- A batch whose planning raises (its input's bytes are gone) fails with `validation_failed`.
- A team's per-model quota counts a line by the route it resolves to: a deployment url counts against
  its deployment's model.
- A request body too deep, not strict JSON or too large, and a form part with oversized headers or a deep
  JSON field, get OpenAI's error shape with a 4xx, never a 500.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.errors import SHOWN_CHARS
from gateway.lines.body_fields import MAX_LINE_DEPTH
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, chat_line, gateway_config, start_gateway, wait_batch

MASTER, OPEN, QUOTA = "sk-admin-0123456789", "sk-open-0123456789", "sk-quota-0123456789"
MAX_LINE_BYTES = 1024 * 1024
MAX_ERRORS_LISTED = 20
JSON_WORDING = "This line is not parseable as valid JSON."


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    teams: list[dict[str, Any]] = [
        {"team_id": "open", "api_keys": [OPEN]},
        {"team_id": "quota", "api_keys": [QUOTA], "model_max_enqueued_requests": {"gpt-mini": 2}},
    ]
    config = gateway_config(upstream, master_key=MASTER, teams=teams, max_line_bytes=MAX_LINE_BYTES,
                            max_file_bytes=200 * 1024 * 1024, max_errors_listed=MAX_ERRORS_LISTED)
    with start_gateway(config, tmp_path_factory.mktemp("bad-input") / "data") as gateway:
        yield gateway
        log = gateway.log()
    assert "RecursionError" not in log  # no parse reached the interpreter's stack limit, in any process


@pytest.fixture(scope="module")
def client(gw: Gateway) -> OpenAI:
    return gw.client(OPEN)


def line(text: str = "hi", *, custom_id: str = "c", url: str = "/v1/chat/completions", method: str = "POST",
         **body: Any) -> bytes:
    """A good chat line (gpt-mini), with `body` added to its body."""
    return json.dumps({**chat_line(custom_id, "gpt-mini", text, url=url, **body), "method": method}).encode()


def create(client: OpenAI, content: bytes) -> str:
    file = client.files.create(file=("input.jsonl", content), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                 completion_window="24h").id


def failed_errors(client: OpenAI, batch_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The errors of a batch that must fail at validation (it must not stay `validating`)."""
    batch = wait_batch(client, batch_id, timeout=timeout)
    assert batch.status == "failed", batch
    assert batch.errors is not None and batch.errors.data
    return [e.model_dump() for e in batch.errors.data]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_lines_that_are_not_strict_json_are_each_their_lines_error(client: OpenAI) -> None:
    """Each unparseable line is an `invalid_json_line` at its own number, in OpenAI's words; the batch
    fails at once, whatever the parser met (a recursion limit included)."""
    deep_body = b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"model": ' \
                b'"gpt-mini", "messages": [], "x": ' + nested(MAX_LINE_DEPTH + 10).encode() + b"}}"
    bad = [
        b"[" * 100_000,  # orjson's own depth limit; `json` would raise RecursionError
        line(temperature=0.5).replace(b"0.5", b"NaN"),
        line(temperature=0.5).replace(b"0.5", b"Infinity"),
        line(temperature=0.5).replace(b"0.5", b"1e400"),  # a float that is infinite
        line(text="\ud800"),  # json.dumps writes the lone surrogate as the escape "\ud800"
        line().replace(b'"hi"', b'"\xed\xa0\x80"'),  # a surrogate as raw bytes: not UTF-8
        deep_body,  # parses, but past the line depth bound
        nested(1000).encode(),  # deeper than the interpreter's stack would take
    ]
    assert b"\\ud800" in bad[4]
    started = time.monotonic()
    errors = failed_errors(client, create(client, b"\n".join([*bad, line()]) + b"\n"))
    assert time.monotonic() - started < 30
    assert [(e["code"], e["line"]) for e in errors] == [("invalid_json_line", n) for n in range(1, len(bad) + 1)]
    assert all(e["message"].startswith(JSON_WORDING) for e in errors)
    assert f"nested more than {MAX_LINE_DEPTH} levels deep" in errors[6]["message"]


def test_a_line_over_max_line_bytes_gets_its_error_and_the_rest_is_still_checked(client: OpenAI) -> None:
    """A 100 MB line over a 1 MiB `max_line_bytes` is refused with its size and line number, in seconds
    (it is cut off as it is read, not assembled first), and the lines after it are still validated."""
    huge = line(text="x" * (100 * 1024 * 1024))
    content = b"\n".join([line(custom_id="a"), huge, line(custom_id="b"), b"{not json"]) + b"\n"
    batch_id = create(client, content)
    del content
    started = time.monotonic()
    errors = failed_errors(client, batch_id, timeout=120)
    elapsed = time.monotonic() - started
    assert errors[0] == {"code": "invalid_request", "line": 2, "param": None,
                         "message": f"line is {len(huge)} bytes; the limit is {MAX_LINE_BYTES}"}
    assert (errors[1]["code"], errors[1]["line"]) == ("invalid_json_line", 4)
    # Generous: the read takes about a second; joining the line chunk by chunk (quadratic) took minutes.
    assert elapsed < 60


def test_values_quoted_in_errors_are_cut_to_a_prefix(gw: Gateway, client: OpenAI) -> None:
    """A 10 KB custom_id, url, model or method appears in its error as its first 64 characters and "…"."""
    long = "v" * 10_000
    content = b"\n".join([
        line(custom_id=long), line(custom_id=long),  # the second repeats it
        line(custom_id="u", url="/" + long),
        json.dumps(chat_line("m", long, "hi")).encode(),
        line(custom_id="p", method=long),
    ]) + b"\n"
    batch_id = create(client, content)
    errors = failed_errors(client, batch_id)
    assert [(e["code"], e["line"]) for e in errors] == [
        ("duplicate_custom_id", 2), ("invalid_url", 3), ("model_not_found", 4), ("invalid_request", 5)]
    for error in errors:
        assert long not in error["message"] and len(error["message"]) < 200, error
        assert "v" * (SHOWN_CHARS - 1) + "…" in error["message"], error  # the url begins with "/"
    assert len(gw.http("GET", f"/v1/batches/{batch_id}", OPEN).content) < 4096


def test_a_failed_batch_object_stays_small_however_bad_its_file(gw: Gateway, client: OpenAI) -> None:
    """Errors past `max_errors_listed` are counted, not listed, and each listed one is short: 2,000 lines
    naming a 2 KB unknown model give a batch object of a few KB."""
    content = b"".join(json.dumps(chat_line(f"c{i}", "m" * 2_000, "hi")).encode() + b"\n" for i in range(2_000))
    batch_id = create(client, content)
    assert len(failed_errors(client, batch_id)) == MAX_ERRORS_LISTED
    assert len(gw.http("GET", f"/v1/batches/{batch_id}", OPEN).content) < MAX_ERRORS_LISTED * 300 + 2_000


def test_a_batch_whose_planning_raises_fails_instead_of_validating_for_ever(gw: Gateway, client: OpenAI) -> None:
    """The input's bytes are gone (the blob store lost them): validation raises, and the batch fails with
    `validation_failed` instead of being validated again at every sweep until it expires."""
    file = client.files.create(file=("input.jsonl", line() + b"\n"), purpose="batch")
    (gw.data_dir / "blobs" / "files" / file.id).unlink()
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    errors = failed_errors(client, batch.id, timeout=30)
    assert [(e["code"], e["line"]) for e in errors] == [("validation_failed", None)]
    assert "Traceback" not in errors[0]["message"]


def test_the_per_model_quota_counts_a_deployment_url_for_its_model(gw: Gateway) -> None:
    """A line naming its model only by an Azure deployment url counts against that model's quota, as the
    router would run it: three such lines are over a per-model quota of two."""
    client = gw.client(QUOTA)
    deployment = "/openai/deployments/gpt-mini/chat/completions?api-version=2024-10-21"
    over = b"".join(json.dumps(chat_line(f"d{i}", None, "hi", url=deployment)).encode() + b"\n" for i in range(3))
    file = client.files.create(file=("input.jsonl", over), purpose="batch")
    with pytest.raises(openai.RateLimitError) as caught:
        client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    error = caught.value.response.json()["error"]
    assert error["code"] == "model_max_enqueued_requests_exceeded" and "gpt-mini" in error["message"]
    assert "this batch has 3" in error["message"]
    fits = client.files.create(file=("input.jsonl", over.split(b"\n", 1)[1]), purpose="batch")
    batch = client.batches.create(input_file_id=fits.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_batch(client, batch.id).status == "completed"


def _refused(reply: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert len(reply.content) < 2_000
    return dict(body["error"])


@pytest.mark.parametrize("body", [
    pytest.param(b"[" * 500_000, id="deep-array"),
    pytest.param(b'{"input_file_id": "file-x", "metadata": {"k": ' + b"[" * 5_000 + b"]" * 5_000 + b"}}",
                 id="deep-in-the-object"),
    pytest.param(b'{"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": NaN}',
                 id="nan"),
    pytest.param(b'{"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h",'
                 b' "metadata": {"k": "\\ud800"}}', id="lone-surrogate"),
])
def test_a_create_body_that_is_not_strict_json_is_a_400(gw: Gateway, body: bytes) -> None:
    """POST /v1/batches with a body nested too deep, or not strict JSON, is OpenAI's 400 `invalid_json`."""
    error = _refused(gw.http("POST", "/v1/batches", OPEN, content=body, headers={"content-type": "application/json"}))
    assert error["code"] == "invalid_json"


def test_a_create_body_with_many_bad_metadata_entries_gets_a_short_400(gw: Gateway) -> None:
    """Many wrong metadata entries with long keys: one 400 of bounded size, the keys cut."""
    metadata = {"k" * 500 + str(i): i for i in range(1_000)}
    body = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h",
            "metadata": metadata}
    error = _refused(gw.http("POST", "/v1/batches", OPEN, json=body))
    assert error["param"] is None or len(error["param"]) < 100


def test_a_create_body_over_the_size_limit_is_a_413(gw: Gateway) -> None:
    error = _refused(gw.http("POST", "/v1/batches", OPEN, content=b" " * (2 * 1024 * 1024),
                             headers={"content-type": "application/json"}), 413)
    assert error["code"] == "request_too_large"


def test_upload_form_fields_too_deep_or_too_large_are_400s(gw: Gateway) -> None:
    """POST /v1/files: an `expires_after` field nested too deep, or a part whose headers are huge (a 100 KB
    filename), is a 400 in OpenAI's shape."""
    deep = _refused(gw.http("POST", "/v1/files", OPEN, data={"purpose": "batch", "expires_after": "[" * 60_000},
                            files={"file": ("in.jsonl", line())}))
    assert deep["param"] == "expires_after"
    _refused(gw.http("POST", "/v1/files", OPEN, data={"purpose": "batch"}, files={"file": ("n" * 100_000, line())}))
