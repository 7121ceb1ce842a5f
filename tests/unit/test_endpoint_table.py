"""The endpoint table (`gateway.config.endpoints`) is the one home of endpoint facts: every reader agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.endpoints import ENDPOINTS, UPSTREAM_ENDPOINTS, WIRE_ENDPOINTS
from gateway.config.native_declarations import native_declarations
from gateway.config.routes import native_refusal
from gateway.config.urls import normalise_url
from gateway.domain import Endpoint
from gateway.lines.body_fields import typed_dict_fields, upstream_fields
from providers.native.catalog import jobs_class, native_catalog
from providers.native.job_limits import JOB_LIMITS, job_limits

# endpoint: (url tail, served upstream in real time, as bytes on OpenAI-wire routes, never by a local engine)
KINDS = [
    (Endpoint.CHAT, "chat/completions", True, True, False),
    (Endpoint.COMPLETIONS, "completions", True, True, False),
    (Endpoint.EMBEDDINGS, "embeddings", True, True, False),
    (Endpoint.RESPONSES, "responses", True, True, False),
    (Endpoint.SCORE, "score", False, False, False),
    (Endpoint.RERANK, "rerank", True, False, False),
    (Endpoint.MODERATIONS, "moderations", True, True, True),
    (Endpoint.IMAGES, "images/generations", True, True, True),
    (Endpoint.IMAGE_EDITS, "images/edits", True, True, True),
    (Endpoint.TRANSCRIPTIONS, "audio/transcriptions", False, False, False),
    (Endpoint.TRANSLATIONS, "audio/translations", False, False, False),
    (Endpoint.MESSAGES, "messages", True, False, False),
]


@pytest.mark.parametrize(("endpoint", "tail", "upstream", "wire", "never_local"), KINDS)
def test_what_each_route_kind_serves(endpoint: Endpoint, tail: str, upstream: bool, wire: bool,
                                     never_local: bool) -> None:
    rule = ENDPOINTS[endpoint]
    assert (rule.tail, endpoint in UPSTREAM_ENDPOINTS, endpoint in WIRE_ENDPOINTS, rule.never_local is not None) == (
        tail, upstream, wire, never_local)
    for form in (f"/v1/{tail}", f"/{tail}", tail, f"/openai/v1/{tail}", f"/openai/deployments/d/{tail}?api-version=x"):
        normal = normalise_url(form)
        assert normal is not None and normal.endpoint is endpoint, form
    if upstream:  # the Router method's (or the wire's) required arguments: one set
        assert len(rule.required) == 1
        assert upstream_fields(endpoint) >= set(rule.required[0])
    else:
        assert upstream_fields(endpoint) == frozenset()


def test_every_endpoint_has_one_row() -> None:
    assert set(ENDPOINTS) == set(Endpoint) == {row[0] for row in KINDS}


NATIVE = {"openai", "azure", "anthropic", "mistral", "gemini", "bedrock", "vertex_ai", "together_ai", "fireworks_ai",
          "xai"}  # a new one joins by itself


def test_the_config_checks_native_entries_against_the_catalog_the_root_hands_in() -> None:
    # conftest declares them as the command line does (gateway.runtime.pool.declare_native_providers)
    assert set(native_declarations()) == set(native_catalog()) >= NATIVE


@pytest.mark.parametrize("provider", sorted(NATIVE))
def test_every_native_provider_has_its_jobs_class(provider: str) -> None:
    cls = jobs_class(provider)
    assert cls is not None and provider in cls.providers and cls.endpoints <= set(Endpoint)
    assert cls.endpoints and job_limits(provider).max_lines > 0 and job_limits(provider).max_bytes > 0
    assert native_refusal(f"{provider}/some-model") is None


def test_the_job_limits_table_has_a_row_per_native_provider() -> None:
    assert set(JOB_LIMITS) == set(native_catalog())
    openai = JOB_LIMITS["openai"]
    assert (openai.max_lines, openai.max_bytes) == (50_000, 190_000_000)  # under OpenAI's 200 MB per file


@pytest.mark.parametrize("provider", ["cohere", "hosted_vllm", "perplexity"])
def test_other_providers_run_no_native_jobs(provider: str) -> None:
    assert jobs_class(provider) is None and native_refusal(f"{provider}/m") is not None


@pytest.mark.parametrize("endpoint", [e for e, rule in ENDPOINTS.items() if rule.sdk_params], ids=str)
def test_the_sdk_fields_read_from_source_are_those_the_imported_type_has(endpoint: Endpoint) -> None:
    """`typed_dict_fields` reads an SDK request type's fields from its module's source (importing `anthropic`
    to read one class cost a worker a second of CPU); they are the imported TypedDict's, bases included."""
    import importlib

    spec = ENDPOINTS[endpoint].sdk_params
    assert spec is not None
    module, _, name = spec.partition(":")
    imported = getattr(importlib.import_module(module), name)
    expected = {field for klass in imported.__mro__ for field in getattr(klass, "__annotations__", {})}
    assert typed_dict_fields(spec) == expected
    assert upstream_fields(endpoint) == (expected | {"stream"}) - ENDPOINTS[endpoint].header_params


def test_a_type_whose_base_lives_elsewhere_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base from another module cannot be read from the source: the type is imported and its MRO read."""
    package = tmp_path / "sdkish"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("from typing import TypedDict\nclass Base(TypedDict):\n    a: int\n")
    (package / "params.py").write_text("from sdkish.base import Base\nclass Params(Base, total=False):\n    b: str\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert typed_dict_fields("sdkish.params:Params") == {"a", "b"}
