"""Native routes pointed at the provider stand-ins (tests/fakes): one place for the config the native tests and
bench/native_providers.py write.

- `native_route(params, **info)`: one native deployment as a parsed `Route` (backend-level tests);
- `StandIns`: every native stand-in running at once (OpenAI and Azure on the loopback upstream, Anthropic,
  Mistral, the Gemini API, Groq, Together AI, xAI, Fireworks AI,
  Bedrock over moto's S3, Vertex AI over gcp-storage-emulator), the YAML config of one
  native route on each (`config`) and the environment a `batchyard` process needs to reach them (`env`).
"""

from __future__ import annotations

import json
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gateway.config.routes import Route
from gateway.config.schema import parse_config
from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.gcs import GcsEmulator, service_account_json, service_account_key
from tests.support.services import S3_ENV, MotoS3, process_env

ROUTE = "gpt-native"
ROLE = "arn:aws:iam::123456789012:role/batchyard-bedrock"
VERTEX_PROJECT = "batchyard-test"
AZURE_API_VERSION = "2024-10-21"
# route name -> the deployment's model upstream (each route of `StandIns.config`)
NATIVE_MODELS = {"gpt-bulk": "gpt-4o-mini", "azure-bulk": "my-gpt4o-deployment", "claude-bulk": "claude-haiku-4-5",
                 "mistral-bulk": "mistral-small-latest", "gemini-bulk": "gemini-2.5-flash-lite",
                 "vertex-bulk": "gemini-2.5-flash", "bedrock-bulk": "anthropic.claude-3-5-haiku-20241022-v1:0",
                 "groq-bulk": "llama-3.1-8b-instant", "together-bulk": "meta-llama/Llama-3.3-70B-Instruct-Turbo",
                 "xai-bulk": "grok-3-mini", "fireworks-bulk": "accounts/fireworks/models/llama-v3p1-8b-instruct"}
# Groq's batch prices: LiteLLM's map has none, and a Groq route is priced by batch prices only
GROQ_PRICES = {"input_cost_per_token_batches": 2.5e-8, "output_cost_per_token_batches": 4e-8}
# Together's and xAI's: LiteLLM's map has no batch price for these models (xAI's grok-3-mini not at all), so the
# config gives one; Fireworks' is LiteLLM's real-time price halved
TOGETHER_PRICES = {"input_cost_per_token_batches": 5.2e-7, "output_cost_per_token_batches": 5.2e-7}
XAI_PRICES = {"input_cost_per_token_batches": 1.5e-7, "output_cost_per_token_batches": 2.5e-7}
FIREWORKS_ACCOUNT = "batchyard-test"


def native_route(params: dict[str, Any], name: str = ROUTE, **info: Any) -> Route:
    """A route of one native deployment (`params`: its `litellm_params`), polled every 0.2 s at most."""
    entry = {"model_name": name, "litellm_params": params,
             "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2, **info}}
    return parse_config({"model_list": [entry]}).routes[name]


class StandIns:
    """Every native provider's stand-in, each job ending `batch_delay` seconds after its creation."""

    def __init__(self, batch_delay: float = 0.3, bucket: str = "batchyard-run") -> None:
        self._stack = ExitStack()
        self.stubs: dict[str, Stub] = {}
        try:
            self.s3 = MotoS3(bucket).start()
            self._stack.callback(self.s3.close)
            self.gcs = GcsEmulator(bucket).start()
            self._stack.callback(self.gcs.close)
            keys = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
            self.private_key, public = service_account_key(keys)
            delay = ["--batch-delay", str(batch_delay)]
            for name in ("anthropic", "mistral", "gemini", "groq", "together", "xai", "fireworks"):
                self.stubs[name] = self._stack.enter_context(start_stub(f"tests.fakes.stubs_{name}", delay))
            self.stubs["bedrock"] = self._stack.enter_context(start_stub(
                "tests.fakes.stubs_bedrock", [*delay, "--s3-endpoint", self.s3.url]))
            self.stubs["vertex"] = self._stack.enter_context(start_stub(
                "tests.fakes.stubs_vertex", [*delay, "--gcs-endpoint", self.gcs.url, "--public-key", str(public)]))
            self.upstream: Upstream = self._stack.enter_context(start_upstream(batch_delay=batch_delay))
        except BaseException:
            self._stack.close()
            raise

    def config(self, native: str = "native_poll_max_seconds: 0.2", extra: str = "") -> str:
        """The YAML config of one native route per provider (`NATIVE_MODELS`), each with `native` in its
        `model_info`; `extra`: more `model_list` items, written as they are."""
        m = NATIVE_MODELS
        up = self.upstream
        groq_prices, together_prices, xai_prices = (", ".join(f"{k}: {v}" for k, v in prices.items())
                                                    for prices in (GROQ_PRICES, TOGETHER_PRICES, XAI_PRICES))
        vertex_key = service_account_json(self.private_key, f"{self.stubs['vertex'].url}/token", VERTEX_PROJECT)
        return f"""
model_list:
  - model_name: gpt-bulk
    litellm_params: {{model: openai/{m['gpt-bulk']}, api_base: "{up.v1_url}", api_key: sk-o}}
    model_info: {{batch_mode: native, {native}}}
  - model_name: azure-bulk
    litellm_params: {{model: azure/{m['azure-bulk']}, api_base: "{up.url}", api_key: sk-az,
                      api_version: "{AZURE_API_VERSION}"}}
    model_info: {{batch_mode: native, {native}}}
  - model_name: claude-bulk
    litellm_params: {{model: anthropic/{m['claude-bulk']}, api_base: "{self.stubs['anthropic'].url}", api_key: sk-a}}
    model_info: {{batch_mode: native, {native}}}
  - model_name: mistral-bulk
    litellm_params: {{model: mistral/{m['mistral-bulk']}, api_base: "{self.stubs['mistral'].url}/v1", api_key: sk-m}}
    model_info: {{batch_mode: native, {native}}}
  - model_name: gemini-bulk
    litellm_params: {{model: gemini/{m['gemini-bulk']}, api_base: "{self.stubs['gemini'].url}", api_key: g-key}}
    model_info: {{batch_mode: native, {native}}}
  - model_name: bedrock-bulk
    litellm_params: {{model: "bedrock/{m['bedrock-bulk']}", aws_region_name: us-east-1}}
    model_info: {{batch_mode: native, {native}, native_s3_bucket: {self.s3.bucket}, native_role_arn: "{ROLE}"}}
  - model_name: vertex-bulk
    litellm_params: {{model: vertex_ai/{m['vertex-bulk']}, api_base: "{self.stubs['vertex'].url}",
                      vertex_project: {VERTEX_PROJECT}, vertex_credentials: {json.dumps(vertex_key)}}}
    model_info: {{batch_mode: native, {native}, native_gcs_bucket: {self.gcs.bucket}}}
  - model_name: groq-bulk
    litellm_params: {{model: groq/{m['groq-bulk']}, api_base: "{self.stubs['groq'].url}/openai/v1", api_key: gsk-g}}
    model_info: {{batch_mode: native, {native}, {groq_prices}}}
  - model_name: together-bulk
    litellm_params: {{model: together_ai/{m['together-bulk']}, api_base: "{self.stubs['together'].url}/v1",
                      api_key: t-key}}
    model_info: {{batch_mode: native, {native}, {together_prices}}}
  - model_name: xai-bulk
    litellm_params: {{model: xai/{m['xai-bulk']}, api_base: "{self.stubs['xai'].url}/v1", api_key: x-key}}
    model_info: {{batch_mode: native, {native}, {xai_prices}}}
  - model_name: fireworks-bulk
    litellm_params: {{model: fireworks_ai/{m['fireworks-bulk']}, api_base: "{self.stubs['fireworks'].url}/inference/v1",
                      api_key: fw-key}}
    model_info: {{batch_mode: native, {native}, native_account_id: {FIREWORKS_ACCOUNT}}}
{extra}"""

    def env(self) -> dict[str, str]:
        """A `batchyard` process's environment: AWS's and Cloud Storage's endpoints are the stand-ins'."""
        return process_env({**S3_ENV, "AWS_ENDPOINT_URL_S3": self.s3.url,
                            "AWS_ENDPOINT_URL_BEDROCK": self.stubs["bedrock"].url,
                            "STORAGE_EMULATOR_HOST": self.gcs.url})

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
