"""A batch line's body is data, never configuration: generated from every keyword the pinned LiteLLM knows.

Every name LiteLLM reads (its own parameter list, its call functions' and the Router's signatures, the
`kwargs` keys the Router reads) goes into a line, with a value that points at a server the team runs, on
each kind of upstream route: the OpenAI-wire pass-through, LiteLLM's completion path for an OpenAI
deployment, and LiteLLM's translation for Anthropic. Then, against the team's listener and the
operator's upstreams: the listener got nothing; every request the upstreams got carried the operator's
key (they answer 401 to any other) and named the operator's model; every line either got its 400
naming the field or was answered by the route's own model; and the team's spend is exactly the price
the operator set times the usage of the lines that ran.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scripts.gen_litellm_names import litellm_names
from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import REPO_ROOT, Gateway, read_jsonl, start_gateway, submit, wait_batch
from tests.support.team_helpers import metric

OPENAI_KEY, ANTHROPIC_KEY, TEAM_KEY = "sk-operator-openai-0000", "sk-operator-anthropic-0000", "sk-research-0000"
PRICE = 1e-6  # USD per token, in and out, on every route: a whole batch stays far below the $1 budget
# model_name -> the operator's deployment model (what the upstream must be asked for and answer with)
ROUTES = {"gpt-wire": "gpt-wire-upstream", "gpt-litellm": "gpt-litellm-upstream", "claude": "claude-upstream"}
# The fields a chat line must hold (a wrong value there fails the whole batch at validation, which is
# OpenAI's rule, not this test's subject), and `stream`, which validation answers itself.
NOT_GENERATED = {"model", "messages", "stream"}


class Listener:
    """The team's own server: records every request that reaches it (it must never get one)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                seen.append((self.path, dict(self.headers)))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id": "stolen", "choices": []}')

            do_GET = do_POST = do_PUT = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(api_key=OPENAI_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def anthropic() -> Iterator[Stub]:
    with start_stub("tests.fakes.stubs_anthropic", ["--api-key", ANTHROPIC_KEY]) as stub:
        yield stub


@pytest.fixture(scope="module")
def gw(upstream: Upstream, anthropic: Stub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    prices = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    config = {
        "model_list": [
            {"model_name": "gpt-wire", "model_info": prices,
             "litellm_params": {"model": "openai/gpt-wire-upstream", "api_base": upstream.v1_url,
                                "api_key": OPENAI_KEY}},
            # max_parallel_requests keeps this deployment on LiteLLM's completion path (not the pass-through)
            {"model_name": "gpt-litellm", "model_info": prices,
             "litellm_params": {"model": "openai/gpt-litellm-upstream", "api_base": upstream.v1_url,
                                "api_key": OPENAI_KEY, "max_parallel_requests": 16}},
            {"model_name": "claude", "model_info": prices,
             "litellm_params": {"model": "anthropic/claude-upstream", "api_base": anthropic.url,
                                "api_key": ANTHROPIC_KEY}},
            {"model_name": "secret-model", "model_info": prices,
             "litellm_params": {"model": "openai/secret-upstream", "api_base": upstream.v1_url, "api_key": OPENAI_KEY}},
        ],
        "router_settings": {"num_retries": 0, "timeout": 30},
        "general_settings": {"master_key": "sk-admin"},
        "batch_settings": {"teams": [{"team_id": "research", "api_keys": [TEAM_KEY], "models": list(ROUTES),
                                      "max_budget": 1.0}]},
    }
    with start_gateway(config, tmp_path_factory.mktemp("gw") / "data") as gateway:
        yield gateway
        log = gateway.log()
    for key in (OPENAI_KEY, ANTHROPIC_KEY, TEAM_KEY):
        assert key not in log, "a key was logged"


def _hostile_value(name: str, listener: Listener) -> Any:
    """What a team would put in field `name` to reach its own server, or to skip the upstream and the bill."""
    if "cost" in name or "price" in name or name in ("max_budget", "budget_duration"):
        return 0
    if name.startswith("mock_testing") or name in ("mock_timeout", "no-log", "caching", "fastest_response"):
        return True
    if name in ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks", "tags"):
        return ["secret-model"]
    if name in ("headers", "extra_headers", "extra_body", "extra_query", "metadata", "litellm_metadata",
                "model_info", "litellm_params"):
        return {"api_base": listener.url, "Authorization": "Bearer team", "model": "secret-model"}
    return listener.url


def _line(custom_id: str, model: str, **fields: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, **fields}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _lines(listener: Listener) -> list[dict[str, Any]]:
    names = sorted(litellm_names() - NOT_GENERATED)
    lines = []
    for model in ROUTES:
        lines.append(_line(f"{model}-control", model))
        lines += [_line(f"{model}-{name}", model, **{name: _hostile_value(name, listener)}) for name in names]
        # the reported attacks, as written
        lines.append(_line(f"{model}-key-and-base", model, api_key="sk-team", api_base=listener.url))
        lines.append(_line(f"{model}-fallback-mock", model, fallbacks=["secret-model"], mock_testing_fallbacks=True))
        lines.append(_line(f"{model}-mock", model, mock_response="free answer"))
        lines.append(_line(f"{model}-free", model, input_cost_per_token=0, output_cost_per_token=0))
    return lines


def test_no_litellm_keyword_in_a_line_changes_destination_key_model_or_cost(
    gw: Gateway, upstream: Upstream, anthropic: Stub, listener: Listener, tmp_path: Path
) -> None:
    lines = _lines(listener)
    client = gw.client(TEAM_KEY)
    batch = wait_batch(client, submit(client, lines).id, timeout=300)
    assert batch.status == "completed", batch
    written = read_jsonl(client, batch.output_file_id) + read_jsonl(client, batch.error_file_id)
    results = {r["custom_id"]: r for r in written}
    assert set(results) == {line["custom_id"] for line in lines}

    assert listener.seen == [], f"the team's server was called: {listener.seen[:3]}"
    by_model = {**upstream.stats()["by_model"], **anthropic.stats()["by_model"]}
    assert set(by_model) <= set(ROUTES.values()), by_model  # never secret-upstream, never a model a line named

    ran, spent = 0, 0.0
    for line in lines:
        custom_id, extra = line["custom_id"], set(line["body"]) - {"model", "messages", "max_tokens"}
        response = results[custom_id]["response"]
        if extra & _settings():
            # a LiteLLM setting: refused before anything is sent, with OpenAI's words and the field
            assert response is not None and response["status_code"] == 400, results[custom_id]
            error = response["body"]["error"]
            assert (error["code"], error["type"]) == ("unknown_parameter", "invalid_request_error"), error
            assert error["param"] in extra & _settings(), (custom_id, error)
            assert error["message"] == f"Unrecognized request argument supplied: {error['param']}"
            continue
        # a documented request field LiteLLM shares the name of (user, temperature, ...), with a value a
        # provider may refuse: whatever the answer, it came from the operator's upstream, with its key
        if response is None:
            assert results[custom_id]["error"]["code"], results[custom_id]
            continue
        status, body = response["status_code"], response["body"]
        assert status != 401, f"{custom_id}: the upstream saw a key that is not the operator's"
        if status == 200:
            ran += 1
            assert body["model"] == ROUTES[line["body"]["model"]], (custom_id, body)
            assert "free answer" not in json.dumps(body)
            usage = body["usage"]
            spent += (usage["prompt_tokens"] + usage["completion_tokens"]) * PRICE
    # the controls ran, and so did the documented fields LiteLLM happens to share (user, temperature, ...)
    assert all(results[f"{m}-control"]["response"]["status_code"] == 200 for m in ROUTES)
    for model in ROUTES:
        for attack in ("key-and-base", "fallback-mock", "mock", "free"):
            assert results[f"{model}-{attack}"]["response"]["status_code"] == 400, results[f"{model}-{attack}"]
    assert metric(gw, "batchyard_team_spend_usd", team="research") == pytest.approx(spent, abs=1e-9)
    assert ran >= len(ROUTES)


def _settings() -> frozenset[str]:
    from gateway.config.litellm.litellm_names import LITELLM_SETTINGS

    return LITELLM_SETTINGS


def test_the_generated_list_of_litellm_keywords_matches_the_installed_litellm() -> None:
    """gateway/config/litellm/litellm_names.py and proxy_names.py (which the config reads without importing LiteLLM) are
    current. Checked in a fresh process: LiteLLM's module grows the attributes its lazy imports load, so what
    `vars(litellm)` holds depends on what this test process ran before."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gen_litellm_names.py"), "--check"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
