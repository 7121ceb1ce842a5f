"""Files and Batches against OpenAI's own OpenAPI description, property-based: schemathesis drives a
real server (uvicorn on loopback) with requests generated from tests/data/openai_files_batches.yaml,
valid and invalid ones, and checks every reply: no 5xx, each body and status as the description
says (errors in OpenAI's error shape), bad data refused with a 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from schemathesis import checks
from schemathesis.config import SchemathesisConfig

from tests.fakes.upstream.server import start_upstream
from tests.support.server_helpers import Gateway, chat_line, gateway_config, jsonl, start_gateway

SPEC = Path(__file__).resolve().parents[1] / "data" / "openai_files_batches.yaml"
KEY = "sk-schema-0123456789"
EXAMPLES = 12  # per operation and mode: about 20 s in all on a busy 2-core machine

schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with start_upstream() as upstream:
        config = gateway_config(upstream, teams=[{"team_id": "t", "api_keys": [KEY]}])
        with start_gateway(config, tmp_path_factory.mktemp("schema") / "data") as gw:
            # something to list, read and cancel besides what the generated requests create
            client = gw.client(KEY)
            file = client.files.create(file=("in.jsonl", jsonl([chat_line("a", "gpt-mini", "hi")])), purpose="batch")
            client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
            yield gw
            log = gw.log()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def api_schema(gateway: Gateway) -> schemathesis.BaseSchema:
    config = SchemathesisConfig.from_dict({
        "base-url": gateway.url + "/v1",
        "headers": {"Authorization": f"Bearer {KEY}"},
        "generation": {"mode": "all", "max-examples": EXAMPLES},
        "phases": {"stateful": {"enabled": False}},
    })
    return schemathesis.openapi.from_path(SPEC, config=config)


@schema.parametrize()
def test_every_reply_conforms(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
        checks.negative_data_rejection,
        checks.unsupported_method,  # a 405 with an Allow header (ST205)
        checks.allow_header_conformance,  # OPTIONS: Allow lists exactly the path's methods
    ])
