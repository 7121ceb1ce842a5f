"""One `model_list` entry, typed by where it runs.

An entry is local (`litellm_params.model: vllm/<path>`: an in-process vLLM engine), upstream in
real time (one call per line through LiteLLM's Router), or upstream-native (`model_info.batch_mode:
native`: shards forwarded as provider batch jobs). Each kind is its own model with `extra="forbid"`,
so a key that kind would not use (`engine_args` on an upstream entry, `tpm` beside the `litellm_params`
of a local one, a typo such as `modle_info`) is refused at load instead of being dropped.

`litellm_params` and `model_info` hold LiteLLM's keys (provider keyword arguments, prices, ids), passed to
it as written (`deployment()`); a key that is none of LiteLLM's is refused with the closest name
(gateway.config.litellm.deployment_keys). batchyard's own keys in `model_info` are typed fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PositiveFloat,
    PositiveInt,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gateway.config.engine_fields import unknown_engine_args, unknown_parser
from gateway.config.kinds import RouteKind, inferred_provider, native_refusal
from gateway.config.litellm.deployment_keys import provider_refusal, unknown_model_info, unknown_params
from gateway.config.native_declarations import entry_refusal

LOCAL_PREFIX = "vllm/"
NATIVE_KEY_PREFIX = "native_"  # batchyard's keys of native entries; LiteLLM has none of that name
BACKGROUND_PRIORITY = 10  # vLLM serves lower first; live traffic sends 0
BACKGROUND_KEYS = ("background_priority", "metrics_url")  # batchyard's keys of batch_mode: background
# The providers whose deployments may be `batch_mode: background`: OpenAI's wire to an operator's own server
BACKGROUND_PROVIDERS = ("hosted_vllm", "openai", "custom_openai", "text-completion-openai")


class Strict(BaseModel):
    """A config section: unknown keys refused, no type coercion (`true` is no number, `"5"` no integer).

    A field's docstring is its description in the docs' configuration reference (generated).
    """

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


class LiteLLMParams(BaseModel):
    """LiteLLM's deployment parameters, as LiteLLM takes them (`api_key`, `api_base`, `api_version`, `rpm`,
    `tpm`, `max_parallel_requests`, prices, ...): everything but `model` goes to LiteLLM as written."""

    model_config = ConfigDict(extra="allow", strict=True, use_attribute_docstrings=True)
    model: str
    """`provider/model`. `vllm/<hf-id-or-path>` runs in-process on a local vLLM engine; anything else goes
    upstream through LiteLLM (`hosted_vllm/...` is a vLLM server over HTTP)."""

    @field_validator("model")
    @classmethod
    def _names_a_provider(cls, model: str) -> str:
        """A model without `provider/` gets the provider LiteLLM infers for it (`get_llm_provider`: `gpt-4o` is
        `openai/gpt-4o`, what the Router sends either way); a name it cannot place is refused. A wildcard
        model (`*`) is left as written: LiteLLM infers per request, and so does our route (wildcards)."""
        if "*" in model:
            return model
        if "/" in model:
            return model  # its provider is checked with the other keys (`_known_keys`), which may name it
        # inferred_provider imports LiteLLM (seconds): called only for a prefix-less model
        provider = inferred_provider(model)
        if provider is None:
            raise PydanticCustomError(
                "no_provider", "'{model}' names no provider; write provider/model, e.g. openai/{model}",
                {"model": model},
            )
        return f"{provider}/{model}"

    @model_validator(mode="after")
    def _known_keys(self) -> LiteLLMParams:
        """Every key is LiteLLM's (else LiteLLM would send it upstream), and LiteLLM can place the provider."""
        extra = self.model_extra or {}
        problem = unknown_params(extra)
        if problem is None and "/" in self.model and not self.model.startswith(LOCAL_PREFIX):
            problem = provider_refusal(self.model, extra)
        if problem is not None:
            raise PydanticCustomError("litellm_param", "{problem}", {"problem": problem})
        return self


class ModelInfo(BaseModel):
    """LiteLLM's `model_info` (prices, ids, ...) plus batchyard's own keys.

    - `batch_mode`: `realtime` (one call per line), `native` (the provider's batch jobs) or `background` (one
      call per line to a vLLM server shared with live traffic, at low priority, paced by its load).
    - `background_priority`, `metrics_url`: only with `batch_mode: background` (`gateway.scheduling.busy_server`).
    - `allowed_params`: body fields a line may carry for this model beyond the endpoint's documented
      request fields: a provider's extras (Anthropic's `top_k`), or on a local route the vLLM request
      fields that change what the operator set (`chat_template`, `vllm_xargs`, ...). Default: none.
      LiteLLM's own settings (keys, base URLs, mocks, prices, ...) can never be listed.
    - `allowed_media_domains`: hosts whose http(s) media URLs (`image_url`, `audio_url`, `file_url`, ...)
      the gateway may fetch for a line of this model (vLLM on a local route, LiteLLM's translation
      upstream). Default: none, so no line makes the gateway fetch anything. Private, loopback and
      link-local addresses are refused even for a listed host.
    - `native_*` (`NativeModelInfo`): only on native entries.
    """

    model_config = ConfigDict(extra="allow", strict=True, use_attribute_docstrings=True)
    batch_mode: Literal["realtime", "native", "background"] = "realtime"
    """`realtime`: one call per line through LiteLLM's Router; `native`: the deployment's shards go as the
    provider's own batch jobs, at batch prices (upstream entries only); `background`: one call per line to an
    OpenAI-wire server (vLLM) that also serves live traffic, sent at `background_priority` and paced by the
    server's own load (its Prometheus `/metrics`) within `max_parallel_requests`."""
    background_priority: int = BACKGROUND_PRIORITY
    """`batch_mode: background` only: the request field `priority` every line goes out with (vLLM serves lower
    values first; live traffic sends 0). A line's own `priority` is refused."""
    metrics_url: str | None = None
    """`batch_mode: background` only: the server's Prometheus endpoint (default: `api_base` without `/v1`, plus
    `/metrics`)."""
    allowed_params: list[str] = Field(default_factory=list)
    """Body fields a line may carry for this model beyond the endpoint's documented request fields: a
    provider's extras (`top_k` for Anthropic), or on a `vllm/` route the vLLM fields that override the
    operator's engine settings (`chat_template`, `vllm_xargs`, `mm_processor_kwargs`, ...). LiteLLM's own
    settings (keys, URLs, mocks, fallbacks, prices, callbacks) are refused at load. The fields that change the
    provider's price are allowed here by name (`service_tier`, `inference_geo`, `speed`, `web_search`,
    `web_fetch`, `code_execution`, `file_search`, `mcp`, ...: `gateway.config.priced_fields`), and then priced
    from this `model_info` or LiteLLM's price map (`input_cost_per_token_priority`,
    `search_context_cost_per_query`, ...). With several deployments of one name, a field passes only if every
    deployment lists it."""
    allow_unpriced: bool = False
    """On a wildcard route only: let a line of a team with a `max_budget` run a concrete model that has no
    known price (none in the config, none in LiteLLM's price map, none in this `model_info`). False: such a
    line is refused with `price_unknown` before it is sent, so no budget misses what it costs."""
    allowed_media_domains: list[str] = Field(default_factory=list)
    """Bare host names whose http(s) media URLs (`image_url`, `audio_url`, `video_url`, `file_url`, ...) the
    gateway may fetch for this model: vLLM on a `vllm/` route, LiteLLM's translation upstream, and the
    operator's own server on an internal route (an `api_base` that is not the provider's public host). Empty:
    nothing is fetched. Private, loopback and link-local addresses are refused even for a listed host."""

    @property
    def litellm_keys(self) -> dict[str, Any]:
        """LiteLLM's own keys as written (prices, `base_model`, `id`, ...): everything not batchyard's."""
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _no_stray_native_key(self) -> ModelInfo:
        stray = sorted(k for k in self.model_extra or {} if k.startswith(NATIVE_KEY_PREFIX) or k == "prime_cache")
        if stray:
            native = [k for k in NativeModelInfo.model_fields if k not in ModelInfo.model_fields]
            where = ("known" if isinstance(self, NativeModelInfo)
                     else "they are for native entries (batch_mode: native), whose keys are")
            raise PydanticCustomError("native_key", "{names}: not a setting here; {where}: {known}",
                                      {"names": ", ".join(stray), "where": where, "known": ", ".join(native)})
        return self

    @model_validator(mode="after")
    def _known_keys(self) -> ModelInfo:
        problem = unknown_model_info(self.model_extra or {})
        if problem is not None:
            raise PydanticCustomError("model_info_key", "{problem}", {"problem": problem})
        return self

    @model_validator(mode="after")
    def _background_keys(self) -> ModelInfo:
        given = [k for k in BACKGROUND_KEYS if k in self.model_fields_set]
        if given and self.batch_mode != "background":
            raise PydanticCustomError("background_key", "{names}: settings of batch_mode: background only",
                                      {"names": ", ".join(given)})
        url = self.metrics_url
        if url is not None and not (url.startswith("http://") or url.startswith("https://")):
            raise PydanticCustomError("metrics_url", "metrics_url: write an http(s) URL, not {url}", {"url": repr(url)})
        return self

    @field_validator("allowed_params")
    @classmethod
    def _no_litellm_settings(cls, names: list[str]) -> list[str]:
        from gateway.config.litellm.litellm_names import LITELLM_SETTINGS  # generated from the pinned LiteLLM

        bad = sorted(n for n in names if n in LITELLM_SETTINGS)
        if bad:
            raise PydanticCustomError(
                "litellm_setting_param", "{names}: LiteLLM settings (keys, URLs, routing, mocks, prices, "
                "callbacks) that a batch line may never set", {"names": ", ".join(bad)},
            )
        return names

    @field_validator("allowed_media_domains")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        bad = [h for h in hosts if not h or "/" in h or ":" in h or h != h.strip().lower()]
        if bad:
            raise PydanticCustomError(
                "media_domain", "{hosts}: write bare lower-case host names (no scheme, port or path)",
                {"hosts": ", ".join(map(repr, bad))},
            )
        return hosts


class NativeModelInfo(ModelInfo):
    """A native entry's `model_info`: batchyard's polling and job-size keys beside LiteLLM's (batch prices).

    - `native_max_lines`, `native_max_bytes`: split limits per upstream job (default: the provider's own).
    - `native_poll_initial_seconds` (default 0.5), `native_poll_max_seconds` (default 60): polling backs off
      from the first up to the second.
    - a provider's own keys (Bedrock's `native_s3_bucket`, Vertex AI's `native_gcs_bucket`, ...): each provider's
      jobs declare which are theirs and which are required (`gateway.config.native_declarations`); refused on
      every other provider.
    """

    native_max_lines: PositiveInt | None = None
    """Requests per upstream job at most (default: the provider's own limit)."""
    native_max_bytes: PositiveInt | None = None
    """Bytes per upstream job file at most (default: the provider's own limit)."""
    native_poll_initial_seconds: PositiveFloat = 0.5
    """The first wait between two polls of an upstream job; each later one is longer."""
    native_poll_max_seconds: PositiveFloat = 60.0
    """The longest wait between two polls of an upstream job."""
    native_s3_bucket: str | None = None
    """Bedrock: the S3 bucket job inputs are uploaded to and outputs written to (required on `bedrock/`)."""
    native_s3_prefix: str = "batchyard"
    """Bedrock: the key prefix in `native_s3_bucket` (`<prefix>/input/`, `<prefix>/output/`)."""
    native_role_arn: str | None = None
    """Bedrock: the service role Bedrock assumes to read the inputs and write the outputs (required on `bedrock/`)."""
    native_keep_files: bool = False
    """Bedrock, Vertex AI, the Gemini API: keep a job's input and output objects (in the bucket; Gemini: its
    uploaded input and responses files) when its batch ends (default: deleted)."""
    native_min_records: PositiveInt | None = None
    """Bedrock: records per job at least (default 100, Bedrock's quota); a smaller part runs in real time."""
    native_gcs_bucket: str | None = None
    """Vertex AI: the Cloud Storage bucket job inputs are uploaded to and outputs written to (required on
    `vertex_ai/`)."""
    native_gcs_prefix: str = "batchyard"
    """Vertex AI: the object prefix in `native_gcs_bucket` (`<prefix>/input/`, `<prefix>/output/`)."""
    native_completion_window: Annotated[str, Field(pattern=r"^[1-9][0-9]{0,3}[hd]$")] | None = None
    """OpenAI-format hosts and Groq: the `completion_window` each job asks for (`24h`, `7d`; default `24h`)."""
    native_inline_max_bytes: Annotated[int, Field(ge=0, le=20_000_000)] | None = None
    """The Gemini API: a job whose inline requests would pass this many bytes goes as a JSONL file uploaded through
    the Files API instead (default and at most 20,000,000, Google's bound on an inline batch; 0: always a file)."""
    native_account_id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] | None = None
    """Fireworks AI: the account whose datasets and batch inference jobs these are (required on `fireworks_ai/`)."""
    prime_cache: bool = True
    """Anthropic: one real-time request per `cache_control` prefix a job's lines share writes it before the job."""


class LocalModelInfo(ModelInfo):
    """`model_info` of a `vllm/` entry: the same keys; `batch_mode` stays `realtime`."""

    @field_validator("batch_mode")
    @classmethod
    def _realtime_only(cls, mode: str) -> str:
        if mode != "realtime":
            raise PydanticCustomError(
                "local_batch_mode", "batch_mode: {mode} is for upstream providers; a vllm/ model runs on the "
                "local engine", {"mode": mode},
            )
        return mode


class _Entry(Strict):
    model_name: Annotated[str, Field(min_length=1)]
    """What lines put in `model`. Several entries of one name are one route, load-balanced by LiteLLM's
    Router; a name cannot mix local and upstream entries, nor native and realtime ones."""
    litellm_params: LiteLLMParams
    """As LiteLLM takes them; `model: provider/model` is required."""
    model_info: ModelInfo = Field(default_factory=ModelInfo)
    """LiteLLM's `model_info` (`id`, `base_model`, `input_cost_per_token`, ...) plus batchyard's keys."""

    def deployment(self) -> dict[str, Any]:
        """The entry as LiteLLM's Router takes it in `model_list`: model_name, litellm_params and model_info,
        as written (batchyard's own keys such as engine_args are not LiteLLM's)."""
        return self.model_dump(include={"model_name", "litellm_params", "model_info"}, exclude_unset=True)


class LocalEntry(_Entry):
    """`vllm/<path or hub id>`: one engine per model_name; `engine_args` are vLLM run_batch's options."""

    model_info: LocalModelInfo = Field(default_factory=LocalModelInfo)
    """LiteLLM's `model_info` plus batchyard's keys; `batch_mode` must stay `realtime`."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """`vllm run_batch`'s options by python name (`max_model_len`, `dtype`, `chat_template`,
    `tool_call_parser`, ...), checked at load against vLLM's option list; `allowed_media_domains` belongs
    in `model_info`."""

    @field_validator("engine_args")
    @classmethod
    def _known_to_vllm(cls, args: dict[str, Any]) -> dict[str, Any]:
        if "allowed_media_domains" in args:
            # One home for the rule: the gateway checks it (and refuses private addresses) before vLLM sees a line.
            raise PydanticCustomError(
                "media_domains_in_engine_args", "allowed_media_domains belongs in model_info (batchyard sets "
                "vLLM's option from it)", {},
            )
        unknown = unknown_engine_args(args)
        if unknown:
            raise PydanticCustomError(
                "unknown_engine_args", "{names}: not an option of vLLM's run_batch (AsyncEngineArgs and its "
                "frontend options, by python name)", {"names": ", ".join(map(str, unknown))},
            )
        parser = unknown_parser(args)
        if parser is not None:
            raise PydanticCustomError("unknown_parser", "{problem}", {"problem": parser[1]})
        return args


class UpstreamEntry(_Entry):
    """A provider through LiteLLM's Router, one call per line; several entries of a name are load-balanced."""

    tpm: PositiveInt | None = None
    """Tokens per minute of this deployment, beside `litellm_params` as LiteLLM's load_balancer.yaml writes it
    (also read inside `litellm_params` and `model_info`): the Router's routing and pre-call checks bound it."""
    rpm: PositiveInt | None = None
    """Requests per minute of this deployment, where `tpm` may be written; the Router bounds it."""
    max_parallel_requests: PositiveInt | None = None
    """Requests in flight to this deployment at most; given to the Router in `litellm_params`, where it reads it."""

    def deployment(self) -> dict[str, Any]:
        """As `_Entry.deployment`, with `tpm`/`rpm` beside `litellm_params` (the Router reads them there) and
        `max_parallel_requests` moved into `litellm_params` (the only place the Router reads it)."""
        out = super().deployment()
        for key in ("tpm", "rpm"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.max_parallel_requests is not None:
            params = out["litellm_params"]
            params.setdefault("max_parallel_requests", self.max_parallel_requests)
        return out

    @model_validator(mode="after")
    def _background_server(self) -> UpstreamEntry:
        """`batch_mode: background` needs an OpenAI-wire server of the operator's whose `/metrics` can be read."""
        if self.model_info.batch_mode != "background":
            return self
        provider = self.litellm_params.model.partition("/")[0]
        if provider not in BACKGROUND_PROVIDERS:
            raise PydanticCustomError("background_provider", "batch_mode: background runs on an OpenAI-wire server "
                                      "of yours ({known}), not {provider}/",
                                      {"known": ", ".join(f"{p}/" for p in BACKGROUND_PROVIDERS), "provider": provider})
        if not (self.litellm_params.model_extra or {}).get("api_base") and self.model_info.metrics_url is None:
            raise PydanticCustomError("background_metrics", "batch_mode: background needs api_base (its /metrics is "
                                      "read beside it) or model_info.metrics_url", {})
        return self


class NativeEntry(UpstreamEntry):
    """`model_info.batch_mode: native`: shards go to the provider's own batch API, on a provider that has
    one we run (whose jobs are declared); on any other it is refused here, never quietly run in real time."""

    model_info: NativeModelInfo = Field(default_factory=NativeModelInfo)
    """LiteLLM's `model_info` (batch prices) plus batchyard's keys, the `native_*` ones included."""

    @field_validator("model_info")
    @classmethod
    def _provider_runs_native(cls, info: NativeModelInfo, context: ValidationInfo) -> NativeModelInfo:
        params = context.data.get("litellm_params")
        refusal = native_refusal(params.model) if isinstance(params, LiteLLMParams) else None
        if refusal is not None:
            raise PydanticCustomError("native_provider", "batch_mode: native on {name}: {refusal}",
                                      {"name": repr(context.data.get("model_name")), "refusal": refusal})
        if not isinstance(params, LiteLLMParams):
            return info  # its own error says what is wrong with litellm_params
        provider, _, model = params.model.partition("/")
        refused = entry_refusal(provider, model, info)
        if refused is not None:
            raise refused
        return info


def entry_kind(raw: Any) -> str:
    """Which entry model a raw `model_list` item is (the tag of `ModelEntry`)."""
    if not isinstance(raw, dict):
        return RouteKind.UPSTREAM.value  # its model then says "must be a mapping"
    params = raw.get("litellm_params")
    model = params.get("model") if isinstance(params, dict) else None
    if isinstance(model, str) and model.startswith(LOCAL_PREFIX):
        return RouteKind.LOCAL.value
    info = raw.get("model_info")
    if isinstance(info, dict) and info.get("batch_mode") == "native":
        return RouteKind.NATIVE.value
    return RouteKind.UPSTREAM.value


ModelEntry = Annotated[
    Annotated[LocalEntry, Tag(RouteKind.LOCAL.value)]
    | Annotated[UpstreamEntry, Tag(RouteKind.UPSTREAM.value)]
    | Annotated[NativeEntry, Tag(RouteKind.NATIVE.value)],
    Discriminator(entry_kind),
]
ENTRY_MODELS: dict[str, type[LocalEntry | UpstreamEntry]] = {
    RouteKind.LOCAL.value: LocalEntry, RouteKind.UPSTREAM.value: UpstreamEntry, RouteKind.NATIVE.value: NativeEntry,
}
Entry = LocalEntry | UpstreamEntry  # NativeEntry is an UpstreamEntry
ENTRY_TAGS = frozenset(ENTRY_MODELS)  # they appear in pydantic's error locations; they are no config keys


def kind_of(entry: Entry) -> RouteKind:
    if isinstance(entry, LocalEntry):
        return RouteKind.LOCAL
    return RouteKind.NATIVE if isinstance(entry, NativeEntry) else RouteKind.UPSTREAM


__all__ = [
    "BACKGROUND_KEYS", "BACKGROUND_PRIORITY", "BACKGROUND_PROVIDERS",
    "ENTRY_MODELS", "ENTRY_TAGS", "LOCAL_PREFIX", "NATIVE_KEY_PREFIX", "Entry", "LiteLLMParams", "LocalEntry",
    "ModelEntry", "ModelInfo", "NativeEntry", "NativeModelInfo", "Strict", "UpstreamEntry", "entry_kind", "kind_of",
]
