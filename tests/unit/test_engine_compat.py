"""The local engine's two small helpers that need no engine: which vLLM module a moved name comes from
(`local_engine.vllm_compat`), and the order a shard's lines enter the engine (`local_engine.ordering`)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.domain import BatchRequest, Endpoint
from local_engine import vllm_compat
from local_engine.ordering import group_by_prefix, prefix_key

LONG_A = "You are a careful assistant. " * 20
LONG_B = "You answer in French only. " * 20


def chat(line: int, system: str | None, model: str = "m", **extra: Any) -> BatchRequest:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": f"question {line}"})
    return BatchRequest(line, f"c{line}", Endpoint.CHAT, {"model": model, "messages": messages, **extra})


# -- ordering for the prefix cache ----------------------------------------------------------------------------------


def test_lines_sharing_a_system_prompt_go_together_in_file_order() -> None:
    reqs = [chat(1, LONG_A), chat(2, LONG_B), chat(3, LONG_A), chat(4, None), chat(5, LONG_B), chat(6, LONG_A)]
    assert [r.line for r in group_by_prefix(reqs)] == [1, 3, 6, 2, 5, 4]


def test_one_prompt_or_none_keeps_file_order() -> None:
    same = [chat(i, LONG_A) for i in range(1, 6)]
    assert group_by_prefix(same) == same
    plain = [chat(i, None) for i in range(1, 6)]
    assert group_by_prefix(plain) == plain


def test_the_key_is_model_endpoint_and_leading_system_messages() -> None:
    assert prefix_key(chat(1, LONG_A)) == prefix_key(chat(2, LONG_A, temperature=0.5))
    assert prefix_key(chat(1, LONG_A)) != prefix_key(chat(1, LONG_A, model="other"))
    assert prefix_key(chat(1, LONG_A)) != prefix_key(chat(1, LONG_B))
    developer = BatchRequest(1, "d", Endpoint.CHAT, {"model": "m", "messages": [
        {"role": "developer", "content": LONG_A}, {"role": "user", "content": "hi"}]})
    assert prefix_key(developer)[2] != b""
    completion = BatchRequest(1, "p", Endpoint.COMPLETIONS, {"model": "m", "prompt": LONG_A})
    assert prefix_key(completion) == ("m", "/v1/completions", b"")
    odd = BatchRequest(1, "o", Endpoint.CHAT, {"model": "m", "messages": "not a list"})
    assert prefix_key(odd) == ("m", "/v1/chat/completions", b"")


def test_an_anthropic_messages_lines_key_is_its_system_prompt() -> None:
    def msg(line: int, system: str | None) -> BatchRequest:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"q {line}"}]}
        return BatchRequest(line, f"m{line}", Endpoint.MESSAGES, {**body, "system": system} if system else body)

    assert [r.line for r in group_by_prefix([msg(1, LONG_A), msg(2, LONG_B), msg(3, LONG_A), msg(4, None)])] == [
        1, 3, 2, 4]
    assert prefix_key(msg(1, None)) == ("m", "/v1/messages", b"")


# -- where a moved vLLM name comes from -----------------------------------------------------------------------------


@pytest.fixture
def fake_layout(tmp_path: Path) -> Iterator[str]:
    """A package with one importable module and one whose own import is missing."""
    pkg = tmp_path / "fake_vllm_layout"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "present.py").write_text("VALUE = 1\n")
    (pkg / "broken.py").write_text("import batchyard_no_such_dependency  # noqa: F401\n")
    sys.path.insert(0, str(tmp_path))
    yield "fake_vllm_layout"
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("fake_vllm_layout")]:
        del sys.modules[name]


@pytest.fixture
def fake_homes(fake_layout: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The lookup pointed at the fake package (its table and prefix are data, not our code paths)."""
    monkeypatch.setattr(vllm_compat, "PREFIX", f"{fake_layout}.")
    monkeypatch.setitem(vllm_compat.HOMES, "VALUE", ("absent", "present"))
    monkeypatch.setitem(vllm_compat.HOMES, "BROKEN", ("broken", "present"))
    monkeypatch.setitem(vllm_compat.HOMES, "GONE", ("absent", "gone"))
    monkeypatch.setitem(vllm_compat.OPTIONAL_HOMES, "NEWER", ("absent", "present"))
    return fake_layout


def test_an_absent_module_is_an_older_layout(fake_homes: str) -> None:
    assert vllm_compat.load("VALUE") == 1
    assert vllm_compat.optional("NEWER") is None  # the module is there, the name is not


def test_a_missing_dependency_is_not_mistaken_for_a_layout(fake_homes: str) -> None:
    with pytest.raises(ModuleNotFoundError, match="batchyard_no_such_dependency"):
        vllm_compat.load("BROKEN")


def test_no_layout_at_all_names_the_supported_range(fake_homes: str) -> None:
    with pytest.raises(ImportError, match=r"supports \(vllm>=0\.26\.0,<0\.34\)"):
        vllm_compat.load("GONE")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (the engine extra) is not installed")
def test_every_moved_name_resolves_in_the_installed_vllm() -> None:
    for name in vllm_compat.HOMES:
        assert vllm_compat.load(name) is not None, name
    import vllm

    if vllm.__version__.startswith(("0.32.", "0.33.")):
        assert callable(vllm_compat.optional("propagate_flash_late_interaction"))
    error = vllm_compat.load("create_error_response")("bad input")
    assert isinstance(error, vllm_compat.load("ErrorResponse"))
    assert error.error.code == 400 and error.error.type == "BadRequestError"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (the engine extra) is not installed")
def test_engine_statistics_are_off_unless_asked_for() -> None:
    """As vLLM's offline LLM class: no per-step stats unless engine_args say `disable_log_stats: false`."""
    from local_engine.serving import build_args

    assert build_args({"model": "some/model"}).disable_log_stats is True
    assert build_args({"model": "some/model", "disable_log_stats": False}).disable_log_stats is False
    assert build_args({"model": "some/model", "disable-log-stats": False}).disable_log_stats is False
