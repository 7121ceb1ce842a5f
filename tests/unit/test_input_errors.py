"""Bad input and bad config: the exact code and 1-based line each must give, never a traceback.

These run `batchyard run` in-process (the real command's `main`); no request
reaches an upstream, so the config points at a closed port: a call would fail loudly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.config.schema import parse_config
from gateway.errors import ConfigError

CONFIG = """
model_list:
  - model_name: known
    litellm_params: {model: openai/known, api_key: sk-test, api_base: "http://127.0.0.1:9/v1"}
batch_settings: {max_lines: 5}
"""


def ok(cid: str, model: str = "no-such-model", url: str = "/v1/chat/completions", **extra: object) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "x"}], **extra}
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def run(tmp_path: Path, config: Path, content: str | bytes) -> tuple[int, str, Path]:
    src = tmp_path / "in.jsonl"
    src.write_bytes(content.encode() if isinstance(content, str) else content)
    out = tmp_path / "out.jsonl"
    code = main(["run", "-i", str(src), "-o", str(out), "--config", str(config), "--no-progress"])
    return code, "", out


FATAL_CASES = [
    ("invalid_json_line", 2, ok("a") + "\n{not json\n"),
    ("invalid_json_line", 1, "[1, 2]\n"),
    ("missing_required_parameter", 2, ok("a") + "\n" + json.dumps({"method": "POST", "url": "/v1/chat/completions",
                                                                    "body": {"model": "known"}})),
    ("missing_required_parameter", 1, json.dumps({"custom_id": "a", "method": "POST", "body": {"model": "known"}})),
    ("missing_required_parameter", 1, json.dumps({"custom_id": "a", "url": "/v1/embeddings", "body": {}})),
    ("missing_required_parameter", 1, json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings"})),
    ("missing_required_parameter", 1, json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                                                  "body": {"input": "x"}})),
    ("invalid_request", 1, json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/embeddings",
                                       "body": {"model": "known"}})),
    ("invalid_request", 1, json.dumps({"custom_id": 7, "method": "POST", "url": "/v1/embeddings",
                                       "body": {"model": "known"}})),
    ("invalid_request", 1, json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": []})),
    ("duplicate_custom_id", 3, "\n".join([ok("a"), ok("b"), ok("a")])),
    ("empty_file", None, ""),
    ("empty_file", None, "\n\n  \n"),
    ("too_many_tasks", 6, "\n".join(ok(f"c{i}") for i in range(6))),
]


@pytest.mark.parametrize(("code", "line", "content"), FATAL_CASES)
def test_fatal_problems_reject_the_file(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], code: str, line: int | None, content: str
) -> None:
    status, _, out = run(tmp_path, config, content)
    err = capsys.readouterr().err
    assert status == 1
    assert not out.exists()  # nothing half-written
    where = f"line {line}" if line is not None else "file"
    assert f"{where}: {code}:" in err
    assert "Traceback" not in err


def test_every_fatal_problem_is_listed(tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = run(tmp_path, config, "\n".join(["{", ok("a"), ok("a"), "nope"]))
    err = capsys.readouterr().err
    assert status == 1
    assert "line 1: invalid_json_line" in err and "line 3: duplicate_custom_id" in err
    assert "line 4: invalid_json_line" in err


def test_per_line_problems_are_answered_in_place(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    content = "\ufeff" + "\r\n".join([
        ok("unknown", "no-such-model"),
        ok("bad-url", "known", url="/v1/no-such-endpoint"),  # images/moderations are endpoints now
        "",
        ok("streaming", "known", stream=True),
        ok("v2-chat", "known", url="/v2/chat/completions"),
    ]) + "\r\n"
    status, _, out = run(tmp_path, config, content)
    assert status == 0, capsys.readouterr().err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["unknown", "bad-url", "streaming", "v2-chat"]
    got = [(x["response"]["status_code"], x["response"]["body"]["error"]["code"]) for x in lines]
    assert got == [(404, "model_not_found"), (400, "invalid_url"), (400, "streaming_unsupported"),
                   (400, "invalid_url")]
    assert all(x["error"] is None and x["id"].startswith("batch_req_") for x in lines)


def test_missing_input_file(tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "-i", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o"), "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 1 and "does not exist" in err and "Traceback" not in err


CONFIG_CASES = [
    ("", "(top level)"),
    ("model_list: []", "model_list"),
    ("model_list: [{model_name: a}]", "model_list[0].litellm_params.model"),
    ("model_list: [{model_name: a, litellm_params: {model: no-such-model}}]", "model_list[0].litellm_params.model"),
    ("model_list: [{model_name: a, litellm_params: {model: openai/a, api_key: os.environ/BATCHYARD_NOT_SET}}]",
     "model_list[0].litellm_params.api_key"),
    ("model_list: [{model_name: a, litellm_params: {model: openai/a}}]\nbatch_settings: {max_lines: -1}",
     "batch_settings.max_lines"),
    ("model_list: [{model_name: a, litellm_params: {model: openai/a}}]\nbatch_settings: {shards: 3}",
     "batch_settings.shards"),
    ("model_list: [{model_name: a, litellm_params: {model: openai/a}}]\n"
     "batch_settings: {teams: [{team_id: t, models: [b]}]}", "batch_settings.teams[0].models"),
    ("model_list: [{model_name: a, litellm_params: {model: openai/a}, model_info: {batch_mode: weekly}}]",
     "model_list[0].model_info.batch_mode"),
    ("model_list:\n  - model_name: a\n   bad: [", "line"),
    # batch_mode: background: its keys only with it, an OpenAI-wire server of the operator's, one deployment
    ("model_list: [{model_name: a, litellm_params: {model: openai/a}, model_info: {background_priority: 3}}]",
     "model_list[0].model_info"),
    ("model_list: [{model_name: a, litellm_params: {model: anthropic/a, api_base: 'http://h/v1'}, "
     "model_info: {batch_mode: background}}]", "model_list[0]"),
    ("model_list: [{model_name: a, litellm_params: {model: hosted_vllm/a}, model_info: {batch_mode: background}}]",
     "model_list[0]"),
    ("model_list: [{model_name: a, litellm_params: {model: vllm/a}, model_info: {batch_mode: background}}]",
     "model_list[0].model_info.batch_mode"),
    ("model_list: [{model_name: a, litellm_params: {model: hosted_vllm/a, api_base: 'http://h/v1'}, "
     "model_info: {batch_mode: background, metrics_url: 'h/metrics'}}]", "model_list[0].model_info"),
    ("model_list: [{model_name: a, litellm_params: {model: hosted_vllm/a, api_base: 'http://h/v1'}, "
     "model_info: {batch_mode: background}}, {model_name: a, litellm_params: {model: hosted_vllm/a, "
     "api_base: 'http://g/v1'}, model_info: {batch_mode: background}}]", "model_list[1]"),
]


@pytest.mark.parametrize(("text", "key"), CONFIG_CASES)
def test_bad_config_names_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    src = tmp_path / "in.jsonl"
    src.write_text(ok("a"))
    code = main(["run", "-i", str(src), "-o", str(tmp_path / "out"), "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}: {key}" in err, err
    assert "Traceback" not in err


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "-i", "x", "-o", "y", "--config", str(tmp_path / "none.yaml")])
    assert code == 2 and "no such file" in capsys.readouterr().err


def test_help_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--input-file", "--output-file", "--config", "--error-file", "--model", "--served-model-name",
                 "exit status"):
        assert flag in text


@pytest.mark.parametrize(("extra", "key"), [
    ({"environment": {"A": "b"}}, "environment"),
    ({"general_settings": {"master_key": "sk-m", "database_uri": "postgres://x"}}, "general_settings.database_uri"),
    ({"router_settings": {"num_retries": 1, "no_such_router_setting": 1}}, "router_settings.no_such_router_setting"),
])
def test_settings_nobody_knows_are_refused(extra: dict[str, Any], key: str) -> None:
    """A key in no LiteLLM section and not ours is a typo: refused, naming it (LiteLLM's own keys that
    batchyard does not apply are named instead: tests/servers/test_litellm_configs.py)."""
    raw = {"model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "k"}}], **extra}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "team.yaml")
    assert str(caught.value).startswith(f"team.yaml: {key}: ")


def test_router_settings_known_are_the_routers_own() -> None:
    """The written-out list of Router settings is exactly the pinned LiteLLM Router's keyword arguments."""
    import inspect

    from litellm import Router

    from gateway.config.schema import ROUTER_SETTINGS

    assert set(inspect.signature(Router.__init__).parameters) - {"self", "model_list"} == ROUTER_SETTINGS


def test_a_background_route_reads_its_server_beside_its_api_base(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = ("model_list:\n  - model_name: shared\n    max_parallel_requests: 48\n"
            "    litellm_params: {model: hosted_vllm/org/m, api_base: 'http://vllm:8000/v1/'}\n"
            "    model_info: {batch_mode: background}\n"
            "  - model_name: own-metrics\n"
            "    litellm_params: {model: openai/m, api_base: 'http://gpu:9000/v1'}\n"
            "    model_info: {batch_mode: background, background_priority: 3, metrics_url: 'http://gpu:9100/metrics'}\n")
    path = tmp_path / "bg.yaml"
    path.write_text(text)
    config = parse_config(__import__("yaml").safe_load(text))
    shared, own = config.routes["shared"].background, config.routes["own-metrics"].background
    assert shared is not None and own is not None
    assert (shared.metrics_url, shared.served_model, shared.priority, shared.max_concurrency) == (
        "http://vllm:8000/metrics", "org/m", 10, 48)
    assert (own.metrics_url, own.priority, own.max_concurrency) == ("http://gpu:9100/metrics", 3, None)
    assert main(["config", "check", str(path)]) == 0
    assert "pass-through (background)" in capsys.readouterr().out
