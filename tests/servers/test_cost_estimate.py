"""`GET /v1/files/{id}/cost_estimate` and `batchyard run --dry-run` on real processes: the estimate at the prices
each route charges (an upstream route's config prices, a native route's batch prices; a local route's, with
its own tokenizer, is in tests/engine/test_cost_estimate_local.py), the errors a bad file would hit as its
batch reports them, another team's file a 404, and a dry run that sends nothing and writes nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import chat_line, gateway_config, jsonl, wait_batch
from tests.support.team_helpers import MODES, serve

CHEAP = (1e-6, 3e-6)  # gpt-mini's config prices (USD per input, output token)
DEAR = (2e-6, 8e-6)  # gpt-4o's, and gpt-native's before the batch discount


def _deployment(upstream: Upstream, name: str, **info: Any) -> dict[str, Any]:
    params = {"model": "openai/gpt-4o-mini", "api_base": upstream.v1_url, "api_key": upstream.api_key}
    return {"model_name": name, "litellm_params": params, "model_info": info}


def _config(upstream: Upstream) -> dict[str, Any]:
    config = gateway_config(upstream, models=("gpt-mini", "gpt-secret"), master_key="sk-admin", teams=[
        {"team_id": "alpha", "api_keys": ["sk-alpha"], "models": ["gpt-mini", "gpt-4o", "gpt-native"]},
        {"team_id": "beta", "api_keys": ["sk-beta"]},
    ])
    config["model_list"][0]["model_info"] = {"input_cost_per_token": CHEAP[0], "output_cost_per_token": CHEAP[1]}
    config["model_list"] += [
        _deployment(upstream, "gpt-4o", input_cost_per_token=DEAR[0], output_cost_per_token=DEAR[1]),
        _deployment(upstream, "gpt-native", batch_mode="native", native_poll_max_seconds=0.2,
                    input_cost_per_token=DEAR[0], output_cost_per_token=DEAR[1]),
    ]
    return config


def _lines() -> list[dict[str, Any]]:
    return [
        *(chat_line(f"m{i}", "gpt-mini", f"question number {i}", max_tokens=50) for i in range(3)),
        *(chat_line(f"o{i}", "gpt-4o", f"a longer question, number {i}, for the dear model") for i in range(2)),
        chat_line("n0", "gpt-native", "native one", max_completion_tokens=20),
        chat_line("n1", "gpt-native", "native two", max_completion_tokens=20, n=2),
    ]


def _estimate(client: openai.OpenAI, file_id: str) -> dict[str, Any]:
    reply = client.get(f"/files/{file_id}/cost_estimate", cast_to=object)
    assert isinstance(reply, dict)
    return reply


def _upload(client: openai.OpenAI, lines: list[dict[str, Any] | str]) -> str:
    return client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch").id


def _guess(lines: list[dict[str, Any]]) -> int:
    """The documented estimate: a token per four bytes of the text, four per chat message."""
    return sum(math.ceil(len(line["body"]["messages"][0]["content"].encode()) / 4) + 4 for line in lines)


@pytest.mark.parametrize("mode", MODES)
def test_the_estimate_prices_each_route_as_it_charges(mode: str, upstream: Upstream, tmp_path: Path) -> None:
    from litellm import model_cost, token_counter  # the reference counts: LiteLLM's tiktoken, its price map

    lines = _lines()
    with serve(mode, _config(upstream), tmp_path / "data") as gw:
        client = gw.client("sk-alpha")
        est = _estimate(client, _upload(client, lines))
    assert (est["object"], est["lines"], est["error_count"], est["errors"]["data"]) == ("file.cost_estimate", 7, 0, [])
    models = {m["model"]: m for m in est["models"]}
    assert sorted(models) == ["gpt-4o", "gpt-mini", "gpt-native"]

    mini = models["gpt-mini"]  # upstream, no tokenizer at hand for a made-up model: estimated
    assert (mini["route"], mini["tokenizer"], mini["lines"], mini["output_tokens_max"]) == (
        "upstream", "estimate", 3, 150)
    assert mini["input_tokens"] == _guess(lines[:3])
    assert mini["cost_low"] == pytest.approx(mini["input_tokens"] * CHEAP[0])
    assert mini["cost_high"] == pytest.approx(mini["input_tokens"] * CHEAP[0] + 150 * CHEAP[1])

    dear = models["gpt-4o"]  # an OpenAI model: counted exactly; no max_tokens: the model's own limit
    limit = model_cost["gpt-4o-mini"]["max_output_tokens"]
    exact = sum(token_counter(model="gpt-4o-mini", messages=line["body"]["messages"]) for line in lines[3:5])
    assert (dear["tokenizer"], dear["input_tokens"], dear["output_tokens_max"]) == ("exact", exact, 2 * limit)
    assert dear["cost_low"] == pytest.approx(exact * DEAR[0])
    assert dear["cost_high"] == pytest.approx(exact * DEAR[0] + 2 * limit * DEAR[1])

    native = models["gpt-native"]  # batch prices: half the per-token prices
    assert (native["route"], native["tokenizer"], native["output_tokens_max"]) == ("native", "exact", 20 + 2 * 20)
    assert native["cost_low"] == pytest.approx(native["input_tokens"] * DEAR[0] / 2)
    assert native["cost_high"] == pytest.approx(native["input_tokens"] * DEAR[0] / 2 + 60 * DEAR[1] / 2)

    total = est["total"]
    assert total["lines"] == 7 and total["unpriced_models"] == []
    assert total["input_tokens"] == sum(m["input_tokens"] for m in models.values())
    assert total["output_tokens_max"] == 150 + 2 * limit + 60
    assert total["cost_low"] == pytest.approx(sum(m["cost_low"] for m in models.values()))
    assert total["cost_high"] == pytest.approx(sum(m["cost_high"] for m in models.values()))


def test_bad_lines_are_listed_as_the_batch_lists_them_and_another_teams_file_is_a_404(
    upstream: Upstream, tmp_path: Path
) -> None:
    bad: list[dict[str, Any] | str] = [
        chat_line("ok", "gpt-mini", "fine"),
        "{not json",
        chat_line("secret", "gpt-secret", "not alpha's model"),
        {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-mini"}},
    ]
    with serve("embedded", _config(upstream), tmp_path / "data") as gw:
        alpha, beta = gw.client("sk-alpha"), gw.client("sk-beta")
        file_id = _upload(alpha, bad)
        est = _estimate(alpha, file_id)
        batch = alpha.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        failed = wait_batch(alpha, batch.id)
        with pytest.raises(openai.NotFoundError) as lost:
            _estimate(beta, file_id)  # beta's key, alpha's file
        with pytest.raises(openai.BadRequestError) as malformed:
            _estimate(alpha, "batch_123")
        wrong = gw.http("GET", f"/v1/files/{file_id}/cost_estimate?endpoint=/v1/nowhere", key="sk-alpha")
    assert [(e["line"], e["code"]) for e in est["errors"]["data"]] == [
        (2, "invalid_json_line"), (3, "model_not_found"), (4, "missing_required_parameter")]
    assert est["error_count"] == 3 and est["lines"] == 4
    assert [m["model"] for m in est["models"]] == ["gpt-mini"] and est["models"][0]["lines"] == 1
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    assert est["errors"]["data"] == [e.model_dump() for e in failed.errors.data]  # as the batch reports them
    assert lost.value.status_code == 404 and isinstance(lost.value.body, dict)
    assert lost.value.body["code"] == "not_found"
    assert malformed.value.status_code == 400 and isinstance(malformed.value.body, dict)
    assert malformed.value.body["code"] == "invalid_id"
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_value"
    assert wrong.json()["error"]["param"] == "endpoint"


def _dry_run(config: dict[str, Any], text: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`batchyard run --dry-run -q` on `text` as the input file; (the finished process, the output path)."""
    cfg, inp, out = tmp_path / "config.yaml", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    cfg.write_text(yaml.safe_dump(config))
    inp.write_text(text)
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(inp), "-o", str(out), "--config",
                           str(cfg), "--dry-run", "-q"], capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    return proc, out


def _rows(table: str) -> dict[str, list[str]]:
    return {cells[0]: cells for line in table.splitlines() if (cells := line.split())}


def test_dry_run_prints_the_table_and_sends_nothing(upstream: Upstream, tmp_path: Path) -> None:
    before = upstream.stats()
    lines = _lines()
    config = _config(upstream)
    proc, out = _dry_run(config, jsonl(lines).decode(), tmp_path)
    after = upstream.stats()
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout
    assert after == before  # not one request, no upstream file or batch
    assert not out.exists()
    rows = _rows(table)
    assert rows["model"][:2] == ["model", "route"]
    assert rows["gpt-mini"][:6] == ["gpt-mini", "upstream", "3", str(_guess(lines[:3])), "estimate", "150"]
    assert rows["gpt-native"][1:3] == ["native", "2"]
    assert rows["total"][1] == "7"
    assert float(rows["gpt-mini"][6]) == pytest.approx(_guess(lines[:3]) * CHEAP[0], abs=1e-6)


def test_dry_run_lists_the_lines_that_would_fail(upstream: Upstream, tmp_path: Path) -> None:
    proc, out = _dry_run(_config(upstream), json.dumps(chat_line("a", "gpt-mini", "fine")) + "\n{broken\n", tmp_path)
    assert proc.returncode == 1, proc.stderr  # the run would fail on the file: bad input
    assert "1 line(s) would fail the batch:" in proc.stdout and "line 2: invalid_json_line" in proc.stdout
    assert not out.exists()
