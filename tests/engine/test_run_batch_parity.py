"""vLLM run_batch's own test cases, run on `batchyard run --model`.

Written from the inputs and assertions of `tests/entrypoints/openai/test_run_batch.py`
in vLLM's repository (newest version read for this suite): same lines, same
flags, and every output line validated with vLLM's own `BatchRequestOutput`
model. The hub models those cases use are replaced by the locally built tiny
random-weight models; where a case needs a model we cannot build here, the
test says so and checks what can be checked without it.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_helpers import ENGINE_FLAGS, ENGINE_MARKS, built_tiny_models, engine_env

pytestmark = ENGINE_MARKS
# Without LITELLM_LOCAL_MODEL_COST_MAP and HF_HUB_OFFLINE: batchyard must be offline and quiet on its own.
ENV = engine_env(without=("LITELLM_LOCAL_MODEL_COST_MAP", "HF_HUB_OFFLINE"))
CHAT, EMBED, RERANK = "tiny-chat", "tiny-embed", "tiny-rerank"  # served names standing in for the hub models
DOCS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return built_tiny_models(tmp_path_factory)


def chat_line(cid: str, model: str, system: str, url: str = "/v1/chat/completions", **extra: Any) -> dict[str, Any]:
    # vLLM's cases ask for max_tokens 1000; the tiny Llama has 512 positions, where vLLM (either tool)
    # answers such a line with a 400, so the lines here ask for 16 and the 200s can be asserted.
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello world!"}]
    return {"custom_id": cid, "method": "POST", "url": url,
            "body": {"model": model, "messages": messages, "max_tokens": 16, **extra}}


def run(tmp_path: Path, lines: list[dict[str, Any]] | str, model: Path, served: str,
        *flags: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`batchyard run -i IN -o OUT --model M ...` as run_batch's tests call `vllm run-batch`."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(lines if isinstance(lines, str) else "\n".join(json.dumps(x) for x in lines))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--model", str(model),
         "--served-model-name", served, *ENGINE_FLAGS, *flags],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900,
    )
    got = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.exists() else []
    return proc, got


def validate(lines: list[dict[str, Any]]) -> None:
    """Every line must parse as vLLM's own output model (the cases' central assertion)."""
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    for line in lines:
        BatchRequestOutput.model_validate_json(json.dumps(line))


def test_empty_file(models: Any, tmp_path: Path) -> None:
    proc, got = run(tmp_path, "", models.bert, EMBED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out.jsonl").read_text().strip() == "" and got == []


COMPLETIONS = [
    chat_line("request-1", CHAT, "You are a helpful assistant."),
    chat_line("request-2", CHAT, "You are an unhelpful assistant."),
    chat_line("request-3", "NonExistModel", "You are an unhelpful assistant."),
    chat_line("request-4", CHAT, "You are an unhelpful assistant.", url="/bad_url"),
    chat_line("request-5", CHAT, "You are an unhelpful assistant.", stream="True"),
]


@pytest.fixture(scope="module")
def chat_run(models: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                               list[dict[str, Any]]]:
    """One run on the tiny Llama with no flag beyond ENGINE_FLAGS, shared by the cases that need just that
    (one engine start, not one per case): COMPLETIONS then AUDIO, each case asserting its own lines."""
    return run(tmp_path_factory.mktemp("chat_run"), [*COMPLETIONS, *AUDIO], models.llama, CHAT)


def test_completions(chat_run: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]) -> None:
    proc, lines = chat_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(lines)
    assert [x["custom_id"] for x in lines] == [x["custom_id"] for x in [*COMPLETIONS, *AUDIO]]  # input order
    got = lines[:len(COMPLETIONS)]
    status = [x["response"]["status_code"] for x in got]
    assert status == [200, 200, 404, 400, 400]
    assert all(x["error"] is None for x in got[:2]) and all(x["error"] for x in got[2:])
    # Quiet by default: a clean run's stderr holds only the summary (the bar is off without a terminal).
    summary = [x for x in proc.stderr.splitlines() if x.strip()]
    assert summary[0].startswith(f"batchyard: {len(lines)} requests in "), proc.stderr
    assert all(x.startswith("  ") for x in summary[1:]), proc.stderr
    log = re.search(r"^  log: (.+)$", proc.stderr, re.M)
    assert log is not None and "vllm" in Path(log.group(1)).read_text()  # the engine's chatter went there


def test_completions_invalid_input(models: Any, tmp_path: Path) -> None:
    lines = [chat_line("request-2", CHAT, "You are an unhelpful assistant.")]
    bad = {**lines[0], "invalid_field": "request-1"}
    del bad["custom_id"]
    proc, _ = run(tmp_path, [bad, *lines], models.llama, CHAT)
    # 1, the input's status: the run ends while the engine still loads in its thread, and the process must
    # not be finalized under that thread (it aborted with 134, or hung, before `exit_while_loading`).
    assert proc.returncode == 1, proc.stderr
    assert "line 1: missing_required_parameter" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_embeddings(models: Any, tmp_path: Path) -> None:
    texts = ["You are a helpful assistant.", "You are an unhelpful assistant.", "Hello world!", "Hello world!"]
    lines = [{"custom_id": f"request-{i + 1}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED if i < 3 else "NonExistModel", "input": text}} for i, text in enumerate(texts)]
    proc, got = run(tmp_path, lines, models.bert, EMBED, "--max-model-len", "128")
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(got)
    assert [x["response"]["status_code"] for x in got] == [200, 200, 200, 404]


SCORE = [
    {"custom_id": "request-1", "method": "POST", "url": "/score",
     "body": {"model": RERANK, "queries": "What is the capital of France?", "documents": DOCS}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/score",
     "body": {"model": RERANK, "queries": "What is the capital of France?", "documents": DOCS}},
]
# As in vLLM's case, the last two lines share custom_id "request-2": run_batch answers both.
RERANK_LINES = [
    {"custom_id": "request-1", "method": "POST", "url": "/rerank",
     "body": {"model": RERANK, "query": "What is the capital of France?", "documents": DOCS}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/rerank",
     "body": {"model": RERANK, "query": "What is the capital of France?", "documents": DOCS}},
    {"custom_id": "request-2", "method": "POST", "url": "/v2/rerank",
     "body": {"model": RERANK, "query": "What is the capital of France?", "documents": DOCS}},
]


@pytest.mark.parametrize("lines", [SCORE, RERANK_LINES], ids=["score", "rerank"])
def test_score(models: Any, tmp_path: Path, lines: list[dict[str, Any]]) -> None:
    if models.reranker is None:
        pytest.skip("the tiny cross-encoder was not built")
    proc, got = run(tmp_path, lines, models.reranker, RERANK, "--max-model-len", "128")
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(got)
    assert [x["custom_id"] for x in got] == [x["custom_id"] for x in lines]  # each in its input position
    assert all(x["error"] is None and x["response"]["status_code"] == 200 for x in got), got
    warnings = [x for x in proc.stderr.splitlines() if "repeat a custom_id" in x]
    assert len(warnings) == (1 if lines is RERANK_LINES else 0), proc.stderr


def test_reasoning_parser(models: Any, tmp_path: Path) -> None:
    """run_batch's case runs Qwen/Qwen3-0.6B with `--reasoning-parser qwen3` and asserts a non-empty
    `message.reasoning`. That needs Qwen3's tokenizer (its <think> tokens) and trained weights that emit
    them; neither can be built or downloaded here. What we check: the flag reaches vLLM's serving layer
    (an unknown parser name is refused before any request; a known one gives lines in vLLM's shape)."""
    lines = [chat_line("request-1", CHAT, "You are a helpful assistant.", max_tokens=8)]
    proc, _ = run(tmp_path, lines, models.llama, CHAT, "--reasoning-parser", "no-such-parser")
    assert proc.returncode != 0 and "no-such-parser" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    proc, got = run(tmp_path, lines, models.llama, CHAT, "--reasoning-parser", "deepseek_v3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(got)
    assert got[0]["response"]["status_code"] == 200, got


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}


def test_tool_calling(models: Any, tmp_path: Path) -> None:
    """run_batch's case: Qwen3 with `--enable-auto-tool-choice --tool-call-parser hermes` and
    `tool_choice: required` must answer with a call to get_current_weather in `message.tool_calls`.
    Here the flags (one without a value) reach vLLM and its structured output forces the hermes
    `<tool_call>` form and the tool's name even on random weights; but random weights never close the
    arguments' JSON before max_tokens, so the parser cannot lift the call into `tool_calls` (that
    assertion needs a trained model, which cannot be downloaded here)."""
    line = {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": CHAT, "messages": [{"role": "user", "content": "What is the weather in San Francisco?"}],
                     "tools": [WEATHER_TOOL], "tool_choice": "required", "max_tokens": 40, "temperature": 0}}
    proc, got = run(tmp_path, [line], models.llama, CHAT, "--max-model-len", "512",
                    "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(got)
    assert got[0]["error"] is None and got[0]["response"]["status_code"] == 200, got
    content = got[0]["response"]["body"]["choices"][0]["message"]["content"]
    assert content.startswith("<tool_call>") and '"name": "get_current_weather"' in content, content


def test_engine_options_from_flags_and_config(models: Any, tmp_path: Path) -> None:
    """The same run_batch options work as flags (with or without a value) and in a config's engine_args."""
    from gateway.cli.main import _load, build_parser
    from gateway.config.schema import load_config
    from local_engine.serving import build_args

    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    flags = ["--trust-remote-code", "--chat-template", str(template), "--response-role", "bot",
             "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_v3",
             "--enable-prefix-caching", "--max-num-seqs", "8"]
    args, extra = build_parser().parse_known_args(["run", "-i", "x", "-o", "y", "--model", str(models.llama), *flags])
    from_flags = build_args(next(iter(_load(args, extra).routes.values())).engine_args)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model_list:
  - model_name: tiny
    litellm_params: {{model: "vllm/{models.llama}"}}
    engine_args: {{trust_remote_code: true, chat_template: "{template}", response_role: bot,
                  enable_auto_tool_choice: true, tool_call_parser: hermes, reasoning_parser: deepseek_v3,
                  enable_prefix_caching: true, max_num_seqs: 8}}
""")
    from_config = build_args(load_config(str(config)).routes["tiny"].engine_args)
    for ns in (from_flags, from_config):
        assert ns.trust_remote_code is True and ns.enable_auto_tool_choice is True
        assert ns.tool_call_parser == "hermes" and ns.reasoning_parser == "deepseek_v3"
        assert ns.chat_template == str(template) and ns.response_role == "bot"
        assert ns.enable_prefix_caching is True and ns.max_num_seqs == 8


def _wav_data_url(seconds: float = 0.5, rate: int = 16000) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * int(seconds * rate))
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


# Audio lines on a chat model (test_audio_on_a_model_without_audio), moderations and images lines among them.
_AUDIO_BODY = {"model": CHAT, "file_url": _wav_data_url(), "response_format": "json"}
AUDIO = [
    {"custom_id": "t1", "method": "POST", "url": "/v1/audio/transcriptions", "body": _AUDIO_BODY},
    {"custom_id": "t2", "method": "POST", "url": "/audio/translations", "body": {**_AUDIO_BODY, "language": "it"}},
    {"custom_id": "m1", "method": "POST", "url": "/v1/moderations", "body": {"model": CHAT, "input": "hi"}},
    {"custom_id": "i1", "method": "POST", "url": "/v1/images/generations", "body": {"model": CHAT, "prompt": "a"}},
    {"custom_id": "e1", "method": "POST", "url": "/v1/images/edits",
     "body": {"model": CHAT, "prompt": "a", "images": [{"file_id": "file-a"}]}},
]


def test_audio_on_a_model_without_audio(chat_run: tuple[subprocess.CompletedProcess[str],
                                                       list[dict[str, Any]]]) -> None:
    """Audio lines on a chat model: every url form reaches the engine, which answers as run_batch does
    for a model without the task; moderations/images lines get a clear per-line error."""
    proc, lines = chat_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(lines)
    got = lines[len(COMPLETIONS):]
    assert [x["custom_id"] for x in got] == [x["custom_id"] for x in AUDIO]
    assert [x["response"]["status_code"] for x in got] == [400] * 5
    messages = [x["error"]["error"]["message"] for x in got]
    assert messages[0] == "Model does not support endpoint: /v1/audio/transcriptions"
    assert messages[1] == "Model does not support endpoint: /v1/audio/translations"
    assert "/v1/moderations is not served by the local vLLM engine" in messages[2]
    assert "/v1/images/generations is not served by the local vLLM engine" in messages[3]
    assert "/v1/images/edits is not served by the local vLLM engine (image editing)" in messages[4]


def test_transcription_and_translation(tmp_path: Path) -> None:
    """run_batch's cases use openai/whisper-large-v3 and whisper-small (the http case also downloads a clip).
    Here: a tiny random-weight Whisper built locally, which vLLM-CPU loads and serves through run_batch's
    own request models and audio fetcher, with a `data:` URL of a short WAV. Random weights transcribe
    noise, so the text is not checked (run_batch's 'Mary had a little lamb' needs the real model).
    vLLM decodes audio with soundfile or PyAV (the vllm[audio] extra); without either, the line is
    vLLM's own 400, which still shows the request went all the way to the audio loader."""
    from local_engine.tiny_model import build_tiny_whisper

    model = build_tiny_whisper(tmp_path / "models")  # seconds to build; kept out of the shared model folder
    audio = {"model": "whisper", "file_url": _wav_data_url(), "temperature": 0.0}
    lines = [
        {"custom_id": "request-1", "method": "POST", "url": "/v1/audio/transcriptions",
         "body": {**audio, "response_format": "json"}},
        {"custom_id": "request-2", "method": "POST", "url": "/v1/audio/translations",
         "body": {**audio, "response_format": "json", "language": "it", "to_language": "en"}},
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--model", str(model),
         "--served-model-name", "whisper", "--dtype", "float32", "--enforce-eager"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [json.loads(x) for x in out.read_text().splitlines()]
    validate(got)
    decoders = [m for m in ("soundfile", "av") if importlib.util.find_spec(m) is not None]
    for line, what in zip(got, ("transcription", "translation"), strict=True):
        if decoders:
            assert line["error"] is None and line["response"]["status_code"] == 200, line
            assert "text" in line["response"]["body"]
        else:
            assert line["response"]["status_code"] == 400, line
            assert line["error"]["error"]["message"] == f"Failed to process {what}: Invalid or unsupported audio file."
