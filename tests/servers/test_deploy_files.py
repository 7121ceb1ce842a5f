"""The deployment files speak batchyard's real language: docker/compose.yaml, docker/e2e/ and the Helm
chart (charts/batchyard) use only flags the CLI has, configs it loads, and the metric batchyard exports.
(scripts/chart_check.sh renders the chart and checks the rendered manifests; this needs no helm.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import metrics
from gateway.cli.main import build_parser
from gateway.config.routes import RouteKind
from gateway.config.schema import parse_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "batchyard"


def compose(path: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / path).read_text())


def parses(args: list[str]) -> Any:
    """The namespace batchyard's CLI makes of `args`; fails on any flag it does not know."""
    parsed, extra = build_parser().parse_known_args(args)
    assert extra == [], f"flags batchyard does not know: {extra}"
    return parsed


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_the_blob_location_flag_keeps_its_earlier_name(command: str):
    """`--blobs` says where file bytes live; `--storage`, its name before "storage" meant only the teams' byte
    ledger, still sets it, so a deployment written for it keeps working."""
    for flag in ("--blobs", "--storage"):
        parsed = parses([command, "--config", "c.yaml", "--redis-url", "redis://r:6379/0", flag, "s3://b/p"])
        assert parsed.blobs == "s3://b/p"


@pytest.mark.parametrize("path", ["docker/compose.yaml", "docker/e2e/compose.yaml"])
def test_compose_commands_are_batchyard_commands(path: str):
    services = compose(path)["services"]
    for name in ("gateway", "worker"):
        if "command" in services.get(name, {}):
            parsed = parses(services[name]["command"])
            assert parsed.command == ("serve" if name == "gateway" else "worker")
            assert parsed.redis_url == "redis://redis:6379/0" and parsed.blobs == "s3://batchyard/data"
            assert parsed.config == "/config/team.yaml"


def test_the_e2e_config_routes_one_model_upstream_to_the_stand_in_and_one_to_the_mounted_tiny_model(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream")
    monkeypatch.setenv("BATCHYARD_MASTER_KEY", "sk-master")
    config = parse_config(yaml.safe_load((ROOT / "docker/e2e/team.yaml").read_text()), "docker/e2e/team.yaml")
    kinds = {name: route.kind for name, route in config.routes.items()}
    assert kinds == {"gpt-4o-mini": RouteKind.UPSTREAM, "tiny-llama": RouteKind.LOCAL}
    stand_in = compose("docker/e2e/compose.yaml")["services"]["upstream"]
    port = stand_in["entrypoint"][stand_in["entrypoint"].index("--port") + 1]
    assert config.routes["gpt-4o-mini"].entries[0].litellm_params.model_extra["api_base"] == f"http://upstream:{port}/v1"
    mounts = compose("docker/e2e/compose.yaml")["services"]["worker"]["volumes"]
    assert any(m.endswith(":/models:ro") for m in mounts)
    assert config.routes["tiny-llama"].engine_args["model"] == "/models/tiny-llama"


def template_flags() -> set[str]:
    flags = set()
    for template in (CHART / "templates").glob("*"):
        flags |= set(re.findall(r"^\s*- (--[a-z][a-z-]*)\s*$", template.read_text(), re.M))
    return flags


def test_every_flag_the_chart_passes_is_a_flag_of_serve_or_worker(capsys: pytest.CaptureFixture[str]):
    serve_and_worker: set[str] = set()
    for command in ("serve", "worker"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        serve_and_worker |= set(re.findall(r"(--[a-z][a-z-]*)", capsys.readouterr().out))
    flags = template_flags()
    assert {"--config", "--blobs", "--models", "--upstream-only", "--metrics-port", "--redis-ca-file",
            "--allow-evicting-redis"} <= flags
    assert flags <= serve_and_worker, f"not batchyard flags: {flags - serve_and_worker}"
    # the Redis URL (a password from a Secret) is the environment variable serve and worker read, not an arg
    assert "- name: BATCHYARD_REDIS_URL" in (CHART / "templates" / "_helpers.tpl").read_text()
    assert "--redis-url" not in flags


def test_the_keda_trigger_reads_the_queue_depth_batchyard_exports():
    body, _ = metrics.render(metrics.SharedState(queue_depth={"some-route": 3}), None)
    exported = {line.split("{")[0] for line in body.decode().splitlines() if 'route="some-route"' in line}
    workers = (CHART / "templates" / "workers.yaml").read_text()
    query = re.search(r'printf "sum\(max by \(route\) \((\w+)\{route=~`%s`\}\)\)"', workers)
    assert query is not None and {query.group(1)} == exported
    assert 'ignoreNullValues: "false"' in workers  # no answer is not an empty queue


def test_the_charts_default_config_is_one_batchyard_loads(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("BATCHYARD_MASTER_KEY", "sk-master")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    config = parse_config(values["config"], "charts/batchyard/values.yaml")
    assert config.routes and config.master_key == "sk-master"
    assert config.batch.metrics.require_auth is True  # /metrics is the master key's, in the chart too
    assert values["metrics"]["annotations"] is False  # annotation-driven scrapes send no key


def test_the_gpu_values_file_runs_a_local_model_on_gpus_with_autoscaling(monkeypatch: pytest.MonkeyPatch):
    for name in ("OPENAI_API_KEY", "AZURE_API_BASE", "AZURE_API_KEY", "BATCHYARD_MASTER_KEY"):
        monkeypatch.setenv(name, "x")
    values = yaml.safe_load((CHART / "ci" / "gpu-values.yaml").read_text())
    config = parse_config(values["config"], "charts/batchyard/ci/gpu-values.yaml")
    local = {n for n, r in config.routes.items() if r.kind is RouteKind.LOCAL}
    pools = values["workers"]["local"]
    assert pools and all(set(pool["models"]) <= local and pool["gpus"] >= 1 for pool in pools)
    assert values["autoscaling"]["keda"]["enabled"] is True
