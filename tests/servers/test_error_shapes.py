"""OpenAI's error shape on every route: a malformed parameter answers 400 with
{"error": {message, type, param, code}} naming the parameter, never FastAPI's 422.
Every route, on every prefix a client family uses, against a real server process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.upstream.server import start_upstream
from tests.support.server_helpers import API_VERSION, Gateway, chat_line, gateway_config, jsonl, start_gateway

KEY = "sk-team-0123456789"
PREFIXES = ("/v1", "", "/openai", "/openai/v1", "/azure/v1")  # "": LiteLLM's root paths


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with start_upstream() as upstream:
        config = gateway_config(upstream, teams=[{"team_id": "t", "api_keys": [KEY]}])
        with start_gateway(config, tmp_path_factory.mktemp("shapes") / "data") as gateway:
            yield gateway


def _url(prefix: str, path: str, query: str = "") -> str:
    # Azure's data-plane form (/openai) always carries api-version, as AzureOpenAI sends it
    params = [p for p in (query, f"api-version={API_VERSION}" if prefix == "/openai" else "") if p]
    return prefix + path + ("?" + "&".join(params) if params else "")


def _error(reply: httpx.Response, param: str | None) -> dict[str, Any]:
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param, error
    assert "Traceback" not in reply.text and "detail" not in body
    assert reply.headers["x-request-id"].startswith("req_")  # on errors too, as OpenAI sends it
    return error


def _upload(gw: Gateway, prefix: str, data: dict[str, str]) -> httpx.Response:
    files = {"file": ("in.jsonl", jsonl([chat_line("a", "gpt-mini", "hi")]), "application/jsonl")}
    return gw.http("POST", _url(prefix, "/files"), KEY, data=data, files=files)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_route_answers_a_malformed_parameter_with_400(gw: Gateway, prefix: str) -> None:
    # files: create (two malformed fields), list (query), get / delete / content (the id)
    _error(_upload(gw, prefix, {"purpose": "nonsense"}), "purpose")
    error = _error(_upload(gw, prefix, {"purpose": "batch", "expires_after[anchor]": "created_at",
                                        "expires_after[seconds]": "soon"}), "expires_after.seconds")
    assert "3600" in error["message"]
    error = _error(gw.http("GET", _url(prefix, "/files", "limit=abc"), KEY), "limit")
    assert error["code"] == "invalid_type"
    _error(gw.http("GET", _url(prefix, "/files", "order=sideways"), KEY), "order")
    for method, path in (("GET", "/files/{}"), ("DELETE", "/files/{}"), ("GET", "/files/{}/content")):
        error = _error(gw.http(method, _url(prefix, path.format("not-an-id")), KEY), "file_id")
        assert error["code"] == "invalid_id" and "'file'" in error["message"]

    # batches: create (body fields), list (query), get / cancel (the id)
    good = {"input_file_id": "file-0000", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    for body, param in (({**good, "endpoint": 7}, "endpoint"), ({**good, "input_file_id": "abc"}, "input_file_id"),
                        ({**good, "metadata": "tags"}, "metadata"), ({**good, "completion_window": None},
                                                                     "completion_window")):
        _error(gw.http("POST", _url(prefix, "/batches"), KEY, json=body), param)
    _error(gw.http("POST", _url(prefix, "/batches"), KEY, content=b"{not json"), None)
    for query in ("limit=abc", "limit=1.5", "limit=", "limit=0"):
        _error(gw.http("GET", _url(prefix, "/batches", query), KEY), "limit")
    _error(gw.http("GET", _url(prefix, "/batches/bad id"), KEY), "batch_id")
    _error(gw.http("POST", _url(prefix, "/batches/file-123/cancel"), KEY), "batch_id")

    # models has one parameter, Azure's api-version, that every route checks alike
    for path in ("/models", "/files", "/batches", "/batches/batch_0", "/files/file-0"):
        reply = gw.http("GET", f"{prefix}{path}?api-version=yesterday", KEY)
        assert _error(reply, "api-version")["code"] == "invalid_api_version"


def test_well_formed_ids_still_answer_404_and_versions_pass(gw: Gateway) -> None:
    for path in ("/v1/files/file-missing", "/v1/batches/batch_missing", "/v1/files/file-missing/content"):
        reply = gw.http("GET", path, KEY)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found", reply.text
    for version in (API_VERSION, "2025-04-01-preview", "preview", "latest"):
        assert gw.http("GET", f"/openai/models?api-version={version}", KEY).status_code == 200
    assert gw.http("GET", "/v1/batches?limit=5", KEY).status_code == 200


# (method, path, what Allow lists): a path's methods are served by several routes, the 405 names them all
NOT_ALLOWED = [
    ("OPTIONS", "/batches", "GET, POST"),
    ("PUT", "/batches", "GET, POST"),
    ("DELETE", "/batches/batch_x", "GET"),
    ("GET", "/batches/batch_x/cancel", "POST"),
    ("PATCH", "/files", "GET, POST"),
    ("OPTIONS", "/files/file-x", "DELETE, GET"),
    ("POST", "/files/file-x/content", "GET"),
    ("DELETE", "/models", "GET"),
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_405_lists_every_method_its_path_serves(gw: Gateway, prefix: str) -> None:
    for method, path, allow in NOT_ALLOWED:
        reply = gw.http(method, _url(prefix, path), KEY)
        assert (reply.status_code, reply.headers.get("allow")) == (405, allow), (method, path, reply.text)
        error = reply.json()["error"]
        assert (error["code"], error["type"]) == ("method_not_allowed", "invalid_request_error")


def test_an_upload_refuses_a_field_the_spec_does_not_name(gw: Gateway) -> None:
    client = gw.client(KEY)
    before = {f.id for f in client.files.list()}
    line = jsonl([chat_line("a", "gpt-mini", "hi")])
    with pytest.raises(openai.BadRequestError) as caught:  # the SDK sends extra_body as form fields
        client.files.create(file=("in.jsonl", line), purpose="batch", extra_body={"target_model_names": "gpt"})
    assert caught.value.param == "target_model_names" and caught.value.code == "unknown_parameter"
    assert "Unknown parameter: 'target_model_names'." in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:  # inside expires_after: anchor and seconds only
        client.files.create(file=("in.jsonl", line), purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 3600, "days": 1})  # type: ignore[typeddict-unknown-key]
    assert caught.value.param == "expires_after[days]" and caught.value.code == "unknown_parameter"

    expiry = '{"anchor": "created_at", "seconds": 3600, "days": 1, "hours": 2}'  # one JSON field, as encoders send
    for seconds in ('"7200"', "7200.0", "true"):  # JSON has integers: a string or a float is the wrong type
        error = _error(_upload(gw, "/v1", {"purpose": "batch",
                                           "expires_after": f'{{"anchor": "created_at", "seconds": {seconds}}}'}),
                       "expires_after.seconds")
        assert error["code"] == "invalid_type", error
    error = _error(_upload(gw, "/v1", {"purpose": "batch", "expires_after": expiry}), "expires_after.days")
    assert error["message"] == "Unknown parameters: 'expires_after.days', 'expires_after.hours'."
    error = _error(_upload(gw, "/v1", {"purpose": "batch", "colour": "blue", "size": "L"}), "colour")
    assert (error["code"], error["message"]) == ("unknown_parameter", "Unknown parameters: 'colour', 'size'.")

    boundary = "zzBOUNDARYzz"
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}

    def part(name: str, value: str, filename: str | None = None) -> str:
        extra = f'; filename="{filename}"' if filename else ""
        return f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n{value}\r\n'

    for parts, param in (
        ([part("purpose", "batch"), part("file", "{}", "in.jsonl"), part("late", "x")], "late"),  # after the file
        ([part("file", "{}", "in.jsonl"), part("late", "x"), part("purpose", "batch")], "late"),  # spooled first
        ([part("purpose", "batch"), part("attachment", "{}", "a.jsonl"), part("file", "{}", "in.jsonl")],
         "attachment"),  # a second file part under another name
    ):
        body = "".join(parts) + f"--{boundary}--\r\n"
        _error(gw.http("POST", "/v1/files", KEY, content=body, headers=headers), param)
    assert {f.id for f in client.files.list()} == before  # nothing refused was kept

    # LiteLLM's docs have its proxy's clients send custom_llm_provider: a routing hint, taken
    kept = client.files.create(file=("in.jsonl", line), purpose="batch", extra_body={"custom_llm_provider": "openai"})
    assert kept.purpose == "batch"
