"""The parameters of `POST /v1/batches` and the files' `expires_after`, as one set of models.

The HTTP routes answer a failure in OpenAI's shape (tests/servers/test_server.py, tests/servers/test_error_shapes.py);
the service, which the CLI calls directly, refuses the same values with the same rules.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.errors import InvalidRequest
from gateway.pipeline.batch_params import CreateBatch, ExpiresAfter, checked, checked_metadata

GOOD = {"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


def test_a_full_body_is_typed() -> None:
    body = CreateBatch.model_validate({**GOOD, "metadata": {"job": "nightly"},
                                       "output_expires_after": {"anchor": "created_at", "seconds": 7200},
                                       "unused_by_us": 1})
    assert body.metadata == {"job": "nightly"}
    assert body.output_expires_after == ExpiresAfter(anchor="created_at", seconds=7200)
    assert body.output_expires_after.at(1000) == 8200


@pytest.mark.parametrize(("change", "loc", "kind"), [
    ({"input_file_id": None}, ("input_file_id",), "missing"),
    ({"endpoint": ""}, ("endpoint",), "missing"),
    ({"completion_window": 24}, ("completion_window",), "string_type"),
    ({"metadata": "tags"}, ("metadata",), "dict_type"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, ("metadata",), "too_long"),
    ({"metadata": {"k": "v" * 513}}, ("metadata", "k"), "string_too_long"),
    ({"metadata": {"k": 1}}, ("metadata", "k"), "string_type"),
    ({"output_expires_after": {"anchor": "now", "seconds": 3600}}, ("output_expires_after", "anchor"),
     "literal_error"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 5}}, ("output_expires_after", "seconds"),
     "invalid_seconds"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": True}}, ("output_expires_after", "seconds"),
     "invalid_seconds"),
])
def test_refused_naming_the_param(change: dict[str, Any], loc: tuple[str, ...], kind: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CreateBatch.model_validate({**GOOD, **change})
    error = caught.value.errors()[0]
    assert (tuple(error["loc"]), error["type"]) == (loc, kind)


def test_a_form_fields_seconds_are_text() -> None:
    assert ExpiresAfter.model_validate({"anchor": "created_at", "seconds": "3600"}).seconds == 3600
    with pytest.raises(ValidationError) as caught:
        ExpiresAfter.model_validate({"anchor": "created_at", "seconds": "soon"})
    assert "between 3600 (1 hour) and 2592000 (30 days)" in str(caught.value)


def test_the_service_refuses_with_the_same_rules() -> None:
    with pytest.raises(InvalidRequest) as caught:
        checked(ExpiresAfter, {"anchor": "created_at", "seconds": 2_592_001}, "output_expires_after")
    assert caught.value.param == "output_expires_after.seconds" and "2592000" in caught.value.message
    with pytest.raises(InvalidRequest) as caught:
        checked_metadata({"k": "v" * 513})
    assert (caught.value.param, caught.value.code) == ("metadata.k", "invalid_metadata")
    assert checked_metadata(None) is None and checked_metadata({"a": "b"}) == {"a": "b"}
    typed = ExpiresAfter(anchor="created_at", seconds=3600)
    assert checked(ExpiresAfter, typed, "expires_after") is typed
