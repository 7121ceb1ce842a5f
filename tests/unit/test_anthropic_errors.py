"""An error a route answered to an Anthropic Messages line reads as Anthropic's: `{"type": "error", "error":
{"type", "message"}}`, the provider's words, Anthropic's type for the status."""

from __future__ import annotations

import pytest

from gateway.message_batches.wire import anthropic_error

OPENAI_SHAPED = {"error": {"message": "said the provider", "type": "invalid_request_error", "param": "x",
                           "code": "bad_request"}}


@pytest.mark.parametrize(("status", "type_"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
    (502, "api_error"), (529, "overloaded_error"), (422, "invalid_request_error"), (408, "invalid_request_error"),
])
def test_the_type_follows_the_status(status: int, type_: str) -> None:
    body = {"error": {"message": "said the provider", "type": "BadRequestError", "code": status}}
    assert anthropic_error(status, body) == {"type": "error", "error": {"type": type_,
                                                                        "message": "said the provider"}}


def test_an_anthropic_type_the_provider_named_is_kept() -> None:
    said = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    assert anthropic_error(503, said) == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    assert anthropic_error(400, OPENAI_SHAPED)["error"] == {"type": "invalid_request_error",
                                                            "message": "said the provider"}


def test_an_error_object_at_the_top_level_or_none_at_all() -> None:
    older_vllm = {"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}
    assert anthropic_error(400, older_vllm)["error"] == {"type": "invalid_request_error", "message": "too long"}
    assert anthropic_error(502, None)["error"] == {"type": "api_error", "message": "upstream 502"}
