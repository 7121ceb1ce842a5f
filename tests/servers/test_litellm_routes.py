"""LiteLLM's own configs, as LiteLLM's users have them: each loads, and a batch through `batchyard run --config`
is answered by the deployment LiteLLM's Router would choose.

The configs are data files (tests/data/litellm_configs/): load_balancer.yaml, simple_config.yaml and
wildcard_config.yaml as the installed LiteLLM ships them (proxy/example_config_yaml/, proxy/), the others
as LiteLLM's docs write them. Only `api_base` is pointed at the loopback upstream (and the variables their
`os.environ/` names are set). The upstream echoes the model it was sent, so each answer says which
deployment, with which model, served the line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli.config_check import check_command
from gateway.config.schema import load_config, parse_config
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.cli_in_process import batchyard
from tests.support.server_helpers import read_jsonl, start_gateway, submit, wait_batch

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "litellm_configs"


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # what the configs' os.environ/ read, here and in `run`


@pytest.fixture(scope="module")
def second() -> Iterator[Upstream]:
    """Another loopback upstream: a line answered there came through the deployment that names it."""
    with start_upstream() as server:
        yield server


def localised(name: str, tmp: Path, api_base: dict[str, str] | str, drop: tuple[str, ...] = ()) -> Path:
    """The data file with each deployment's `api_base` on the loopback (by model_name, or one for all), less
    the model_names in `drop`."""
    raw = yaml.safe_load((CONFIGS / name).read_text())
    raw["model_list"] = [e for e in raw["model_list"] if e["model_name"] not in drop]
    for entry in raw["model_list"]:
        base = api_base if isinstance(api_base, str) else api_base.get(entry["model_name"])
        if base is not None:
            entry["litellm_params"]["api_base"] = base
    path = tmp / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def chat(cid: str, model: str, text: str = "hello") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})


def run(capsys: pytest.CaptureFixture[str], tmp: Path, cfg: Path, lines: list[str],
        env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """`batchyard run` of `lines` on `cfg`, called as a function (tests/support/cli_in_process.py: LiteLLM's imports
    paid once, not once a case); its results by custom_id."""
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    full_env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENAI_API_KEY": "sk-test", **(env or {})}
    proc = batchyard(capsys, "run", "-i", str(src), "-o", str(out), "--config", str(cfg), "--no-progress",
                     "--workers", "0", env=full_env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    results = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(results) == len(lines)
    return results


def answered_as(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """custom_id -> the model the upstream was sent (it echoes it); every line answered 200."""
    for cid, result in results.items():
        assert result["response"] is not None and result["response"]["status_code"] == 200, (cid, result)
    return {cid: r["response"]["body"]["model"] for cid, r in results.items()}


def test_load_balancer_yaml_tpm_rpm_beside_litellm_params(upstream: Upstream, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from litellm import Router

    # The file's last entry names no provider LiteLLM knows: LiteLLM's own Router refuses it as it starts (and
    # so does batchyard's); the rest of the file is what this test runs.
    mistral = yaml.safe_load((CONFIGS / "load_balancer.yaml").read_text())["model_list"][-1]
    with pytest.raises(Exception, match="LLM Provider NOT provided"):
        Router(model_list=[mistral])
    cfg = localised("load_balancer.yaml", tmp_path, upstream.v1_url, drop=(mistral["model_name"],))
    config = load_config(cfg)
    # the Router gets tpm/rpm where load_balancer.yaml writes them, and reads them there
    deployments = config.routes["gpt-3.5-turbo"].model_list()
    assert [(d.get("tpm"), d.get("rpm")) for d in deployments] == [(20000, 3), (20000, 3), (None, None)]
    assert [d["litellm_params"]["model"] for d in deployments] == [
        "openai/gpt-3.5-turbo", "openai/gpt-3.5-turbo", "openrouter/gpt-3.5-turbo"]  # the prefix LiteLLM infers
    # the Router takes them as its own limits (it keeps them in litellm_params, where its checks read them)
    router = Router(model_list=[d for r in config.routes.values() for d in r.model_list()])
    assert [d["litellm_params"].get("rpm") for d in router.model_list] == [3, 3, None]
    upstream.reset()
    results = run(capsys, tmp_path, cfg, [chat(f"l{i}", "gpt-3.5-turbo") for i in range(3)])  # within the rpm of each
    # every deployment sends the model as LiteLLM does: no provider prefix on the wire
    assert set(answered_as(results).values()) == {"gpt-3.5-turbo"}
    assert upstream.stats()["by_model"] == {"gpt-3.5-turbo": 3}


def test_a_prefix_less_model_goes_to_the_provider_litellm_infers(upstream: Upstream, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = localised("simple_config.yaml", tmp_path, upstream.v1_url)
    assert load_config(cfg).routes["gpt-5-mini"].entries[0].litellm_params.model == "openai/gpt-5-mini"
    assert answered_as(run(capsys, tmp_path, cfg, [chat("a", "gpt-5-mini")])) == {"a": "gpt-5-mini"}


def test_aliases_resolve_to_their_target_and_hidden_ones_are_not_listed(upstream: Upstream, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = localised("alias_config.yaml", tmp_path, upstream.v1_url)
    config = load_config(cfg)
    assert config.listed_models() == ["gpt-3.5-turbo", "gpt-4", "gpt-4o"]  # gpt-4o-latest is hidden
    printed = io.StringIO()
    assert check_command(argparse.Namespace(file=str(cfg), strict_config=False), out=printed) == 0
    assert ("alias gpt-4 -> gpt-3.5-turbo\nalias gpt-4o-latest -> gpt-4o (hidden from /v1/models)\n"
            in printed.getvalue())  # config check names each alias and its target
    lines = [chat("alias", "gpt-4"), chat("hidden", "gpt-4o-latest"), chat("name", "gpt-3.5-turbo")]
    assert answered_as(run(capsys, tmp_path, cfg, lines)) == {"alias": "gpt-3.5-turbo", "hidden": "gpt-4o",
                                                      "name": "gpt-3.5-turbo"}


def test_wildcards_exact_name_first_then_the_most_specific_pattern(upstream: Upstream, second: Upstream,
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # the exact name and `openai/gpt-4*` on the second upstream, `*` and the segment pattern on the first
    bases = {"*": upstream.v1_url, "openai/fo::*:static::*": upstream.v1_url, "openai/gpt-4*": second.v1_url,
             "gpt-4o": second.v1_url}
    cfg = localised("any_model_config.yaml", tmp_path, bases)
    upstream.reset()
    second.reset()
    lines = [chat("exact", "gpt-4o"), chat("star", "gpt-4-turbo"), chat("pattern", "openai/gpt-4.1"),
             chat("segments", "openai/fo::bar:static::baz"), chat("any", "claude-3-haiku"),
             chat("again", "gpt-4-turbo")]
    assert answered_as(run(capsys, tmp_path, cfg, lines)) == {
        "exact": "gpt-4o-2024-08-06",  # the exact model_name wins
        # LiteLLM tries the name as written against every pattern first: `*` takes gpt-4-turbo
        "star": "gpt-4-turbo", "again": "gpt-4-turbo",
        "pattern": "gpt-4.1",  # `openai/gpt-4*` is more specific than `*`
        "segments": "fo::bar:static::baz", "any": "claude-3-haiku",
    }
    assert second.stats()["by_model"] == {"gpt-4o-2024-08-06": 1, "gpt-4.1": 1}
    assert upstream.stats()["by_model"] == {"gpt-4-turbo": 2, "fo::bar:static::baz": 1, "claude-3-haiku": 1}


def test_litellms_wildcard_config_provider_routes(upstream: Upstream, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = localised("wildcard_config.yaml", tmp_path, {"openai/*": upstream.v1_url})
    env = {"ANTHROPIC_API_KEY": "sk-ant", "VERTEXAI_PROJECT": "p", "AZURE_AI_API_BASE": upstream.v1_url,
           "AZURE_AI_API_KEY": "k", "AZURE_API_BASE": upstream.url, "AZURE_API_KEY": "az", "GEMINI_API_KEY": "g",
           "LITELLM_MASTER_KEY": "sk-master", "AZURE_API_VERSION": "2024-10-21"}
    lines = [chat("openai", "openai/gpt-4o-mini"), chat("azure", "azure/my-deployment"),
             chat("inferred", "gpt-4o")]  # no prefix: LiteLLM tries openai/gpt-4o next, which openai/* takes
    assert answered_as(run(capsys, tmp_path, cfg, lines, env)) == {"openai": "gpt-4o-mini", "azure": "my-deployment",
                                                          "inferred": "gpt-4o"}


def test_fallbacks_of_each_kind_hold_on_the_pass_through(upstream: Upstream, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg = localised("fallback_config.yaml", tmp_path, upstream.v1_url)
    lines = [chat("down", "gpt-3.5-turbo", "#fail:500x1 a"), chat("long", "gpt-3.5-turbo", "#toolong:gpt-3.5-turbo"),
             chat("unsafe", "gpt-3.5-turbo", "#unsafe:gpt-3.5-turbo"), chat("fine", "gpt-3.5-turbo")]
    assert answered_as(run(capsys, tmp_path, cfg, lines)) == {
        "down": "gpt-4",  # fallbacks
        "long": "gpt-3.5-turbo-16k",  # context_window_fallbacks
        "unsafe": "claude-2-compatible",  # content_policy_fallbacks
        "fine": "gpt-3.5-turbo",
    }


def test_a_wildcard_routes_rows_are_per_concrete_model(upstream: Upstream, tmp_path: Path) -> None:
    """Quota, cost and the dashboard count a wildcard route's models apart: its shards are per model."""
    cfg = localised("any_model_config.yaml", tmp_path, upstream.v1_url)
    config = load_config(cfg)
    route = config.route("gpt-4-turbo")
    assert route is not None and route.model_name == "gpt-4-turbo" and route.declared == "*"
    assert config.route("gpt-4-turbo") is route  # materialised once
    assert config.lane("gpt-4-turbo") == "*"  # queued under its pattern, which workers host
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join([chat("a", "gpt-4-turbo"), chat("b", "claude-3-haiku"), chat("c", "gpt-4-turbo")]) + "\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENAI_API_KEY": "sk-test"}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config", str(cfg),
         "--no-progress", "--workers", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0] for line in proc.stderr.splitlines() if line.startswith("  ")}
    assert {"gpt-4-turbo", "claude-3-haiku"} <= rows and "*" not in rows


def test_the_configs_load_as_the_router_resolves_them(upstream: Upstream, tmp_path: Path) -> None:
    """Our resolution against the installed Router's own, name by name (LiteLLM is the reference)."""
    import asyncio

    from litellm import Router

    config = load_config(localised("any_model_config.yaml", tmp_path, upstream.v1_url))
    raw = parse_config({"model_list": [e for r in config.routes.values() for e in r.model_list()],
                        "router_settings": {"model_group_alias": {"al": "gpt-4o", "hid": {"model": "*",
                                                                                          "hidden": True}}}})
    router = Router(model_list=[d for r in raw.routes.values() for d in r.model_list()],
                    model_group_alias=raw.router_settings["model_group_alias"])

    async def chosen(name: str) -> str:
        deployment = await router.async_get_available_deployment(model=name, request_kwargs={})
        return str(deployment["litellm_params"]["model"])

    names = ["gpt-4o", "gpt-4-turbo", "openai/gpt-4.1", "openai/fo::x:static::y", "claude-3-haiku", "al",
             "openai/anything", "mistral/large"]
    for name in names:
        route = raw.route(name)
        assert route is not None, name
        assert route.entries[0].litellm_params.model == asyncio.run(chosen(name)), name


def test_a_wildcard_on_litellms_completion_path(upstream: Upstream, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A deployment the pass-through does not take (`max_parallel_requests` is the Router's to apply) keeps
    LiteLLM's completion path: the Router resolves the pattern there, with the same answer."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
model_list:
  - model_name: "lite/*"
    litellm_params: {{model: "openai/*", api_key: sk-test, api_base: "{upstream.v1_url}"}}
    max_parallel_requests: 4
""")
    assert load_config(cfg).routes["lite/*"].model_list()[0]["litellm_params"]["max_parallel_requests"] == 4
    results = run(capsys, tmp_path, cfg, [chat("a", "lite/abc"), chat("b", "lite/xyz")])
    assert answered_as(results) == {"a": "abc", "b": "xyz"}


def test_serve_lists_patterns_and_visible_aliases_and_runs_their_lines(upstream: Upstream, tmp_path: Path) -> None:
    """Through `serve` (the API's validation, a worker, the queue): /v1/models as LiteLLM lists it, and a batch
    whose lines go through a wildcard route and an alias."""
    config = yaml.safe_load(localised("alias_config.yaml", tmp_path, upstream.v1_url).read_text())
    config["model_list"].append({"model_name": "openai/*", "litellm_params": {
        "model": "openai/*", "api_key": "os.environ/OPENAI_API_KEY", "api_base": upstream.v1_url}})
    gateway = start_gateway(config, tmp_path / "data")
    try:
        listed = [m["id"] for m in gateway.http("GET", "/v1/models").json()["data"]]
        assert listed == ["gpt-3.5-turbo", "gpt-4", "gpt-4o", "openai/*"]  # the hidden alias is not listed
        client = gateway.client(None)
        lines = [json.loads(chat("w1", "openai/gpt-4.1")), json.loads(chat("w2", "openai/o3")),
                 json.loads(chat("al", "gpt-4o-latest"))]
        batch = wait_batch(client, submit(client, lines).id)
        assert batch.status == "completed", batch
        out = {r["custom_id"]: r["response"]["body"]["model"] for r in read_jsonl(client, batch.output_file_id)}
        assert out == {"w1": "gpt-4.1", "w2": "o3", "al": "gpt-4o"}
    finally:
        gateway.stop()
