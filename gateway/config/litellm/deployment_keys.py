"""The keys a `model_list` entry's `litellm_params` and `model_info` may hold, and its provider's name.

LiteLLM passes an unknown `litellm_params` key on to the provider (`api_bse` would go upstream in the body,
and the request to the default base with the deployment's key), so a key that is none of LiteLLM's
(gateway.config.litellm.deployment_names, generated from the pinned LiteLLM) is refused at load, naming the
key and the closest known name. What LiteLLM sends on as written on purpose is `extra_body`: it is kept, and
named in the notice (`extra_body_notices`).

`BATCHYARD_MODEL_INFO` is the one list of batchyard's own `model_info` keys: a new one is added there (and
as a field of `gateway.config.entries.ModelInfo` or its subclasses, which a test holds to this list).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from typing import Any

from gateway.config.litellm.deployment_names import LITELLM_PARAMS, MODEL_INFO, PROVIDERS
from gateway.config.priced_fields import is_tier_price_key
from gateway.errors import ConfigError

# batchyard's own model_info keys -> what each is for (LiteLLM has none of these names).
BATCHYARD_MODEL_INFO: dict[str, str] = {
    "batch_mode": "realtime, native (the provider's batch jobs) or background",
    "allowed_params": "body fields a line may carry beyond the endpoint's documented ones",
    "allowed_media_domains": "hosts whose media URLs the gateway may fetch for a line",
    "allow_unpriced": "run the route although no price is known for it",
    "background_priority": "the priority of a background route's requests",
    "metrics_url": "where a route's engine publishes its metrics",
    "native_max_lines": "requests per upstream job at most",
    "native_max_bytes": "bytes per upstream job file at most",
    "native_completion_window": "the completion window each upstream job asks for (`24h` default, `7d`)",
    "native_poll_initial_seconds": "the first wait between two polls of an upstream job",
    "native_poll_max_seconds": "the longest wait between two polls of an upstream job",
    "native_s3_bucket": "Bedrock: the S3 bucket of its batch jobs",
    "native_s3_prefix": "Bedrock: the key prefix in that bucket",
    "native_role_arn": "Bedrock: the service role its batch jobs assume",
    "native_keep_files": "keep a native job's input and output objects",
    "native_min_records": "Bedrock: records per job at least",
    "native_gcs_bucket": "Vertex AI: the Cloud Storage bucket of its batch jobs",
    "native_gcs_prefix": "Vertex AI: the object prefix in that bucket",
    "native_inline_max_bytes": "the Gemini API: the inline bound of a job",
    "native_account_id": "Fireworks AI: the account of its datasets and batch inference jobs",
    "prime_cache": "Anthropic: write the prompt cache a job's lines share before the job",
}
EXTRA_BODY = "extra_body"



def _closest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_params(params: Iterable[str]) -> str | None:
    """The problem of the first `litellm_params` key LiteLLM does not know; None when there is none."""
    for key in params:
        if key not in LITELLM_PARAMS:
            return (f"{key}: not a LiteLLM completion argument or provider setting (LiteLLM would send it to the "
                    f"provider){_closest(key, LITELLM_PARAMS)}")
    return None


def unknown_model_info(keys: Iterable[str]) -> str | None:
    """The problem of the first `model_info` key neither LiteLLM nor batchyard knows; None when there is none."""
    known = MODEL_INFO | BATCHYARD_MODEL_INFO.keys()
    for key in keys:
        if key not in known and not is_tier_price_key(key):
            return f"{key}: not a model_info field of LiteLLM or batchyard{_closest(key, known)}"
    return None


def provider_refusal(model: str, params: dict[str, Any]) -> str | None:
    """Why LiteLLM cannot place `model`'s provider (`mistralai/...`); None when it can.

    A known `provider/` prefix or a `custom_llm_provider` places it at once. Any other name is asked of
    LiteLLM's own `get_llm_provider` (an `api_base` of a known host, a model name it lists), which imports
    LiteLLM: only such a name pays for it."""
    prefix = model.partition("/")[0]
    custom = params.get("custom_llm_provider")
    if prefix in PROVIDERS or (isinstance(custom, str) and custom in PROVIDERS):
        return None
    import litellm

    litellm.suppress_debug_info = True  # get_llm_provider prints a banner on an unknown name otherwise
    try:
        litellm.get_llm_provider(model=model, custom_llm_provider=custom if isinstance(custom, str) else None,
                                 api_base=params.get("api_base") if isinstance(params.get("api_base"), str) else None)
    except Exception:  # LiteLLM raises its BadRequestError, or a ValueError, for a name it cannot place
        close = difflib.get_close_matches(prefix, sorted(PROVIDERS), n=1)
        hint = f"; did you mean `{close[0]}/`?" if close else "; write provider/model with a provider LiteLLM has"
        return f"LiteLLM has no provider `{prefix}`{hint}"
    return None


# LiteLLM's `VALID_LITELLM_ENVIRONMENTS` (litellm.types.router; a test compares).
ENVIRONMENTS = ("development", "staging", "production")


def environment_entries(model_list: Any, path: str) -> tuple[Any, list[tuple[str, str]]]:
    """The entries LiteLLM's Router loads under `LITELLM_ENVIRONMENT` (its `model_info_is_active_for_environment`
    rule), and (dotted key, why) for each it skips. What its Router refuses to build with (no
    `LITELLM_ENVIRONMENT`, a name outside its list) is refused here, at load, naming the entry."""
    if not isinstance(model_list, list):
        return model_list, []
    kept: list[Any] = []
    skipped: list[tuple[str, str]] = []
    current = os.environ.get("LITELLM_ENVIRONMENT")
    for index, entry in enumerate(model_list):
        info = entry.get("model_info") if isinstance(entry, dict) else None
        wanted = info.get("supported_environments") if isinstance(info, dict) else None
        if wanted is None:
            kept.append(entry)
            continue
        key = f"model_list[{index}].model_info.supported_environments"
        if not isinstance(wanted, list) or any(name not in ENVIRONMENTS for name in wanted):
            raise ConfigError(path, key, f"must be a list of {', '.join(ENVIRONMENTS)}")
        if current is None:
            raise ConfigError(path, key, "set, but LITELLM_ENVIRONMENT is not: LiteLLM's Router refuses to load "
                              "the deployment without it")
        if current not in ENVIRONMENTS:
            raise ConfigError(path, key, f"LITELLM_ENVIRONMENT is {current!r}; LiteLLM takes {', '.join(ENVIRONMENTS)}")
        if current in wanted:
            kept.append(entry)
        else:
            skipped.append((f"model_list[{index}]", f"not loaded: its supported_environments leave out "
                            f"LITELLM_ENVIRONMENT={current}, as LiteLLM's Router leaves it out"))
    return kept, skipped


def extra_body_notices(model_list: Any) -> list[tuple[str, str]]:
    """(dotted key, why) for each entry whose `litellm_params.extra_body` LiteLLM sends on as written."""
    found: list[tuple[str, str]] = []
    for index, entry in enumerate(model_list if isinstance(model_list, list) else []):
        params = entry.get("litellm_params") if isinstance(entry, dict) else None
        if isinstance(params, dict) and EXTRA_BODY in params:
            found.append((f"model_list[{index}].litellm_params.{EXTRA_BODY}",
                          "sent to the provider in every request's body as written, as LiteLLM sends it (its "
                          "extra_body rule); batchyard does not check the keys inside"))
    return found


__all__ = ["BATCHYARD_MODEL_INFO", "ENVIRONMENTS", "EXTRA_BODY", "environment_entries", "extra_body_notices",
           "provider_refusal", "unknown_model_info", "unknown_params"]
