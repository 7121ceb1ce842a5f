"""The server's answers to requests, good and bad, end to end: line validation that fails a batch
(OpenAI's codes, 1-based lines and params), uploads and their limits, the File object, OpenAI's
error shape and wording, `x-request-id` on every reply, and the root paths LiteLLM uses."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from gateway.config.schema import parse_config
from gateway.runtime.runtime import open_embedded
from gateway.store.records import FileRecord
from tests.fakes.upstream.server import Upstream
from tests.support.loops import run_apart
from tests.support.server_helpers import Gateway, chat_line, gateway_config, jsonl, start_gateway, submit, wait_batch
from tests.support.team_gateway import BETA, GAMMA, MAX_FILE_BYTES, MAX_LINES, alpha, assert_error, beta, gw, upstream
from tests.support.waiting import eventually

__all__ = ["alpha", "beta", "gw", "upstream"]  # fixtures, used by name

# --------------------------------------------------------------------------- validation


def _good(i: int) -> dict[str, Any]:
    return chat_line(f"ok{i}", "gpt-mini", f"fine {i}")


_NO_MESSAGES = {"custom_id": "nm", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-mini"}}
_NO_CUSTOM_ID = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-mini", "messages": []}}

VALIDATION_CASES: list[tuple[str, list[Any], str, int | None, str | None]] = [
    ("invalid_json", [_good(1), '{"custom_id": "x", "method": "POST"', _good(3)], "invalid_json_line", 2, None),
    ("missing_custom_id", [_good(1), _NO_CUSTOM_ID], "missing_required_parameter", 2, "custom_id"),
    (
        "missing_model",
        [_good(1), _good(2), chat_line("m", None, "no model")],
        "missing_required_parameter",
        3,
        "body.model",
    ),
    ("invalid_url", [_good(1), {**_good(2), "url": "/v1/embeddings"}], "invalid_url", 2, "url"),
    ("duplicate_custom_id", [_good(1), _good(2), _good(1)], "duplicate_custom_id", 3, "custom_id"),
    ("unknown_model", [chat_line("u", "no-such-model", "hi")], "model_not_found", 1, "body.model"),
    ("model_not_allowed", [_good(1), chat_line("s", "secret-model", "hi")], "model_not_found", 2, "body.model"),
    ("missing_messages", [_good(1), _NO_MESSAGES], "missing_required_parameter", 2, "body.messages"),
    ("messages_not_a_list", [{**_good(1), "body": {"model": "gpt-mini", "messages": "hi"}}], "invalid_type", 1,
     "body.messages"),
    (
        "streaming",
        [_good(1), chat_line("st", "gpt-mini", "hi", stream=True)],
        "streaming_unsupported",
        2,
        "body.stream",
    ),
    ("empty_file", [], "empty_file", None, None),
    ("too_many_tasks", [_good(i) for i in range(MAX_LINES + 1)], "too_many_tasks", MAX_LINES + 1, None),
]


@pytest.mark.parametrize(
    ("lines", "code", "line", "param"), [c[1:] for c in VALIDATION_CASES], ids=[c[0] for c in VALIDATION_CASES]
)
def test_validation_fails_the_batch(
    alpha: OpenAI, upstream: Upstream, lines: list[Any], code: str, line: int | None, param: str | None
) -> None:
    sent = upstream.stats()["requests"]
    batch = wait_batch(alpha, submit(alpha, lines).id)
    assert batch.status == "failed", batch
    assert batch.failed_at and batch.errors is not None and batch.errors.data
    found = [e for e in batch.errors.data if e.code == code]
    assert found, batch.errors
    assert found[0].line == line and found[0].message
    if param is not None:
        assert found[0].param == param
    assert upstream.stats()["requests"] == sent  # nothing of a failed batch is sent


def test_line_errors_in_openais_words(alpha: OpenAI) -> None:
    lines: list[dict[str, Any] | str] = [
        chat_line("u", "no-such-model", "hi"), chat_line("st", "gpt-mini", "hi", stream=True),
        {**_good(3), "url": "/v1/embeddings"}, '{"custom_id": ', _NO_MESSAGES,
    ]
    batch = wait_batch(alpha, submit(alpha, lines).id)
    assert batch.errors is not None
    by_line = {e.line: e for e in batch.errors.data}
    assert by_line[1].message == (
        "The provided model 'no-such-model' does not exist or is not supported by the Batch API.")
    assert "Streaming is not supported" in (by_line[2].message or "")
    assert "does not match the batch endpoint" in (by_line[3].message or "")
    assert (by_line[4].message or "").startswith("This line is not parseable as valid JSON.")
    assert by_line[5].message == "Missing required parameter: 'body.messages'."


# --------------------------------------------------------------------------- uploads and errors


def test_upload_limit(gw: Gateway, beta: OpenAI) -> None:
    before = {f.id for f in beta.files.list()}
    assert beta.files.create(file=("max.jsonl", b"x" * MAX_FILE_BYTES), purpose="batch").bytes == MAX_FILE_BYTES
    with pytest.raises(openai.APIStatusError) as info:
        beta.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert info.value.status_code == 413

    boundary = "b0undary"

    def chunked(size: int) -> Iterator[bytes]:  # no Content-Length: the limit is enforced while streaming
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{boundary}\r\n'
            f'Content-Disposition: form-data; name="file"; filename="s.jsonl"\r\n\r\n'
        ).encode()
        for _ in range(size // 1000):
            yield b"y" * 1000
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    assert_error(gw.http("POST", "/v1/files", BETA, content=chunked(MAX_FILE_BYTES * 4), headers=headers), 413)
    assert len({f.id for f in beta.files.list()} - before) == 1  # only the file that fit


def test_upload_fields_in_any_order(gw: Gateway, beta: OpenAI) -> None:
    boundary = "zzBOUNDARYzz"

    def part(name: str, value: str, filename: str | None = None) -> str:
        extra = f'; filename="{filename}"' if filename else ""
        return f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n{value}\r\n'

    content = b'{"a": 1}\n{"b": 2}\n'
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    for parts in (
        [
            part("file", content.decode(), "../dir/late.jsonl"),
            part("purpose", "batch"),
            part("expires_after[anchor]", "created_at"),
            part("expires_after[seconds]", "7200"),
        ],
        [
            part("purpose", "batch"),
            part("file", content.decode(), "late.jsonl"),
            part("expires_after[anchor]", "created_at"),
            part("expires_after[seconds]", "7200"),
        ],
    ):
        reply = gw.http("POST", "/v1/files", BETA, content="".join(parts) + f"--{boundary}--\r\n", headers=headers)
        assert reply.status_code == 200, reply.text
        file = reply.json()
        assert file["filename"] == "late.jsonl" and file["bytes"] == len(content)
        assert file["expires_at"] - file["created_at"] == 7200
        assert beta.files.content(file["id"]).content == content
    missing = gw.http(
        "POST", "/v1/files", BETA, content=part("purpose", "batch") + f"--{boundary}--\r\n", headers=headers
    )
    assert assert_error(missing, 400)["param"] == "file"
    no_purpose = gw.http("POST", "/v1/files", BETA, files={"file": ("a.jsonl", b"{}\n")})
    assert assert_error(no_purpose, 400)["param"] == "purpose"
    assert_error(gw.http("POST", "/v1/files", BETA, json={"purpose": "batch"}), 400)


def test_file_object_and_delete(beta: OpenAI) -> None:
    file = beta.files.create(
        file=("obj.jsonl", b"{}\n"), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert (file.object, file.status, file.filename, file.bytes) == ("file", "processed", "obj.jsonl", 3)
    assert file.expires_at == file.created_at + 3600
    assert beta.files.delete(file.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        beta.files.retrieve(file.id)
    with pytest.raises(openai.NotFoundError):
        beta.files.delete(file.id)


def test_bad_requests_answer_openai_errors(gw: Gateway, beta: OpenAI) -> None:
    file = beta.files.create(file=("x.jsonl", jsonl([_good(1)])), purpose="batch")
    good = {"input_file_id": file.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    full = {f"k{i:02d}" + "x" * 61: "v" * 512 for i in range(16)}
    accepted = gw.http("POST", "/v1/batches", BETA, json={**good, "metadata": full})
    assert accepted.status_code == 200 and accepted.json()["metadata"] == full
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({**good, "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
        ({**good, "metadata": {"k" * 65: "v"}}, 400, None),
        ({**good, "metadata": {"k": "v" * 513}}, 400, "metadata.k"),
        ({**good, "metadata": {"k": 1}}, 400, "metadata.k"),
        ({**good, "input_file_id": None}, 400, "input_file_id"),
        ({**good, "output_expires_after": {"anchor": "created_at", "seconds": 5}}, 400, "output_expires_after.seconds"),
        ({**good, "input_file_id": "file-nope"}, 404, None),
        ({**good, "completion_window": "1w"}, 400, None),
        ({**good, "endpoint": "/v1/no-such-endpoint"}, 400, None),
    ]
    for body, status, param in cases:
        error = assert_error(gw.http("POST", "/v1/batches", BETA, json=body), status)
        if param is not None:
            assert error["param"] == param, (body, error)
    assert_error(gw.http("POST", "/v1/batches", BETA, content=b"{not json"), 400)
    assert_error(gw.http("POST", "/v1/batches", BETA, json=[1, 2]), 400)
    assert_error(gw.http("GET", "/v1/nothing-here", BETA), 404, "unknown_url")
    assert_error(gw.http("GET", "/nothing-here"), 404)
    assert_error(gw.http("PUT", "/v1/files", BETA), 405)
    assert_error(gw.http("GET", "/v1/files?limit=ten", BETA), 400, "invalid_type")
    assert_error(gw.http("GET", "/v1/batches/batch_missing", BETA), 404, "not_found")


def test_server_fault_is_a_json_500(gw: Gateway, beta: OpenAI) -> None:
    file = beta.files.create(file=("lost.jsonl", b"{}\n"), purpose="batch")
    [blob] = [p for p in (gw.data_dir / "blobs").rglob("*") if p.name == file.id]
    blob.unlink()  # the record survives its bytes: a real server-side fault
    reply = gw.http("GET", f"/v1/files/{file.id}/content", BETA)
    error = assert_error(reply, 500)
    assert error["type"] == "server_error" and "Traceback" not in reply.text and str(blob) not in reply.text
    assert gw.http("GET", "/health").status_code == 200


# --------------------------------------------------------------------------- separate servers


def test_refusals_in_openais_words(gw: Gateway, beta: OpenAI) -> None:
    file = beta.files.create(file=("w.jsonl", jsonl([_good(1)])), purpose="batch")
    good = {"input_file_id": file.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    error = assert_error(gw.http("POST", "/v1/batches", BETA, json={**good, "endpoint": "/v1/nope"}), 400,
                         "invalid_value")
    assert error["param"] == "endpoint"
    assert error["message"].startswith("Invalid value: '/v1/nope'. Supported values are: '/v1/chat/completions', ")
    error = assert_error(gw.http("POST", "/v1/batches", BETA, json={**good, "completion_window": "1w"}), 400,
                         "invalid_value")
    assert error["param"] == "completion_window"
    assert error["message"].startswith("Invalid value: '1w'. Supported values are: ") and "'24h'" in error["message"]
    error = assert_error(gw.http("POST", "/v1/files", BETA, data={"purpose": "x"}, files={"file": ("a", b"{}")}),
                         400, "invalid_value")
    assert error["param"] == "purpose" and "Supported values are: " in error["message"]
    error = assert_error(gw.http("GET", "/v1/files/file-nope", BETA), 404, "not_found")
    assert (error["message"], error["param"]) == ("No such File object: file-nope", "id")
    error = assert_error(gw.http("POST", "/v1/batches", BETA, json={**good, "input_file_id": "file-gone"}), 404)
    assert (error["message"], error["param"]) == ("No such File object: file-gone", "input_file_id")
    error = assert_error(gw.http("GET", "/v1/batches/batch_missing", BETA), 404)
    assert error["message"] == "No batch found with id 'batch_missing'."
    with pytest.raises(openai.NotFoundError, match="No batch found"):
        beta.batches.retrieve("batch_missing")


def test_expires_after_needs_its_anchor(gw: Gateway, beta: OpenAI) -> None:
    file = beta.files.create(file=("a.jsonl", jsonl([_good(1)])), purpose="batch")
    good = {"input_file_id": file.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    error = assert_error(gw.http("POST", "/v1/batches", BETA, json={**good, "output_expires_after": {"seconds": 3600}}),
                         400, "missing_required_parameter")
    assert error["param"] == "output_expires_after.anchor"
    upload = {"file": ("a.jsonl", b"{}\n")}
    for fields in ({"expires_after[seconds]": "3600"}, {"expires_after": '{"seconds": 3600}'}):
        error = assert_error(gw.http("POST", "/v1/files", BETA, data={"purpose": "batch", **fields}, files=upload),
                             400, "missing_required_parameter")
        assert error["param"] == "expires_after.anchor"
    error = assert_error(gw.http("POST", "/v1/files", BETA, data={"purpose": "batch", "expires_after": "[1]"},
                                 files=upload), 400, "invalid_type")
    assert error["param"] == "expires_after"


def test_file_ids_and_schema_shapes(gw: Gateway, beta: OpenAI) -> None:
    file = beta.files.create(file=("s.jsonl", jsonl([_good(1)])), purpose="batch")
    assert file.id.startswith("file-") and file.expires_at == file.created_at + 30 * 86_400  # OpenAI's default
    raw = gw.http("GET", f"/v1/files/{file.id}", BETA).json()
    assert "status_details" not in raw  # a string in the schema, never null
    empty = gw.client(GAMMA).batches.list()
    assert empty.data == [] and empty.has_more is False
    for path in ("/v1/files", "/v1/batches"):
        page = gw.http("GET", path, GAMMA).json()
        assert (page["data"], page["first_id"], page["last_id"]) == ([], "", "")


def test_request_id_on_every_reply(gw: Gateway, beta: OpenAI) -> None:
    file = beta.files.with_raw_response.create(file=("r.jsonl", jsonl([_good(1)])), purpose="batch")
    created = file.parse()
    replies = {
        "sdk": file.http_response,
        "content": gw.http("GET", f"/v1/files/{created.id}/content", BETA),  # a streamed body
        "400": gw.http("GET", "/v1/files?limit=ten", BETA),
        "401": gw.http("GET", "/v1/files", "sk-wrong-key"),
        "404": gw.http("GET", "/v1/files/file-nope", BETA),
        "unknown url": gw.http("GET", "/v2/nothing", BETA),
        "405": gw.http("PUT", "/v1/files", BETA),
        "health": gw.http("GET", "/health"),
    }
    ids = {name: reply.headers.get("x-request-id", "") for name, reply in replies.items()}
    assert all(re.fullmatch(r"req_[0-9a-f]{32}", rid) for rid in ids.values()), ids
    assert len(set(ids.values())) == len(ids)
    assert replies["content"].content == jsonl([_good(1)])
    assert beta.files.retrieve(created.id)._request_id is not None  # the SDK exposes it

    # one id ties the client's error to the server's log line; a client's own id is logged, not echoed
    mine = "trace-me-42"
    reply = gw.http("GET", "/v1/files/file-logged", BETA, headers={"X-Client-Request-Id": mine})
    assert "x-client-request-id" not in reply.headers
    rid = reply.headers["x-request-id"]
    line = eventually(lambda: next((x for x in gw.log().splitlines() if rid in x), ""), 5, "the access log line")
    assert '"GET /v1/files/file-logged" 404' in line and f"client_request_id={mine}" in line, line


def test_root_paths_serve_the_api(gw: Gateway) -> None:
    # LiteLLM's clients and its proxy call /files and /batches without /v1
    root = gw.client(BETA, prefix="")
    file = root.files.create(file=("root.jsonl", jsonl([_good(1)])), purpose="batch")
    assert root.files.retrieve(file.id).id == file.id and root.files.content(file.id).content == jsonl([_good(1)])
    batch = root.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert root.batches.retrieve(batch.id).id == batch.id
    assert batch.id in [b.id for b in root.batches.list()]
    assert wait_batch(root, batch.id).status == "completed"
    assert root.files.delete(file.id).deleted is True


def test_older_file_ids_keep_working(upstream: Upstream, tmp_path: Path) -> None:
    # A data directory from before `file-` ids holds `file_<hex>` files: they stay readable and usable.
    data_dir, legacy, content = tmp_path / "data", "file_" + "ab" * 16, jsonl([_good(1)])

    async def put_legacy_file() -> None:
        runtime = await open_embedded(parse_config(gateway_config(upstream)), data_dir)
        try:
            async with runtime.blobs.writing(f"files/{legacy}") as writer:
                await writer.write(content)
            await runtime.store.files.put(FileRecord(legacy, "", len(content), int(time.time()), "old.jsonl",
                                                    "batch", None, f"files/{legacy}"))
        finally:
            await runtime.aclose()

    run_apart(put_legacy_file())
    with start_gateway(gateway_config(upstream), data_dir) as gw:
        client = gw.client(None)
        assert client.files.retrieve(legacy).id == legacy and client.files.content(legacy).content == content
        batch = client.batches.create(input_file_id=legacy, endpoint="/v1/chat/completions", completion_window="24h")
        assert wait_batch(client, batch.id).status == "completed"
        assert client.files.delete(legacy).deleted is True
