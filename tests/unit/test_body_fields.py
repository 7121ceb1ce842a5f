"""What each endpoint's body must hold, checked per line at validation (OpenAI's codes, the
`body.<field>` param and the 1-based line), before any request is sent anywhere."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.config.endpoints import ENDPOINTS
from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint
from gateway.errors import LineCode, LineError
from gateway.pipeline.validate import LineChecker, LineProblem

CONFIG = parse_config({"model_list": [
    {"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "sk-test", "api_base": "http://127.0.0.1:9"}},
]})


def check(url: str, body: dict[str, Any], line: int = 7) -> BatchRequest | LineError | Any:
    """The line's request, or its error. A body problem is a `LineProblem`: it fails a strict batch (the
    API's) and is answered in place by `batchyard run`, as vLLM's run_batch answers it."""
    raw = json.dumps({"custom_id": "c", "method": "POST", "url": url, "body": {"model": "m", **body}}).encode()
    checked = LineChecker(CONFIG, endpoint=None, allowed_models=None).check(raw, line)
    if isinstance(checked, LineProblem):
        assert checked.custom_id == "c"
        return checked.error
    return checked


MISSING = [
    ("/v1/chat/completions", {}, "body.messages"),
    ("/v1/completions", {}, "body.prompt"),
    ("/v1/embeddings", {}, "body.input"),
    ("/v1/responses", {"instructions": "x"}, "body.input"),
    ("/v1/moderations", {}, "body.input"),
    ("/v1/images/generations", {"size": "1024x1024"}, "body.prompt"),
    ("/v1/audio/transcriptions", {"language": "en"}, "body.file_url"),
    ("/v1/audio/translations", {}, "body.file_url"),
    ("/v1/score", {}, "body.text_1"),
    ("/v1/score", {"queries": "q"}, "body.documents"),  # the pair it came closest to
    ("/v1/rerank", {"query": "q"}, "body.documents"),
    ("/v1/rerank", {"documents": ["d"]}, "body.query"),
    ("/v1/chat/completions", {"messages": None}, "body.messages"),  # null is missing
]


@pytest.mark.parametrize(("url", "body", "param"), MISSING)
def test_a_missing_field_is_missing_required_parameter(url: str, body: dict[str, Any], param: str) -> None:
    error = check(url, body)
    assert error == LineError(LineCode.MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{param}'.", 7,
                              param)


PRESENT = [
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/completions", {"prompt": ["a", "b"]}),
    ("/v1/embeddings", {"input": "x"}),
    ("/v1/responses", {"input": [{"role": "user", "content": "x"}]}),
    ("/v1/moderations", {"input": "x"}),
    ("/v1/images/generations", {"prompt": "a cat"}),
    ("/v1/audio/transcriptions", {"file_url": "data:audio/wav;base64,AAAA"}),
    ("/v1/audio/translations", {"file": "AAAA"}),
    ("/v1/score", {"text_1": "a", "text_2": ["b"]}),
    ("/v1/score", {"queries": "a", "documents": ["b"]}),
    ("/v1/score", {"queries": "a", "items": ["b"]}),
    ("/v1/score", {"data_1": "a", "data_2": "b"}),
    ("/v1/rerank", {"query": "q", "documents": ["d"]}),
]


@pytest.mark.parametrize(("url", "body"), PRESENT)
def test_a_complete_body_passes(url: str, body: dict[str, Any]) -> None:
    request = check(url, body)
    assert isinstance(request, BatchRequest) and request.line == 7 and request.body == {"model": "m", **body}


@pytest.mark.parametrize(("url", "body", "param", "wanted", "got"), [
    ("/v1/chat/completions", {"messages": "hi"}, "body.messages", "an array", "a string"),
    ("/v1/chat/completions", {"messages": {"role": "user"}}, "body.messages", "an array", "an object"),
    ("/v1/embeddings", {"input": 3}, "body.input", "a string or an array", "an integer"),
    ("/v1/images/generations", {"prompt": ["a"]}, "body.prompt", "a string", "an array"),
])
def test_a_mistyped_field_is_invalid_type(url: str, body: dict[str, Any], param: str, wanted: str, got: str) -> None:
    error = check(url, body, line=2)
    assert isinstance(error, LineError) and (error.code, error.line, error.param) == (LineCode.INVALID_TYPE, 2, param)
    assert error.message == f"Invalid type for '{param}': expected {wanted}, but got {got} instead."


def test_every_endpoint_has_its_required_fields() -> None:
    assert set(ENDPOINTS) == set(Endpoint) and all(rule.required for rule in ENDPOINTS.values())
