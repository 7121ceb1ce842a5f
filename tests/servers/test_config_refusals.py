"""The config refuses what it would not apply: each case names the file and the dotted key.

A setting accepted and then ignored would be a lie, so an unknown key, a key at the wrong level, a key
for another kind of route and a value of the wrong type are all refused when the file loads, before
anything starts.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config.engine_fields import VLLM_ENGINE_ARGS, VLLM_PARSERS
from gateway.config.schema import local_model_config, parse_config
from gateway.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-x"}}
LOCAL = {"model_name": "tiny", "litellm_params": {"model": "vllm/models/tiny"}}
NATIVE = {"batch_mode": "native"}


def _with(entry: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model_list": [{**entry, **extra}]}


def _settings(**batch_settings: Any) -> dict[str, Any]:
    return {"model_list": [UPSTREAM], "batch_settings": batch_settings}


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("tpm beside a local entry's litellm_params", _with(LOCAL, tpm=1000), "model_list[0].tpm", "unknown key"),
    ("tpm that is no count", _with(UPSTREAM, tpm="many"), "model_list[0].tpm", "integer"),
    ("a misspelt litellm_params", {"model_list": [{"model_name": "gpt", "litellm_parms": {"model": "openai/gpt"}}]},
     "model_list[0].litellm_parms", "unknown key; did you mean litellm_params?"),
    ("a typo of model_info", _with(UPSTREAM, modle_info={"id": "a"}), "model_list[0].modle_info", "model_info"),
    ("engine_args on an upstream entry", _with(UPSTREAM, engine_args={"dtype": "float32"}),
     "model_list[0].engine_args", "local models"),
    ("engine_args on a native entry", _with(UPSTREAM, model_info={"batch_mode": "native"}, engine_args={}),
     "model_list[0].engine_args", "native"),
    ("batch_mode: native on a vllm/ route", _with(LOCAL, model_info={"batch_mode": "native"}),
     "model_list[0].model_info.batch_mode", "vllm/"),
    ("an engine arg vLLM does not have", _with(LOCAL, engine_args={"max_model_length": 256}),
     "model_list[0].engine_args", "max_model_length"),
    ("a completion window of true", _settings(completion_windows={"1h": True}),
     "batch_settings.completion_windows.1h", "integer"),
    ("a completion window of 0 s", _settings(completion_windows={"1h": 0}),
     "batch_settings.completion_windows.1h", "positive"),
    ("a shard size of true", _settings(shard_size=True), "batch_settings.shard_size", "integer"),
    ("a shard size as text", _settings(shard_size="100"), "batch_settings.shard_size", "integer"),
    ("an unknown team setting", _settings(teams=[{"team_id": "a", "wieght": 2}]),
     "batch_settings.teams[0].wieght", "unknown key; did you mean weight?"),
    ("a team twice", _settings(teams=[{"team_id": "a"}, {"team_id": "a"}]), "batch_settings.teams[1].team_id",
     "duplicate"),
    ("a team key that is no string", _settings(teams=[{"team_id": "a", "api_keys": [12345]}]),
     "batch_settings.teams[0].api_keys[0]", "string"),
    ("a per-model rpm for a model not listed", _settings(teams=[{"team_id": "a", "model_rpm_limit": {"gpt-5": 9}}]),
     "batch_settings.teams[0].model_rpm_limit.gpt-5", "not a model_name"),
    ("a per-model quota of 0", _settings(teams=[{"team_id": "a", "model_max_enqueued_requests": {"gpt": 0}}]),
     "batch_settings.teams[0].model_max_enqueued_requests.gpt", "positive"),
    ("a tpm limit of true", _settings(teams=[{"team_id": "a", "tpm_limit": True}]),
     "batch_settings.teams[0].tpm_limit", "integer"),
    ("an unknown metrics setting", _settings(metrics={"port": 9400}), "batch_settings.metrics.port", "enabled"),
    ("a file expiry of -1", _settings(file_expiry_seconds=-1), "batch_settings.file_expiry_seconds", "positive"),
    ("an empty master key", {"model_list": [UPSTREAM], "general_settings": {"master_key": ""}},
     "general_settings.master_key", "empty"),
    ("a local model listed twice", {"model_list": [LOCAL, LOCAL]}, "model_list[1]", "twice"),
    ("a name both local and upstream", {"model_list": [LOCAL, {**UPSTREAM, "model_name": "tiny"}]}, "model_list[1]",
     "mixes"),
    ("a name both native and realtime",
     {"model_list": [UPSTREAM, {**UPSTREAM, "model_info": {"batch_mode": "native"}}]},
     "model_list[1].model_info.batch_mode", "mixes"),
    ("a misspelt native key", _with(UPSTREAM, model_info=NATIVE | {"native_poll_max_second": 5}),
     "model_list[0].model_info", "native_poll_max_second: not a setting here; known: native_max_lines"),
    ("a native key on a realtime entry", _with(UPSTREAM, model_info={"native_max_lines": 10}),
     "model_list[0].model_info", "for native entries"),
    ("a native key on a local entry", _with(LOCAL, model_info={"native_poll_max_seconds": 1}),
     "model_list[0].model_info", "for native entries"),
    ("a native job of 0 lines", _with(UPSTREAM, model_info=NATIVE | {"native_max_lines": 0}),
     "model_list[0].model_info.native_max_lines", "must be a positive integer"),
    ("a native job size as text", _with(UPSTREAM, model_info=NATIVE | {"native_max_bytes": "190MB"}),
     "model_list[0].model_info.native_max_bytes", "integer"),
    ("a poll interval of 0 s", _with(UPSTREAM, model_info=NATIVE | {"native_poll_initial_seconds": 0}),
     "model_list[0].model_info.native_poll_initial_seconds", "must be a positive number"),
    ("an entry that is no mapping", {"model_list": ["gpt"]}, "model_list[0]", "mapping"),
    ("no model_list", {"batch_settings": {}}, "model_list", "required"),
    ("a misspelt section", {"model_list": [UPSTREAM], "environment_variable": {}}, "environment_variable",
     "unknown key; did you mean environment_variables?"),
    ("a section nobody knows", {"model_list": [UPSTREAM], "no_such_section": {}}, "no_such_section", "unknown key"),
]


@pytest.mark.parametrize(("raw", "key", "says"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_refused_naming_the_file_and_the_key(raw: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "team.yaml")
    error = caught.value
    assert (error.path, error.key) == ("team.yaml", key), str(error)
    assert says in error.problem, str(error)
    assert str(error).startswith(f"team.yaml: {key}: ")


def test_secrets_are_not_echoed_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_settings(teams=[{"team_id": "a", "api_keys": [4242424242]}]), "team.yaml")
    assert "4242424242" not in str(caught.value)


def test_what_is_accepted_reaches_the_config() -> None:
    raw = {
        "model_list": [
            {**LOCAL, "engine_args": {"max_model_len": 256, "enforce-eager": True}},
            {**UPSTREAM, "model_info": {"id": "a", "input_cost_per_token": 1e-6}},
            {**UPSTREAM, "litellm_params": {"model": "azure/gpt", "api_key": "k", "rpm": 60}},
        ],
        "router_settings": None,
        "batch_settings": {"completion_windows": {"1h": 3600}, "shard_size": 10,
                           "teams": [{"team_id": "a", "api_keys": ["sk-a"], "models": ["gpt"]}]},
    }
    config = parse_config(raw, "team.yaml")
    assert config.batch.completion_windows == {"24h": 86_400, "1h": 3600}
    assert (config.batch.shard_size, config.batch.limits.max_lines) == (10, 50_000)
    assert config.batch.teams[0].models == ["gpt"] and config.auth_enabled
    assert config.routes["tiny"].engine_args == {"model": "models/tiny", "served_model_name": ["tiny"],
                                                 "max_model_len": 256, "enforce-eager": True}
    assert [e.litellm_params.model for e in config.routes["gpt"].entries] == ["openai/gpt-4o-mini", "azure/gpt"]
    assert config.routes["gpt"].model_info.litellm_keys == {"id": "a", "input_cost_per_token": 1e-6}
    # LiteLLM's Router gets the entries as written: nothing added, batchyard's engine_args left out
    assert config.routes["gpt"].model_list() == raw["model_list"][1:]
    assert config.routes["tiny"].model_list() == [LOCAL]
    assert config.router_settings == {}


def test_engine_flags_of_run_model_are_checked_before_the_engine_starts(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp_path / "out"),
         "--model", str(tmp_path / "no-model"), "--max-model-length", "64"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "command line: --max-model-length: is not an option of vLLM's run_batch" in proc.stderr


def _run_batch_options() -> set[str]:
    from vllm.entrypoints.launchers.run_batch import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="check"))
    return {action.dest for action in parser._actions} - {"help", "input_file", "output_file"}


def test_the_static_engine_arg_list_is_the_installed_vllms() -> None:
    """`engine_args` are checked without importing vLLM; this keeps the written-out list honest."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs

    options = _run_batch_options()
    assert options == VLLM_ENGINE_ARGS
    # every AsyncEngineArgs field run_batch takes on its command line is accepted; the rest (private fields,
    # ones without a flag) build_args would refuse at engine start, so load refuses them too
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert fields & options <= VLLM_ENGINE_ARGS
    assert len(fields & VLLM_ENGINE_ARGS) > 200  # the engine's own options are the bulk of the list


def test_the_static_parser_names_are_the_installed_vllms() -> None:
    """Parser names are checked at load without importing vLLM; these are the names it registers."""
    vllm = pytest.importorskip("vllm")
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    assert VLLM_PARSERS["reasoning_parser"][0] == set(ReasoningParserManager.list_registered()), vllm.__version__
    assert VLLM_PARSERS["tool_call_parser"][0] == set(ToolParserManager.list_registered())


def test_an_unknown_parser_is_refused_before_any_engine_loads() -> None:
    with pytest.raises(ConfigError) as caught:
        local_model_config("some/model", {"reasoning_parser": "qwen_3"})
    assert (caught.value.key, "did you mean qwen3?" in caught.value.problem) == ("--reasoning-parser", True)
    entry = {"model_name": "m", "litellm_params": {"model": "vllm/some/model"},
             "engine_args": {"tool_call_parser": "hermess"}}
    with pytest.raises(ConfigError) as caught:
        parse_config({"model_list": [entry]}, "team.yaml")
    assert "'hermess' is not a tool_call_parser of vLLM; did you mean hermes?" in caught.value.problem
    plugin = {**entry, "engine_args": {"tool_call_parser": "mine", "tool_parser_plugin": "/opt/mine.py"}}
    assert "m" in parse_config({"model_list": [plugin]}, "team.yaml").routes  # a plugin may register it
