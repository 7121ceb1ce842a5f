"""A team-shaped gateway for the server tests: one real `batchyard` server process with three teams
(alpha limited to some models, beta, gamma), a master key and small limits, over the loopback
upstream (tests/fakes/upstream/server.py). Module-scoped fixtures: each test module that imports them gets its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway

MASTER, ALPHA, BETA, GAMMA = "sk-master-0123456789", "sk-alpha-0123456789", "sk-beta-0123456789", "sk-gamma-012345"
MAX_LINES, MAX_FILE_BYTES = 20, 16_384
ALPHA_MODELS = ["embed-small", "gpt-azure", "gpt-mini"]
ALL_MODELS = ["embed-small", "gpt-azure", "gpt-mini", "secret-model"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    teams = [
        {"team_id": "alpha", "api_keys": [ALPHA], "models": ALPHA_MODELS},
        {"team_id": "beta", "api_keys": [BETA]},
        {"team_id": "gamma", "api_keys": [GAMMA]},
    ]
    config = gateway_config(
        upstream,
        master_key=MASTER,
        teams=teams,
        completion_windows={"4s": 4},  # short enough to watch a batch expire
        max_lines=MAX_LINES,
        max_file_bytes=MAX_FILE_BYTES,
    )
    with start_gateway(config, tmp_path_factory.mktemp("gw") / "data") as gateway:
        yield gateway
        log = gateway.log()
    for key in (MASTER, ALPHA, BETA, GAMMA, "sk-wrong-key"):
        assert key not in log, "an API key was logged"


@pytest.fixture(scope="module")
def alpha(gw: Gateway) -> OpenAI:
    return gw.client(ALPHA)


@pytest.fixture(scope="module")
def beta(gw: Gateway) -> OpenAI:
    return gw.client(BETA)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]
